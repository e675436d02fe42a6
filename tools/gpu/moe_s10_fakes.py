"""Stand-ins of the few transformers and peft APIs tools/gpu/measure_moe_s10.py calls, for its
--self-test on a machine without them (the development machine: torch 1.13, no transformers,
no peft). They check the script's own code paths on the CPU (config reading, the from_config
call, the default experts implementation it records, PEFT wrapping and what it records of it,
HF gradient checkpointing's set-up and the keywords it reads back, the forced routing through
the module-level torch.topk, the optimizer over the trainable parameters, the step and the
result it writes), not the libraries: each stand-in does what the real call is documented to
do, nothing more:

  * transformers 5.x `AutoModelForCausalLM.from_config(config, dtype=, attn_implementation=,
    experts_implementation=)` -> a model whose `forward(input_ids=, labels=, use_cache=)`
    returns an object with `.logits` and `.loss`; its MoE router calls `torch.topk(probs, K)`
    on (T, E) as transformers' routers do (here tools/fixtures/moe_models' stand-in at the dry
    size, its own forcing off); `get_correct_experts_implementation(None)` ("grouped_mm",
    eager when it cannot dispatch: huggingface/transformers 040ba146 modeling_utils.py);
    `gradient_checkpointing_enable(gradient_checkpointing_kwargs=)` (5.17, as the
    2026-11-27 run recorded its source: default use_reentrant False, every decoder layer's
    `_gradient_checkpointing_func` a functools.partial of torch.utils.checkpoint.checkpoint,
    the embeddings' input-require-grads hook);
  * peft `LoraConfig` (with `target_parameters`), `get_peft_model` (base frozen, fp32
    adapters on the Linear modules whose name ends with a target, and per targeted 3-D
    parameter an (A, B) pair), `peft.tuners.lora.layer.ParamWrapper` (its methods' source is
    recorded).

install() puts modules named `transformers` (with `transformers.models.auto.configuration_auto`)
and `peft` (with `peft.tuners.lora.layer`) into sys.modules."""
import dataclasses
import functools
import importlib.machinery
import sys
import types

import torch
from torch import nn


class _Config:
    def __init__(self, d):
        self.__dict__.update(d)
        self._attn_implementation = None
        self._experts_implementation = None

    @classmethod
    def from_dict(cls, d):
        return cls(dict(d))


class _ConfigMapping(dict):
    def __missing__(self, key):
        return _Config


class _Out:
    def __init__(self, logits, loss):
        self.logits, self.loss = logits, loss


class _CausalLM(nn.Module):
    supports_gradient_checkpointing = True
    main_input_name = "input_ids"

    def __init__(self, config, dtype, attn, experts):
        super().__init__()
        import measure_moe as mm
        import moe_models
        import torch_models
        sp = dict(model_type="qwen3_moe", cfg=dict(mm.SHAPE), experts=mm.E, top_k=mm.K,
                  expert_d_ff=mm.FE, routing="balanced")
        cfg = mm.standin_cfg(sp, True)
        cfg["moe"]["counts"] = None  # no forcing of its own: the script's torch.topk hook forces
        self.config = config
        config._attn_implementation = attn
        config._experts_implementation = experts
        self.inner = moe_models.MoeForCausalLM(cfg)
        if dtype is not None:
            self.inner.to(dtype)
        self._loss = torch_models.decoder_loss(cfg)

    def get_correct_experts_implementation(self, requested):
        return "eager" if requested is None else requested  # no torch._grouped_mm in 1.13

    def get_input_embeddings(self):
        return self.inner.embed_tokens

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        if gradient_checkpointing_kwargs is None:
            gradient_checkpointing_kwargs = {"use_reentrant": False}
        func = functools.partial(torch.utils.checkpoint.checkpoint, **gradient_checkpointing_kwargs)
        for layer in self.inner.layers:
            layer.gradient_checkpointing = True
            layer._gradient_checkpointing_func = func
            orig = layer.forward

            def forward(*args, _orig=orig, _func=func, **kwargs):
                return _func(functools.partial(_orig, **kwargs), *args)
            layer.forward = forward
        self.enable_input_require_grads()

    def enable_input_require_grads(self):
        def make_inputs_require_grads(module, input, output):
            output.requires_grad_(True)
        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(make_inputs_require_grads)

    def forward(self, input_ids=None, labels=None, use_cache=None):
        logits = self.inner(input_ids)
        return _Out(logits, self._loss(logits, labels))


class _Auto:
    @staticmethod
    def from_config(config, dtype=None, attn_implementation=None, experts_implementation=None):
        return _CausalLM(config, dtype, attn_implementation, experts_implementation)


@dataclasses.dataclass
class _LoraConfig:
    r: int = 8
    lora_alpha: int = 8
    lora_dropout: float = 0.0
    bias: str = "none"
    task_type: str = None
    target_modules: list = None
    target_parameters: list = None


class _LoraLinear(nn.Module):
    def __init__(self, base, r, alpha):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False).float()
        self.lora_B = nn.Linear(r, base.out_features, bias=False).float()
        self.scaling = alpha / r

    def forward(self, x):
        out = self.base_layer(x)
        return out + self.lora_B(self.lora_A(x.float())).to(out.dtype) * self.scaling


class ParamWrapper(nn.Module):
    """Only its methods' source is read by the script; the adapters sit on the experts module."""

    def forward(self, x, *args, **kwargs):
        return x

    def get_delta_weight(self, adapter_name):
        return None


class _PeftModel(nn.Module):
    def __init__(self, model, cfg):
        super().__init__()
        self.base_model = model
        for p in model.parameters():
            p.requires_grad_(False)
        for name, mod in list(model.named_modules()):
            for child_name, child in list(mod.named_children()):
                full = (name + "." if name else "") + child_name
                if isinstance(child, nn.Linear) and any(full.endswith(t) for t in (cfg.target_modules or [])):
                    setattr(mod, child_name, _LoraLinear(child, cfg.r, cfg.lora_alpha))
        for name, p in list(model.named_parameters()):
            if p.dim() == 3 and any(name.endswith(t.split(".")[-1]) for t in (cfg.target_parameters or [])):
                owner = model.get_submodule(name.rsplit(".", 1)[0])
                E, out, inp = p.shape
                a = nn.Parameter(torch.zeros(cfg.r * E, inp, dtype=torch.float32))
                b = nn.Parameter(torch.zeros(out, cfg.r * E, dtype=torch.float32))
                owner.register_parameter("lora_A_" + name.rsplit(".", 1)[1], a)
                owner.register_parameter("lora_B_" + name.rsplit(".", 1)[1], b)

                def hook(module, inputs, output, _a=a, _b=b):  # the adapters reach the loss
                    return output + (_b.sum() * _a.sum()).to(output.dtype) * 0
                owner.register_forward_hook(hook)

    def get_base_model(self):
        return self.base_model

    def forward(self, **kw):
        return self.base_model(**kw)


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def install():
    _module("transformers", __version__="5.17.0 (moe_s10_fakes)", AutoModelForCausalLM=_Auto)
    _module("transformers.models")
    _module("transformers.models.auto")
    _module("transformers.models.auto.configuration_auto", CONFIG_MAPPING=_ConfigMapping())
    layer = _module("peft.tuners.lora.layer", ParamWrapper=ParamWrapper)
    _module("peft.tuners.lora", layer=layer, ParamWrapper=ParamWrapper)
    _module("peft.tuners")
    _module("peft", __version__="0.21.0 (moe_s10_fakes)", LoraConfig=_LoraConfig,
            get_peft_model=lambda model, cfg: _PeftModel(model, cfg))
