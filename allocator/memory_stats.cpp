// torch.cuda.memory_stats() flattening (§8): "<stat>.<pool>.<field>" for the array
// statistics, "<stat>.<field>" for the oversize ones, plain names for the counters.
#include "allocator/memory_stats.h"

namespace memsim {

namespace {

void put_stat(std::map<std::string, int64_t>& out, const std::string& prefix, const Stat& s) {
  out[prefix + ".allocated"] = s.allocated;
  out[prefix + ".current"] = s.current;
  out[prefix + ".freed"] = s.freed;
  out[prefix + ".peak"] = s.peak;
}

void put_array(std::map<std::string, int64_t>& out, const std::string& name, const StatArray& a) {
  put_stat(out, name + ".all", a.all);
  put_stat(out, name + ".large_pool", a.large_pool);
  put_stat(out, name + ".small_pool", a.small_pool);
}

}  // namespace

std::map<std::string, int64_t> MemoryStats::to_flat_map() const {
  std::map<std::string, int64_t> out;
  // The real key is "allocation", not the docstring's "allocated" (§8).
  put_array(out, "active", active);
  put_array(out, "active_bytes", active_bytes);
  put_array(out, "allocated_bytes", allocated_bytes);
  put_array(out, "allocation", allocation);
  put_array(out, "inactive_split", inactive_split);
  put_array(out, "inactive_split_bytes", inactive_split_bytes);
  put_array(out, "requested_bytes", requested_bytes);
  put_array(out, "reserved_bytes", reserved_bytes);
  put_array(out, "segment", segment);
  put_stat(out, "oversize_allocations", oversize_allocations);
  put_stat(out, "oversize_segments", oversize_segments);
  out["max_split_size"] = max_split_size;
  out["num_alloc_retries"] = num_alloc_retries;
  out["num_device_alloc"] = num_device_alloc;
  out["num_device_free"] = num_device_free;
  out["num_ooms"] = num_ooms;
  out["num_sync_all_streams"] = num_sync_all_streams;
  return out;
}

}  // namespace memsim
