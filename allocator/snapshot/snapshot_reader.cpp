// Snapshot from a parsed pickle (§9): field-by-field with type checks that name the key
// path, tolerant of keys that only some PyTorch versions write, strict about the
// invariants every real snapshot satisfies (blocks tile their segment, the segment's
// size sums match its blocks), so that a replay never starts from an impossible state.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "allocator/snapshot/large_buffer.h"
#include "allocator/snapshot/pickle.h"
#include "allocator/snapshot/snapshot.h"

namespace memsim {
namespace {

// The dict keys of segments, blocks and trace entries. A record's fields are gathered in
// one pass over its entries (Fields), instead of one search of the dict per key: the
// pickler memoizes each key string once and refers to it with BINGET afterwards, so the
// key of every later record is the same node, and Reader::key_of() compares its text once
// per node, not once per record (a third of reading a 27,000-entry trace).
enum class Key : uint8_t {
  device, address, total_size, allocated_size, active_size, requested_size, stream,
  segment_type, is_expandable, segment_pool_id, frames, blocks, size, state, action, addr,
  device_free, time_us, count, other = 0xFE, unseen = 0xFF
};
constexpr const char* kKeyNames[] = {
    "device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
    "segment_type", "is_expandable", "segment_pool_id", "frames", "blocks", "size", "state", "action",
    "addr", "device_free", "time_us"};
static_assert(sizeof kKeyNames / sizeof kKeyNames[0] == static_cast<size_t>(Key::count));
const char* key_name(Key k) { return kKeyNames[static_cast<size_t>(k)]; }

// One record's values by key; a key that appears twice (hostile input only) keeps its
// last value, as PickleValue::find and Python do.
struct Fields {
  static constexpr uint32_t kAbsent = UINT32_MAX;
  uint32_t node[static_cast<size_t>(Key::count)];
  bool has(Key k) const { return node[static_cast<size_t>(k)] != kAbsent; }
};

// Error paths are built only when an error is thrown: the reader passes lambdas that
// produce "segments[3].blocks[2]" on demand, so the hot path never formats strings.
class Reader {
 public:
  Reader(const PickleDoc& doc, const std::string& name)
      : doc_(doc), name_(name), visited_(doc.node_count(), false),
        key_cache_(doc.node_count(), static_cast<uint8_t>(Key::unseen)) {}

  Snapshot read();

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw SnapshotError(name_ + ": " + (path.empty() ? "" : path + ": ") + what);
  }
  template <class PathFn>
  [[noreturn]] void wrong_type(const PathFn& path, const char* want, PickleValue v) const {
    fail(path(), std::string("expected ") + want + ", got " + pickle_kind_name(v.kind()));
  }

  // Marks a record as consumed. Python's pickler shares only identical objects, and
  // PyTorch builds a fresh dict/list for every segment, block and trace entry; refusing
  // shared records keeps the work linear in the input even for a hostile file whose
  // segments list repeats one memoized segment a million times.
  // A list whose items were dropped (it is also some record's 'frames', see
  // read_owned_bytes) is shared the same way.
  template <class PathFn>
  void claim(PickleValue v, const PathFn& path) {
    if (visited_[v.id()] || v.items_dropped()) {
      fail(path(), "the same object appears twice (shared memo reference)");
    }
    visited_[v.id()] = true;
  }

  template <class PathFn>
  PickleValue expect(PickleValue v, PickleKind kind, const PathFn& path) const {
    if (v.kind() != kind) wrong_type(path, pickle_kind_name(kind), v);
    return v;
  }
  template <class PathFn>
  PickleValue require(PickleValue dict, const char* key, const PathFn& path) const {
    PickleValue v(nullptr, 0);
    if (!dict.find(key, &v)) fail(path(), std::string("missing key '") + key + "'");
    return v;
  }
  template <class PathFn>
  PickleValue require(const Fields& f, Key key, const PathFn& path) const {
    if (!f.has(key)) fail(path(), std::string("missing key '") + key_name(key) + "'");
    return get(f, key);
  }
  PickleValue get(const Fields& f, Key key) const {
    return PickleValue(&doc_, f.node[static_cast<size_t>(key)]);
  }

