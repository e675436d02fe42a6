// A small, safe Python pickle reader and writer for plain data (no objects, no code).
//
// Reader contract (parse_pickle):
//  - Accepts protocols 2-5 made of None/bool/int/float/str/bytes/list/tuple/dict: the
//    opcodes torch.cuda.memory._dump_snapshot's protocol-4 output uses plus the protocol
//    2-5 basics. Opcodes that name or build Python objects (GLOBAL, REDUCE, BUILD, ...)
//    are rejected: there is no object model to build them into.
//  - Never crashes, hangs or allocates more than O(input size) on hostile input: every
//    length is checked against the remaining bytes, memo indices and the stack are
//    checked, nesting is capped (kMaxDepth) and nothing recurses.
//  - Errors are PickleError with "NAME: byte OFFSET: what is wrong"; OFFSET is the
//    position of the opcode that failed.
//
// The result is a PickleDoc: a flat arena of nodes that PickleValue handles point into.
// Memo references (BINGET) share nodes, so the tree is a DAG. It is guaranteed acyclic:
// a container is frozen once it is put inside another one, and further APPEND/SETITEM
// on a frozen container is an error (Python's pickler never does that for plain data).
// Consumers walking the DAG must still not assume nodes are unshared; snapshot_reader
// rejects shared records so that its work stays linear in the input size.
//
// PickleParseOptions::drop_items_of_key names a dict key whose list values keep their
// kind and size but not their items (items_dropped()): a memory snapshot's stack frames
// are 94% of its container items and the snapshot reader never reads them, so they take
// no memory (on this scale the pages first touched cost about as much as the parsing).
// The items are parsed and checked exactly as any others; only storing them is skipped.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "allocator/snapshot/large_buffer.h"

namespace memsim {

class PickleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class PickleKind : uint8_t {
  none, boolean, int64, uint64,  // uint64: LONG values in [2^63, 2^64)
  big_int,                        // LONG wider than 64 bits: value not kept
  float64, str, bytes, list, tuple, dict
};
const char* pickle_kind_name(PickleKind kind);  // "int", "str", "dict", ...

class PickleDoc;

namespace pickle_detail {
// A growable array of trivially copyable T that never value-initialises: growing copies
// the used part into uninitialised storage (allocator/snapshot/large_buffer.h: huge pages
// where the system allows), so a page of reserved room is first touched
// when an element is written there (on a 4 MB snapshot, page faults cost about as much as
// parsing). push_back's fast path is inline; growing is out of line.
template <class T>
class PodArray {
 public:
  size_t size() const { return size_; }
  size_t capacity() const { return cap_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T& back() { return data_[size_ - 1]; }
  const T& back() const { return data_[size_ - 1]; }
  void push_back(const T& v) {
    if (__builtin_expect(size_ == cap_, 0)) grow(size_ + 1);
    data_[size_++] = v;
  }
  void pop_back() { --size_; }
  // Makes room for `n` elements in all (growing by doubling, at least to 1024).
  void reserve(size_t n) {
    if (n > cap_) grow(n);
  }
  // Shrinks, or grows into reserved room whose new elements the caller then writes.
  void set_size(size_t n) {
    reserve(n);
    size_ = n;
  }

 private:
  __attribute__((noinline)) void grow(size_t n) {
    size_t cap = cap_ < 1024 ? 1024 : cap_;
    while (cap < n) cap *= 2;
    if (cap > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    LargeBuffer<T> bigger = allocate_large_array<T>(cap);  // not initialised: untouched
    if (size_ > 0) std::memcpy(bigger.get(), data_.get(), sizeof(T) * size_);
    data_ = std::move(bigger);
    cap_ = cap;
  }
  LargeBuffer<T> data_;
  size_t size_ = 0;
  size_t cap_ = 0;
};
}  // namespace pickle_detail

// A read-only handle on one node of a PickleDoc; cheap to copy, valid while the doc lives.
// The accessors are inline (the snapshot reader calls them per field of every record).
class PickleValue {
 public:
  PickleValue(const PickleDoc* doc, uint32_t index) : doc_(doc), index_(index) {}

