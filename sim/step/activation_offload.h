// checkpoint.offload turned into the graph::OffloadEngine a training loop installs
// (issue #18 item 4; the model: graph/offload.h, docs/offload.md).
//
// Contract: make_offload_engine returns nullptr when the scenario offloads nothing (the
// run is then byte-identical to one without the key). Otherwise it installs an engine on
// rt for the layers checkpoint.offload names, after refusing by key what is not modelled:
// a layer that the checkpoint plan also checkpoints (inside a checkpointed region the
// checkpoint's own saved-tensor hooks are innermost and take every save, so the offload
// would be moot or, nested the other way, would pack what the region expects to
// recompute), and numeric mode (its value checks follow device storages).
#pragma once

#include <memory>

#include "graph/checkpoint.h"
#include "graph/offload.h"
#include "scenario/scenario.h"

namespace memsim {

std::unique_ptr<graph::OffloadEngine> make_offload_engine(graph::Runtime& rt,
                                                          const Scenario& scenario,
                                                          const graph::CheckpointEngine* checkpoint);

}  // namespace memsim