  // Which of the known keys a dict key node is (Key::other for any other, non-str
  // included), looked up once per node.
  Key key_of(PickleValue k) {
    uint8_t& cached = key_cache_[k.id()];
    if (cached == static_cast<uint8_t>(Key::unseen)) {
      cached = static_cast<uint8_t>(Key::other);
      if (k.kind() == PickleKind::str) {
        const std::string_view text = k.as_string();
        for (size_t i = 0; i < static_cast<size_t>(Key::count); ++i) {
          if (text == kKeyNames[i]) { cached = static_cast<uint8_t>(i); break; }
        }
      }
    }
    return static_cast<Key>(cached);
  }
  // Gathers the known keys of `dict` (a dict) in one pass.
  void gather(PickleValue dict, Fields& f) {
    std::fill(std::begin(f.node), std::end(f.node), Fields::kAbsent);
    const size_t n = dict.size();
    for (size_t i = 0; i < n; ++i) {
      const Key k = key_of(dict.key(i));
      if (k != Key::other) f.node[static_cast<size_t>(k)] = dict.value(i).id();
    }
  }
  template <class PathFn>
  uint64_t to_u64(PickleValue v, const PathFn& path) const {
    if (v.kind() == PickleKind::uint64) return v.as_uint64();
    if (v.kind() != PickleKind::int64) wrong_type(path, "int", v);
    if (v.as_int64() < 0) fail(path(), "expected a non-negative int, got " + std::to_string(v.as_int64()));
    return static_cast<uint64_t>(v.as_int64());
  }
  template <class PathFn>
  int64_t to_i64(PickleValue v, const PathFn& path) const {
    if (v.kind() != PickleKind::int64) wrong_type(path, "int in the 64-bit signed range", v);
    return v.as_int64();
  }
  template <class PathFn>
  bool to_bool(PickleValue v, const PathFn& path) const {
    return expect(v, PickleKind::boolean, path).as_bool();
  }
  template <class PathFn>
  std::string_view to_str(PickleValue v, const PathFn& path) const {
    return expect(v, PickleKind::str, path).as_string();
  }

  void read_segments(PickleValue list, Snapshot& out);
  void read_blocks(PickleValue list, size_t seg, SegmentInfo& info);
  void check_segment(const SegmentInfo& info, size_t seg) const;
  void check_no_overlap(const Snapshot& out) const;
  void read_traces(PickleValue list, Snapshot& out);
  void read_settings(PickleValue dict, Snapshot& out);