  inline PickleKind kind() const;
  uint32_t id() const { return index_; }  // node index: equal ids = same (shared) object
  bool is_none() const { return kind() == PickleKind::none; }
  bool is_int() const { return kind() == PickleKind::int64 || kind() == PickleKind::uint64; }

  // Accessors require the matching kind (checked by the caller through kind()).
  inline bool as_bool() const;
  inline int64_t as_int64() const;     // int64 kind
  inline uint64_t as_uint64() const;   // uint64 kind, or a non-negative int64
  inline double as_double() const;
  inline std::string_view as_string() const;  // str (UTF-8) or bytes

  // list / tuple / dict: number of items (dict: entries).
  inline size_t size() const;
  // A list whose items were not kept (PickleParseOptions::drop_items_of_key): size() is
  // its length, item() must not be called.
  inline bool items_dropped() const;
  inline PickleValue item(size_t i) const;              // list / tuple
  inline PickleValue key(size_t i) const;               // dict entry i, insertion order
  inline PickleValue value(size_t i) const;             // dict entry i
  // Dict lookup by str key; false when absent. Duplicate keys (hostile input only):
  // the last one wins, as in Python.
  bool find(std::string_view key, PickleValue* out) const;

 private:
  const PickleDoc* doc_;
  uint32_t index_;
};

class PickleDoc {
 public:
  static constexpr uint32_t kMaxDepth = 1000;  // containers inside containers

  PickleValue root() const { return PickleValue(this, root_); }
  size_t node_count() const { return nodes_.size(); }
  int protocol() const { return protocol_; }

 private:
  friend class PickleValue;
  friend class PickleParser;

