"""Stand-ins of the few transformers and peft APIs tools/gpu/measure_hft.py calls, for its
--self-test on a machine without them (the development machine: torch 1.13, no
transformers, no peft). They check the script's own code paths (config reading, model
construction arguments, checkpointing set-up and what the script reads back from it,
PEFT wrapping, the optimizer's groups, the step, the result it writes) on CPU, not the
libraries: each stand-in does what the real call is documented to do (transformers 5.x
PreTrainedModel.gradient_checkpointing_enable / enable_input_require_grads /
GradientCheckpointingLayer; peft get_peft_model, PeftModel.get_base_model and its
_prepare_model_for_gradient_checkpointing hook), nothing more.

install() puts modules named `transformers` and `peft` into sys.modules."""
import dataclasses
import functools
import sys
import types

import torch
from torch import nn


class _Config:
    def __init__(self, d):
        self.__dict__.update(d)
        self._attn_implementation = None

    @classmethod
    def from_dict(cls, d):
        return cls(dict(d))


class _Layer(nn.Module):
    """A GradientCheckpointingLayer: __call__ goes through _gradient_checkpointing_func
    when checkpointing is on and the module trains."""
    gradient_checkpointing = False

    def __init__(self, d):
        super().__init__()
        self.q_proj, self.v_proj, self.o_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def _forward(self, h):
        return h + self.o_proj(torch.tanh(self.q_proj(self.norm(h))) * self.v_proj(h))

    def forward(self, h):
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(self._forward, h)
        return self._forward(h)


class _Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(_Layer(c.hidden_size) for _ in range(c.num_hidden_layers))
        self.norm = nn.LayerNorm(c.hidden_size)


class _CausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = _Inner(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    @property
    def is_gradient_checkpointing(self):
        return any(getattr(m, "gradient_checkpointing", False) for m in self.modules())

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        kw = gradient_checkpointing_kwargs or {"use_reentrant": False}  # 5.x's default
        import torch.utils.checkpoint as tuc
        func = functools.partial(tuc.checkpoint, **kw)
        for m in self.modules():
            if isinstance(m, _Layer):
                m.gradient_checkpointing = True
                m._gradient_checkpointing_func = func

    def enable_input_require_grads(self):
        def make_inputs_require_grads(module, input, output):
            output.requires_grad_(True)
        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(
            make_inputs_require_grads)

    def forward(self, input_ids=None, labels=None, use_cache=None):
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h)
        logits = self.lm_head(self.model.norm(h))
        loss = nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                           labels.view(-1))
        return types.SimpleNamespace(loss=loss, logits=logits)


class _Auto:
    @staticmethod
    def from_config(config, attn_implementation=None, dtype=None, torch_dtype=None):
        config._attn_implementation = attn_implementation
        m = _CausalLM(config)
        return m.to(dtype or torch_dtype or torch.float32)


@dataclasses.dataclass
class _TrainingArguments:
    output_dir: str = None
    optim: str = "adamw_torch_fused"


class _LoraConfig:
    def __init__(self, task_type=None, bias="none", r=8, lora_alpha=8, target_modules=(),
                 lora_dropout=0.0):
        self.r, self.lora_alpha, self.target_modules = r, lora_alpha, list(target_modules)


class _LoraLinear(nn.Module):
    def __init__(self, base, r):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base.in_features, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, base.out_features, bias=False)})

    def forward(self, x):
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))


class _PeftModel(nn.Module):
    def __init__(self, model, cfg):
        super().__init__()
        for p in model.parameters():
            p.requires_grad_(False)
        for layer in model.model.layers:
            for name in cfg.target_modules:
                setattr(layer, name, _LoraLinear(getattr(layer, name), cfg.r))
        self.base_model = types.SimpleNamespace(model=model)
        self.add_module("wrapped", model)
        if getattr(model, "is_gradient_checkpointing", True):  # peft's condition
            model.enable_input_require_grads()

    def get_base_model(self):
        return self.base_model.model

    def get_input_embeddings(self):
        return self.get_base_model().get_input_embeddings()

    def forward(self, **kw):
        return self.get_base_model()(**kw)


def install():
    tf = types.ModuleType("transformers")
    tf.__version__ = "5.17.0 (stand-in)"
    tf.AutoModelForCausalLM = _Auto
    tf.TrainingArguments = _TrainingArguments
    models = types.ModuleType("transformers.models")
    auto = types.ModuleType("transformers.models.auto")
    ca = types.ModuleType("transformers.models.auto.configuration_auto")
    ca.CONFIG_MAPPING = {"qwen2": _Config}
    tf.models, models.auto, auto.configuration_auto = models, auto, ca
    pf = types.ModuleType("peft")
    pf.__version__ = "0.18 (stand-in)"
    pf.LoraConfig = _LoraConfig
    pf.get_peft_model = lambda model, cfg: _PeftModel(model, cfg)
    sys.modules.update({"transformers": tf, "transformers.models": models,
                        "transformers.models.auto": auto,
                        "transformers.models.auto.configuration_auto": ca, "peft": pf})