  const PickleDoc& doc_;
  const std::string& name_;
  std::vector<bool> visited_;
  std::vector<uint8_t> key_cache_;  // per node: a Key, or Key::unseen
};

std::string at(const char* base, size_t i) { return std::string(base) + "[" + std::to_string(i) + "]"; }

bool parse_action(std::string_view s, TraceAction* out) {
  // Local table rather than to_string(TraceAction): these are the pickle's spellings.
  static const std::pair<const char*, TraceAction> kActions[] = {
      {"alloc", TraceAction::alloc},
      {"free_requested", TraceAction::free_requested},
      {"free_completed", TraceAction::free_completed},
      {"segment_alloc", TraceAction::segment_alloc},
      {"segment_free", TraceAction::segment_free},
      {"segment_map", TraceAction::segment_map},
      {"segment_unmap", TraceAction::segment_unmap},
      {"oom", TraceAction::oom},
      {"snapshot", TraceAction::snapshot},
  };
  for (const auto& [name, action] : kActions) {
    if (s == name) { *out = action; return true; }
  }
  return false;
}

bool parse_state(std::string_view s, BlockState* out) {
  if (s == "active_allocated") *out = BlockState::active_allocated;
  else if (s == "active_pending_free") *out = BlockState::active_pending_free;
  else if (s == "inactive") *out = BlockState::inactive;
  else return false;
  return true;
}

Snapshot Reader::read() {
  Snapshot out;
  const PickleValue root = doc_.root();
  if (root.kind() == PickleKind::list) {  // torch.cuda.memory_snapshot(): segments only
    read_segments(root, out);
    check_no_overlap(out);
    return out;
  }
  if (root.kind() != PickleKind::dict) {
    fail("", std::string("expected a dict (or a list of segments) at the top, got ") +
                 pickle_kind_name(root.kind()));
  }
  read_segments(require(root, "segments", [] { return std::string(); }), out);
  check_no_overlap(out);
  PickleValue v(nullptr, 0);
  if (root.find("device_traces", &v)) read_traces(v, out);
  if (root.find("allocator_settings", &v)) read_settings(v, out);
  if (root.find("external_annotations", &v) && v.kind() != PickleKind::list) {
    wrong_type([] { return std::string("external_annotations"); }, "list", v);
  }
  return out;
}

void Reader::read_segments(PickleValue list, Snapshot& out) {
  const auto list_path = [] { return std::string("segments"); };
  expect(list, PickleKind::list, list_path);
  claim(list, list_path);
  out.segments.resize(list.size());
  for (size_t s = 0; s < list.size(); ++s) {
    const auto seg_path = [s] { return at("segments", s); };
    const PickleValue d = expect(list.item(s), PickleKind::dict, seg_path);
    claim(d, seg_path);
    SnapshotSegment& seg = out.segments[s];
    SegmentInfo& info = seg.info;
    const auto field = [&](const char* key) {
      return [s, key] { return at("segments", s) + "." + key; };
    };
    Fields f;
    gather(d, f);
    const PickleValue device = require(f, Key::device, seg_path);
    const int64_t dev = to_i64(device, field("device"));
    if (dev < 0 || dev > 65535) fail(field("device")(), "device index out of range: " + std::to_string(dev));
    seg.device = static_cast<int>(dev);
    info.address = to_u64(require(f, Key::address, seg_path), field("address"));
    info.total_size = to_u64(require(f, Key::total_size, seg_path), field("total_size"));
    info.allocated_size = to_u64(require(f, Key::allocated_size, seg_path), field("allocated_size"));
    info.active_size = to_u64(require(f, Key::active_size, seg_path), field("active_size"));
    info.requested_size = to_u64(require(f, Key::requested_size, seg_path), field("requested_size"));
    info.stream = to_u64(require(f, Key::stream, seg_path), field("stream"));
    const std::string_view type = to_str(require(f, Key::segment_type, seg_path), field("segment_type"));
    if (type == "small") info.is_small = true;
    else if (type == "large") info.is_small = false;
    else fail(field("segment_type")(), "expected 'small' or 'large', got '" + std::string(type) + "'");
    if (f.has(Key::is_expandable)) info.is_expandable = to_bool(get(f, Key::is_expandable), field("is_expandable"));
    if (f.has(Key::segment_pool_id)) expect(get(f, Key::segment_pool_id), PickleKind::tuple, field("segment_pool_id"));
    if (f.has(Key::frames)) expect(get(f, Key::frames), PickleKind::list, field("frames"));
    read_blocks(require(f, Key::blocks, seg_path), s, info);
    check_segment(info, s);
  }
}

void Reader::read_blocks(PickleValue list, size_t s, SegmentInfo& info) {
  const auto list_path = [s] { return at("segments", s) + ".blocks"; };
  expect(list, PickleKind::list, list_path);
  claim(list, list_path);
  info.blocks.resize(list.size());
  for (size_t b = 0; b < list.size(); ++b) {
    const auto block_path = [s, b] { return at("segments", s) + at(".blocks", b); };
    const PickleValue d = expect(list.item(b), PickleKind::dict, block_path);
    claim(d, block_path);
    const auto field = [&](const char* key) {
      return [s, b, key] { return at("segments", s) + at(".blocks", b) + "." + key; };
    };
    BlockInfo& block = info.blocks[b];
    Fields f;
    gather(d, f);
    block.address = to_u64(require(f, Key::address, block_path), field("address"));
    block.size = to_u64(require(f, Key::size, block_path), field("size"));
    block.requested_size = to_u64(require(f, Key::requested_size, block_path), field("requested_size"));
    const std::string_view state = to_str(require(f, Key::state, block_path), field("state"));
    if (!parse_state(state, &block.state)) {
      fail(field("state")(), "unknown block state '" + std::string(state) + "'");
    }
    if (f.has(Key::frames)) expect(get(f, Key::frames), PickleKind::list, field("frames"));
  }
}

// The invariants PyTorch's snapshot walk guarantees (§9.2), checked in one pass.
void Reader::check_segment(const SegmentInfo& info, size_t s) const {
  const auto path = [s] { return at("segments", s); };
  if (info.blocks.empty()) fail(path(), "segment has no blocks");
  uint64_t next = info.address, allocated = 0, active = 0, requested = 0;
  for (size_t b = 0; b < info.blocks.size(); ++b) {
    const BlockInfo& block = info.blocks[b];
    if (block.address != next) {
      fail(path() + at(".blocks", b) + ".address",
           "blocks do not tile the segment: expected address " + std::to_string(next) + ", got " +
               std::to_string(block.address));
    }
    if (block.size > UINT64_MAX - next) fail(path() + at(".blocks", b) + ".size", "block ends past 2^64");
    next += block.size;
    if (block.state == BlockState::active_allocated) allocated += block.size;
    if (block.state != BlockState::inactive) {
      active += block.size;
      requested += block.requested_size;  // may wrap on hostile input: then it just mismatches
    }
  }
  const auto mismatch = [&](const char* key, uint64_t have, uint64_t sum, const char* what) {
    if (have != sum) {
      fail(path() + "." + key, std::to_string(have) + " != " + std::to_string(sum) + ", the " + what);
    }
  };
  mismatch("total_size", info.total_size, next - info.address, "sum of its block sizes");
  mismatch("allocated_size", info.allocated_size, allocated, "sum of its active_allocated block sizes");
  mismatch("active_size", info.active_size, active, "sum of its active block sizes");
  mismatch("requested_size", info.requested_size, requested, "sum of its active blocks' requested_size");
  if (next > kMaxDeviceAddress) {
    fail(path() + ".total_size", "the segment at " + std::to_string(info.address) + " of " +
                                     std::to_string(info.total_size) + " bytes ends past 2^57, "
                                     "beyond any device's address space");
  }
}

// Two segments of one device never share an address (cudaMalloc hands out disjoint
// ranges); overlapping ones would seed the replay's start state with blocks on top of
// each other.
void Reader::check_no_overlap(const Snapshot& out) const {
  std::vector<size_t> order(out.segments.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&out](size_t a, size_t b) {
    const SnapshotSegment& x = out.segments[a];
    const SnapshotSegment& y = out.segments[b];
    return x.device != y.device ? x.device < y.device : x.info.address < y.info.address;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const SnapshotSegment& prev = out.segments[order[k - 1]];
    const SnapshotSegment& cur = out.segments[order[k]];
    if (prev.device != cur.device) continue;
    if (cur.info.address < prev.info.address + prev.info.total_size) {
      fail(at("segments", order[k]) + ".address",
           "the segment at " + std::to_string(cur.info.address) + " overlaps " +
               at("segments", order[k - 1]) + " (" + std::to_string(prev.info.address) + " + " +
               std::to_string(prev.info.total_size) + " bytes) on device " +
               std::to_string(cur.device));
    }
  }
}

void Reader::read_traces(PickleValue list, Snapshot& out) {
  const auto list_path = [] { return std::string("device_traces"); };
  expect(list, PickleKind::list, list_path);
  claim(list, list_path);
  out.device_traces.resize(list.size());
  for (size_t dev = 0; dev < list.size(); ++dev) {
    const auto dev_path = [dev] { return at("device_traces", dev); };
    const PickleValue events = expect(list.item(dev), PickleKind::list, dev_path);
    claim(events, dev_path);
    std::vector<SnapshotTraceEntry>& trace = out.device_traces[dev];
    trace.reserve(events.size());
    for (size_t e = 0; e < events.size(); ++e) {
      const auto entry_path = [dev, e] { return at("device_traces", dev) + at("", e); };
      const PickleValue d = expect(events.item(e), PickleKind::dict, entry_path);
      claim(d, entry_path);
      const auto field = [&](const char* key) {
        return [dev, e, key] { return at("device_traces", dev) + at("", e) + "." + key; };
      };
      SnapshotTraceEntry entry;
      Fields f;
      gather(d, f);
      const std::string_view action = to_str(require(f, Key::action, entry_path), field("action"));
      if (!parse_action(action, &entry.action)) {
        // Record annotations of some versions carry no memory effect: skip them.
        if (action == "user_defined") continue;
        fail(field("action")(), "unknown trace action '" + std::string(action) + "'");
      }
      const Key addr_key = entry.action == TraceAction::oom ? Key::device_free : Key::addr;
      entry.address = to_u64(require(f, addr_key, entry_path), field(key_name(addr_key)));
      entry.size = to_u64(require(f, Key::size, entry_path), field("size"));
      entry.stream = to_u64(require(f, Key::stream, entry_path), field("stream"));
      // oom records the request that failed, which may be any size; everything else
      // names memory that existed.
      if (entry.action != TraceAction::oom &&
          (entry.size > kMaxDeviceAddress || entry.address > kMaxDeviceAddress - entry.size)) {
        fail(field("size")(), std::to_string(entry.size) + " bytes at " + std::to_string(entry.address) +
                                  " end past 2^57, beyond any device's address space");
      }
      if (f.has(Key::time_us)) entry.time_us = to_i64(get(f, Key::time_us), field("time_us"));
      if (f.has(Key::frames)) expect(get(f, Key::frames), PickleKind::list, field("frames"));
      trace.push_back(entry);
    }
  }
}

void Reader::read_settings(PickleValue dict, Snapshot& out) {
  const auto path = [] { return std::string("allocator_settings"); };
  expect(dict, PickleKind::dict, path);
  const auto field = [](const char* key) {
    return [key] { return std::string("allocator_settings.") + key; };
  };
  AllocatorConfig& config = out.config;
  PickleValue v(nullptr, 0);
  if (dict.find("PYTORCH_CUDA_ALLOC_CONF", &v)) {
    out.alloc_conf_string = std::string(to_str(v, field("PYTORCH_CUDA_ALLOC_CONF")));
  }
  if (dict.find("max_split_size", &v)) {
    const auto p = field("max_split_size");
    if (v.kind() == PickleKind::int64 && v.as_int64() == -1) config.max_split_size = AllocatorConfig::kUnlimited;
    else config.max_split_size = to_u64(v, p);
  }
  if (dict.find("garbage_collection_threshold", &v)) {
    if (v.kind() == PickleKind::float64) config.garbage_collection_threshold = v.as_double();
    else if (v.kind() == PickleKind::int64) config.garbage_collection_threshold = static_cast<double>(v.as_int64());
    else wrong_type(field("garbage_collection_threshold"), "float", v);
  }
  if (dict.find("expandable_segments", &v)) config.expandable_segments = to_bool(v, field("expandable_segments"));
  if (dict.find("roundup_power2_divisions", &v)) {
    const auto p = field("roundup_power2_divisions");
    expect(v, PickleKind::dict, p);
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string_view key = to_str(v.key(i), p);
      // Keys are the interval's lower bound in MiB: '1', '2', '4', ... '32768'.
      size_t index = 0;
      while (index < config.roundup_power2_divisions.size() && std::to_string(1u << index) != key) ++index;
      if (index == config.roundup_power2_divisions.size()) {
        fail(p(), "unexpected key '" + std::string(key) + "' (expected a power of two 1..32768)");
      }
      const auto value_path = [key] {
        return "allocator_settings.roundup_power2_divisions['" + std::string(key) + "']";
      };
      const uint64_t divisions = to_u64(v.value(i), value_path);
      if (divisions > UINT32_MAX) fail(value_path(), "division count out of range");
      config.roundup_power2_divisions[index] = static_cast<uint32_t>(divisions);
    }
  }
}

}  // namespace