  struct Slots {
    uint32_t count;  // children used
    uint32_t cap;    // slots reserved at kids_[a, a + cap)
  };
  static constexpr uint8_t kFrozen = 1;   // inside another container: no more mutation
  static constexpr uint8_t kDropped = 2;  // a list whose items were not kept
  struct Node {
    PickleKind kind;
    uint8_t flags;    // kFrozen, kDropped
    uint16_t depth;   // 0 for scalars; 1 + deepest child for containers
    uint32_t a;       // str/bytes: offset into text_; containers: first slot in kids_
    union {
      int64_t i;
      uint64_t u;
      double f;
      uint64_t len;  // str/bytes length
      Slots c;       // containers
    };
  };
  pickle_detail::PodArray<Node> nodes_;
  // Children of all containers in one array: list/tuple items, or dict key, value,
  // key, value... Pickles fill a container in batches (APPENDS per 1000 items)
  // interleaved with building its children, so a container that outgrows its slots
  // moves to the end with doubled capacity (amortized O(1) per child, at most 2x space).
  // Growing does not zero-fill (touch) slots that are reserved but never used.
  pickle_detail::PodArray<uint32_t> kids_;
  // The input bytes (str/bytes nodes point into them), in a buffer that was never
  // zero-filled: read_snapshot_file reads the file straight into it.
  LargeBuffer<char> text_;
  size_t text_size_ = 0;
  uint32_t root_ = 0;
  int protocol_ = 0;
};

PickleKind PickleValue::kind() const { return doc_->nodes_[index_].kind; }
bool PickleValue::as_bool() const { return doc_->nodes_[index_].i != 0; }
int64_t PickleValue::as_int64() const { return doc_->nodes_[index_].i; }
uint64_t PickleValue::as_uint64() const { return doc_->nodes_[index_].u; }
double PickleValue::as_double() const { return doc_->nodes_[index_].f; }
std::string_view PickleValue::as_string() const {
  const PickleDoc::Node& n = doc_->nodes_[index_];
  return std::string_view(doc_->text_.get() + n.a, n.len);
}
size_t PickleValue::size() const {
  const PickleDoc::Node& n = doc_->nodes_[index_];
  return n.kind == PickleKind::dict ? n.c.count / 2 : n.c.count;
}
bool PickleValue::items_dropped() const {
  return (doc_->nodes_[index_].flags & PickleDoc::kDropped) != 0;
}
PickleValue PickleValue::item(size_t i) const {
  return PickleValue(doc_, doc_->kids_[size_t{doc_->nodes_[index_].a} + i]);
}
PickleValue PickleValue::key(size_t i) const {
  return PickleValue(doc_, doc_->kids_[size_t{doc_->nodes_[index_].a} + 2 * i]);
}
PickleValue PickleValue::value(size_t i) const {
  return PickleValue(doc_, doc_->kids_[size_t{doc_->nodes_[index_].a} + 2 * i + 1]);
}

struct PickleParseOptions {
  // Lists put into a dict under this str key keep no items (see above); empty: keep all.
  std::string_view drop_items_of_key;
};

// Parses `bytes` (copied into the doc). `name` is used in error messages.
PickleDoc parse_pickle(std::string_view bytes, const std::string& name,
                       const PickleParseOptions& options = {});
// Parses the `size` bytes of `bytes` (from allocate_large_array), which the doc keeps.
PickleDoc parse_pickle(LargeBuffer<char> bytes, size_t size, const std::string& name,
                       const PickleParseOptions& options = {});

// ---------------------------------------------------------------------------------
// Writer: emits protocol 4 using only the opcodes pytorch.org/memory_viz's unpickler
// accepts (§10.1): PROTO, FRAME, STOP, MARK, EMPTY_DICT, EMPTY_LIST, TUPLE2, APPEND(S),
// SETITEM(S), BININT/BININT1/BININT2, LONG1, BINFLOAT, SHORT_BINUNICODE, BINUNICODE,
// NEWTRUE/NEWFALSE, NONE, MEMOIZE, BINGET/LONG_BINGET. Like Python's pickler it
// memoizes strings and containers, batches APPENDS/SETITEMS per 1000 items and cuts
// frames at 64 KiB, so the output reads like what pickle.dump writes.
// Usage is streaming: begin_dict(n); string("a"); integer(1); ...; end_dict(); finish().
// Containers announce their item count up front because CPython picks APPEND vs
// APPENDS per batch by its size; with it the output is byte-identical to
// pickle.dumps(obj, protocol=4) for the same data (checked on the 46 real snapshots).
// Misuse (wrong count, end_list on a dict, finish with open containers) throws
// std::logic_error.
class PickleWriter {
 public:
  void none();
  void boolean(bool v);
  void integer(int64_t v);
  void unsigned_integer(uint64_t v);
  void real(double v);
  void string(std::string_view s);  // must be valid UTF-8 (not checked)

  void begin_list(size_t count);  // then `count` items, then end_list()
  void end_list();
  void begin_dict(size_t count);  // then `count` key, value pairs, then end_dict()
  void end_dict();
  void tuple2_ints(int64_t a, int64_t b);

  // Appends STOP, adds PROTO and FRAME headers and returns the pickle.
  std::string finish();

 private:
  struct Open {
    bool is_dict;
    bool expecting_value;  // dict: a key was written, its value comes next
    uint32_t pending;      // items (dict: pairs) written in the current batch
    uint32_t batch;        // size of the current batch
    size_t remaining;      // items (dict: pairs) still to come
  };
  void before_value();
  void after_value();
  void memoize();

  std::string body_;                  // opcodes after PROTO
  std::vector<size_t> frame_ends_;    // offsets in body_ where frames were cut
  size_t frame_start_ = 0;
  std::vector<Open> open_;
  std::unordered_map<std::string, uint32_t> string_memo_;
  uint32_t memo_count_ = 0;
};

}  // namespace memsim
