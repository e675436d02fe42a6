// Which torchao float8 training recipe a Float8Linear follows (HfShape::float8, set from
// precision.float8 by scenario/torchtitan_keys.cpp). tensorwise: graph/ops/ops_float8.h;
// rowwise and rowwise_with_gw_hp: graph/ops/ops_float8_rowwise.h.
#pragma once

#include <cstdint>

namespace memsim::graph {

enum class Float8Kind : uint8_t { none, tensorwise, rowwise, rowwise_with_gw_hp };

}  // namespace memsim::graph