namespace {

// The pickle parser keeps the bytes (str nodes point into them): hand over, don't copy.
// Stack frames ('frames' of trace entries and blocks) are checked to be lists and never
// read: the parser keeps no items for them.
Snapshot read_owned_bytes(LargeBuffer<char> bytes, size_t size, const std::string& name) {
  PickleDoc doc;
  PickleParseOptions options;
  options.drop_items_of_key = "frames";
  try {
    doc = parse_pickle(std::move(bytes), size, name, options);
  } catch (const PickleError& e) {
    throw SnapshotError(e.what());
  }
  return Reader(doc, name).read();
}

}  // namespace

Snapshot read_snapshot_bytes(const std::string& bytes, const std::string& name) {
  LargeBuffer<char> copy = allocate_large_array<char>(bytes.size());
  std::memcpy(copy.get(), bytes.data(), bytes.size());
  return read_owned_bytes(std::move(copy), bytes.size(), name);
}

Snapshot read_snapshot_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SnapshotError(path + ": cannot open: " + std::strerror(errno));
  // One read of the whole file into a buffer that is not zero-filled first (an
  // istreambuf_iterator copy went byte by byte; a std::string's resize zero-fills, and
  // that first touch of 4 MB of pages cost more than the read).
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) {  // not seekable (a pipe, /dev/stdin): read what is there, as before
    in.clear();
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw SnapshotError(path + ": read error");
    return read_snapshot_bytes(bytes, path);
  }
  // Not zero-filled, and in huge pages where the system allows (large_buffer.h).
  LargeBuffer<char> bytes = allocate_large_array<char>(static_cast<size_t>(size));
  size_t got = 0;
  if (size > 0) {
    in.read(bytes.get(), size);
    got = static_cast<size_t>(in.gcount());
  }
  if (in.bad()) throw SnapshotError(path + ": read error");
  return read_owned_bytes(std::move(bytes), got, path);
}

}  // namespace memsim
