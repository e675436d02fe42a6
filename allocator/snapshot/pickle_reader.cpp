// The pickle reader: a stack machine over the opcodes listed in pickle.h, building a
// PickleDoc arena. Safety rules (see pickle.h): every read is bounds-checked, every pop
// is checked against the current MARK, memo indices are checked, containers are frozen
// once inserted so the result is acyclic, and nesting depth is tracked incrementally
// (no recursion anywhere).
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "allocator/snapshot/pickle.h"

namespace memsim {

const char* pickle_kind_name(PickleKind kind) {
  switch (kind) {
    case PickleKind::none: return "None";
    case PickleKind::boolean: return "bool";
    case PickleKind::int64: return "int";
    case PickleKind::uint64: return "int";
    case PickleKind::big_int: return "int wider than 64 bits";
    case PickleKind::float64: return "float";
    case PickleKind::str: return "str";
    case PickleKind::bytes: return "bytes";
    case PickleKind::list: return "list";
    case PickleKind::tuple: return "tuple";
    case PickleKind::dict: return "dict";
  }
  return "?";
}

// ---- PickleValue -------------------------------------------------------------------

bool PickleValue::find(std::string_view key, PickleValue* out) const {
  const PickleDoc::Node& d = doc_->nodes_[index_];
  const uint32_t* kv = doc_->kids_.data() + d.a;
  for (size_t i = d.c.count; i >= 2; i -= 2) {  // from the back: the last duplicate wins
    const PickleDoc::Node& k = doc_->nodes_[kv[i - 2]];
    if (k.kind == PickleKind::str && k.len == key.size() &&
        std::memcmp(doc_->text_.get() + k.a, key.data(), key.size()) == 0) {
      *out = PickleValue(doc_, kv[i - 1]);
      return true;
    }
  }
  return false;
}

// ---- Parser ------------------------------------------------------------------------

namespace {

enum Op : uint8_t {
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2', BINFLOAT = 'G',
  BININT = 'J', BININT1 = 'K', BININT2 = 'M', NONE = 'N', BINUNICODE = 'X',
  APPEND = 'a', DICT = 'd', EMPTY_DICT = '}', APPENDS = 'e', BINGET = 'h',
  LONG_BINGET = 'j', LIST = 'l', EMPTY_LIST = ']', BINPUT = 'q', LONG_BINPUT = 'r',
  SETITEM = 's', TUPLE = 't', EMPTY_TUPLE = ')', SETITEMS = 'u', BINBYTES = 'B',
  SHORT_BINBYTES = 'C', PROTO = 0x80, TUPLE1 = 0x85, TUPLE2 = 0x86, TUPLE3 = 0x87,
  NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b,
  SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e, MEMOIZE = 0x94,
  FRAME = 0x95,
};

// Opcodes we know but refuse, with the reason given in the error.
const char* refused_opcode(uint8_t op, const char** why) {
  static const char* kObjects = "builds Python objects; only plain data is accepted";
  static const char* kText = "is a protocol 0/1 text opcode; only protocols 2-5 are accepted";
  static const char* kOther = "is not supported (sets, buffers and extensions are not plain snapshot data)";
  switch (op) {
    case 'c': *why = kObjects; return "GLOBAL";
    case 0x93: *why = kObjects; return "STACK_GLOBAL";
    case 'R': *why = kObjects; return "REDUCE";
    case 'b': *why = kObjects; return "BUILD";
    case 'i': *why = kObjects; return "INST";
    case 'o': *why = kObjects; return "OBJ";
    case 0x81: *why = kObjects; return "NEWOBJ";
    case 0x92: *why = kObjects; return "NEWOBJ_EX";
    case 'P': *why = kObjects; return "PERSID";
    case 'Q': *why = kObjects; return "BINPERSID";
    case 0x82: *why = kObjects; return "EXT1";
    case 0x83: *why = kObjects; return "EXT2";
    case 0x84: *why = kObjects; return "EXT4";
    case 'I': *why = kText; return "INT";
    case 'L': *why = kText; return "LONG";
    case 'S': *why = kText; return "STRING";
    case 'T': *why = kText; return "BINSTRING";
    case 'U': *why = kText; return "SHORT_BINSTRING";
    case 'V': *why = kText; return "UNICODE";
    case 'F': *why = kText; return "FLOAT";
    case 'p': *why = kText; return "PUT";
    case 'g': *why = kText; return "GET";
    case 0x8f: *why = kOther; return "EMPTY_SET";
    case 0x90: *why = kOther; return "ADDITEMS";
    case 0x91: *why = kOther; return "FROZENSET";
    case 0x96: *why = kOther; return "BYTEARRAY8";
    case 0x97: *why = kOther; return "NEXT_BUFFER";
    case 0x98: *why = kOther; return "READONLY_BUFFER";
    default: return nullptr;
  }
}

// Python decodes pickled str with 'surrogatepass', so encoded surrogates are accepted;
// overlong forms and code points above U+10FFFF are not.
bool valid_utf8(const unsigned char* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t extra;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) { extra = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { extra = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { extra = 3; cp = c & 0x07; }
    else return false;
    if (n - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static const uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace

class PickleParser {
 public:
  PickleParser(PickleDoc& doc, const std::string& name, const PickleParseOptions& options)
      : doc_(doc), name_(name), drop_key_(options.drop_items_of_key) {}
  void run(LargeBuffer<char> bytes, size_t size);

 private:
  using Node = PickleDoc::Node;

  // Error paths are out of line and cold so that the hot helpers below inline.
  [[noreturn]] __attribute__((noinline, cold)) void fail(const std::string& what) const {
    throw PickleError(name_ + ": byte " + std::to_string(op_ - begin_) + ": " + what);
  }
  [[noreturn]] __attribute__((noinline, cold)) void truncated(size_t n, const char* opname) const {
    fail(std::string("truncated ") + opname + " (needs " + std::to_string(n) + " bytes, " +
         std::to_string(end_ - cur_) + " left)");
  }
  [[noreturn]] __attribute__((noinline, cold)) void underflow(const char* opname) const {
    fail(std::string("stack underflow in ") + opname);
  }
  const unsigned char* take(size_t n, const char* opname) {
    if (n > static_cast<size_t>(end_ - cur_)) truncated(n, opname);
    const unsigned char* p = cur_;
    cur_ += n;
    return p;
  }
  static uint64_t le(const unsigned char* p, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
  }
  // Little-endian fixed-width reads (one load each; a byte loop was a tenth of parsing).
  static uint32_t le4(const unsigned char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
  }
  static uint64_t le8(const unsigned char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
  }

  uint32_t new_node(PickleKind kind) {
    Node n{};
    n.kind = kind;
    doc_.nodes_.push_back(n);
    return static_cast<uint32_t>(doc_.nodes_.size() - 1);
  }
  uint32_t new_container(PickleKind kind) {
    const uint32_t id = new_node(kind);
    doc_.nodes_[id].a = static_cast<uint32_t>(doc_.kids_.size());
    doc_.nodes_[id].depth = 1;
    return id;
  }
  uint32_t new_int(int64_t v) {
    const uint32_t id = new_node(PickleKind::int64);
    doc_.nodes_[id].i = v;
    return id;
  }

  // The value stack's push: the fast path inlines (vector::push_back did not, in run()).
  void push(uint32_t v) { stack_.push_back(v); }

  // Number of stack items above the innermost MARK (Python's current stack).
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  size_t available() const { return stack_.size() - floor(); }
  uint32_t pop(const char* opname) {
    if (available() == 0) underflow(opname);
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  uint32_t top(const char* opname) {
    if (available() == 0) underflow(opname);
    return stack_.back();
  }
  size_t pop_mark(const char* opname) {  // returns the start index of the marked items
    if (marks_.empty()) fail(std::string(opname) + " without a MARK");
    const size_t start = marks_.back();
    marks_.pop_back();
    return start;
  }

  [[noreturn]] __attribute__((noinline, cold)) void self_insert() const {
    fail("a container cannot contain itself");
  }
  [[noreturn]] __attribute__((noinline, cold)) void too_deep() const {
    fail("nesting deeper than " + std::to_string(PickleDoc::kMaxDepth) + " containers");
  }

  // Makes room for `more` children of `container` (see PickleDoc::kids_).
  void reserve(uint32_t container, size_t more) {
    Node& n = doc_.nodes_[container];
    const size_t need = size_t{n.c.count} + more;
    if (need <= n.c.cap) return;
    if (need > UINT32_MAX / 2) fail("container too large");
    if (size_t{n.a} + n.c.cap == doc_.kids_.size()) {  // last in the array: grow in place
      grow_kids(size_t{n.a} + need);
      n.c.cap = static_cast<uint32_t>(need);
      return;
    }
    const size_t cap = need > 2 * size_t{n.c.cap} ? need : 2 * size_t{n.c.cap};
    const size_t start = doc_.kids_.size();
    grow_kids(start + cap);
    std::memcpy(doc_.kids_.data() + start, doc_.kids_.data() + n.a, sizeof(uint32_t) * n.c.count);
    n.a = static_cast<uint32_t>(start);
    n.c.cap = static_cast<uint32_t>(cap);
  }
  // Sets the used size of kids_ to `size` (growing without zero-filling).
  void grow_kids(size_t size) {
    if (size > UINT32_MAX) fail("too many container items");
    doc_.kids_.set_size(size);
  }

  // Puts `child` into `container` (a list/tuple item, or a dict key/value); the slot
  // must have been reserved.
  void insert(uint32_t container, uint32_t child) {
    if (child == container) self_insert();
    Node& c = doc_.nodes_[child];
    c.flags |= PickleDoc::kFrozen;
    const uint32_t depth = static_cast<uint32_t>(c.depth) + 1;
    if (depth > PickleDoc::kMaxDepth) too_deep();
    Node& parent = doc_.nodes_[container];
    if (depth > parent.depth) parent.depth = static_cast<uint16_t>(depth);
    doc_.kids_[parent.a + parent.c.count++] = child;
  }
  void check_mutable(uint32_t target, PickleKind want, const char* opname) {
    const Node& t = doc_.nodes_[target];
    if (t.kind != want) {
      fail(std::string(opname) + " on a " + pickle_kind_name(t.kind) + ", expected a " +
           pickle_kind_name(want));
    }
    // Python's pickler finishes a container before putting it into another one;
    // refusing later mutation keeps the graph acyclic.
    if (t.flags & PickleDoc::kFrozen) fail(std::string(opname) + " on a container already inside another one");
  }
  void check_key(uint32_t key) {
    const PickleKind k = doc_.nodes_[key].kind;
    if (k == PickleKind::list || k == PickleKind::dict) {
      fail(std::string("unhashable dict key of type ") + pickle_kind_name(k));
    }
  }
  // Freezes a child being put into a container; returns the depth the container then
  // has at least.
  uint32_t adopt(Node& child) {
    child.flags |= PickleDoc::kFrozen;
    const uint32_t depth = static_cast<uint32_t>(child.depth) + 1;
    if (depth > PickleDoc::kMaxDepth) too_deep();
    return depth;
  }
  // Appends stack_[start..] to a list/tuple and drops them from the stack. The batch
  // loops keep the container's fields in locals (what insert() does per child; a child
  // is never the container, so they cannot change under the loop): most of a snapshot's
  // children are its stack frames, a thousand per APPENDS.
  void append_items(uint32_t list, size_t start) {
    const size_t n = stack_.size() - start;
    reserve(list, n);
    Node* nodes = doc_.nodes_.data();
    Node& parent = nodes[list];
    uint32_t* out = doc_.kids_.data() + parent.a + parent.c.count;
    uint32_t depth = parent.depth;
    const uint32_t* items = stack_.data() + start;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t child = items[i];
      if (child == list) self_insert();
      depth = std::max(depth, adopt(nodes[child]));
      out[i] = child;
    }
    parent.depth = static_cast<uint16_t>(depth);
    parent.c.count += static_cast<uint32_t>(n);
    stack_.set_size(start);
  }
  // A list about to go into a dict under drop_key_ gives back its item slots when they
  // are the last ones in kids_ (they are when the pickler wrote the list just before, as
  // it does: a list is finished before the dict that holds it). Nothing else changes:
  // the items were checked as they went in, and the list is frozen once in the dict.
  void maybe_drop(uint32_t key, uint32_t value) {
    Node& v = doc_.nodes_[value];
    if (v.kind != PickleKind::list || v.c.count == 0 || (v.flags & PickleDoc::kDropped)) return;
    const Node& k = doc_.nodes_[key];
    if (k.kind != PickleKind::str || k.len != drop_key_.size() ||
        std::memcmp(doc_.text_.get() + k.a, drop_key_.data(), drop_key_.size()) != 0) {
      return;
    }
    if (size_t{v.a} + v.c.cap != doc_.kids_.size()) return;
    doc_.kids_.set_size(v.a);
    v.c.cap = 0;
    v.flags |= PickleDoc::kDropped;
  }
  void set_items(uint32_t dict, size_t start, const char* opname) {
    const size_t n = stack_.size() - start;
    if (n % 2 != 0) fail(std::string(opname) + " with an odd number of items");
    if (!drop_key_.empty()) {
      for (size_t i = start; i < stack_.size(); i += 2) maybe_drop(stack_[i], stack_[i + 1]);
    }
    reserve(dict, n);
    Node* nodes = doc_.nodes_.data();
    Node& parent = nodes[dict];
    uint32_t* out = doc_.kids_.data() + parent.a + parent.c.count;
    uint32_t depth = parent.depth;
    const uint32_t* items = stack_.data() + start;
    for (size_t i = 0; i < n; i += 2) {
      const uint32_t key = items[i], value = items[i + 1];
      check_key(key);
      if (key == dict) self_insert();
      depth = std::max(depth, adopt(nodes[key]));
      if (value == dict) self_insert();
      depth = std::max(depth, adopt(nodes[value]));
      out[i] = key;
      out[i + 1] = value;
    }
    parent.depth = static_cast<uint16_t>(depth);
    parent.c.count += static_cast<uint32_t>(n);
    stack_.set_size(start);
  }
  void make_tuple(size_t start) {
    const uint32_t t = new_container(PickleKind::tuple);
    append_items(t, start);
    push(t);
  }

  void memo_put(uint64_t index, uint32_t value) {
    if (index < dense_limit_) {
      if (index == memo_.size()) {
        memo_.push_back(kEmpty);  // the usual case: MEMOIZE
      } else if (index > memo_.size()) {
        const size_t old = memo_.size();
        memo_.set_size(index + 1);
        std::fill(memo_.data() + old, memo_.data() + memo_.size(), kEmpty);
      }
      if (memo_[index] == kEmpty) ++memo_entries_;
      memo_[index] = value;
    } else {
      if (sparse_memo_.insert_or_assign(index, value).second) ++memo_entries_;
    }
  }
  uint32_t memo_get(uint64_t index) {
    if (index < memo_.size() && memo_[index] != kEmpty) return memo_[index];
    if (index >= dense_limit_) {
      auto it = sparse_memo_.find(index);
      if (it != sparse_memo_.end()) return it->second;
    }
    undefined_memo(index);
  }
  [[noreturn]] __attribute__((noinline, cold)) void undefined_memo(uint64_t index) const {
    fail("memo index " + std::to_string(index) + " is not defined");
  }

  uint32_t read_long(size_t n, const char* opname);
  uint32_t read_text(size_t n, PickleKind kind, const char* opname);

  static constexpr uint32_t kEmpty = std::numeric_limits<uint32_t>::max();

  PickleDoc& doc_;
  const std::string& name_;
  const std::string_view drop_key_;
  // The input as pointers, not offsets: stores into the nodes (64-bit integers) cannot
  // alias a pointer, so the loop keeps these in registers.
  const unsigned char* begin_ = nullptr;
  const unsigned char* cur_ = nullptr;
  const unsigned char* end_ = nullptr;
  const unsigned char* op_ = nullptr;  // the opcode being executed (error offsets)
  size_t frame_end_ = 0;
  pickle_detail::PodArray<uint32_t> stack_;
  pickle_detail::PodArray<size_t> marks_;
  // Memo: dense for indices below a bound proportional to the input (so a hostile
  // LONG_BINPUT 0xffffffff cannot allocate gigabytes), a map beyond it.
  pickle_detail::PodArray<uint32_t> memo_;
  std::unordered_map<uint64_t, uint32_t> sparse_memo_;
  uint64_t dense_limit_ = 0;
  uint64_t memo_entries_ = 0;  // MEMOIZE stores at len(memo), as Python does
};

uint32_t PickleParser::read_long(size_t n, const char* opname) {
  const unsigned char* p = take(n, opname);
  if (n == 0) return new_int(0);
  const bool negative = (p[n - 1] & 0x80) != 0;
  const size_t low = n < 8 ? n : 8;
  uint64_t u = low == 8 ? le8(p) : le(p, low);
  if (n < 8 && negative) u |= ~uint64_t{0} << (8 * n);  // sign-extend
  bool fits = true;
  for (size_t i = 8; i < n; ++i) {
    if (p[i] != (negative ? 0xFF : 0x00)) { fits = false; break; }
  }
  if (fits && n > 8 && negative && (u >> 63) == 0) fits = false;  // below INT64_MIN
  if (!fits) return new_node(PickleKind::big_int);
  if (!negative && (u >> 63) != 0) {  // [2^63, 2^64): needs n > 8 (a 0x00 sign byte)
    const uint32_t id = new_node(PickleKind::uint64);
    doc_.nodes_[id].u = u;
    return id;
  }
  return new_int(static_cast<int64_t>(u));
}

uint32_t PickleParser::read_text(size_t n, PickleKind kind, const char* opname) {
  const size_t start = static_cast<size_t>(cur_ - begin_);
  const unsigned char* p = take(n, opname);
  if (kind == PickleKind::str && !valid_utf8(p, n)) fail(std::string(opname) + " is not valid UTF-8");
  const uint32_t id = new_node(kind);
  doc_.nodes_[id].a = static_cast<uint32_t>(start);
  doc_.nodes_[id].len = n;
  return id;
}

void PickleParser::run(LargeBuffer<char> bytes, size_t size) {
  doc_.text_ = std::move(bytes);
  doc_.text_size_ = size;
  begin_ = cur_ = op_ = reinterpret_cast<const unsigned char*>(doc_.text_.get());
  end_ = begin_ + size;
  if (size > (size_t{1} << 31)) fail("input larger than 2 GiB");
  dense_limit_ = size + 256;
  stack_.reserve(4096);
  // Real snapshots have about one node per 23 bytes.
  doc_.nodes_.reserve(size / 16 + 16);
  doc_.kids_.reserve(size / 3 + 16);  // real snapshots: one child per ~3.5 bytes

  while (true) {
    op_ = cur_;
    if (cur_ == end_) fail("truncated pickle: no STOP opcode");
    const uint8_t op = *cur_++;
    switch (op) {
      case PROTO: {
        const int v = *take(1, "PROTO");
        if (v > 5) fail("unsupported pickle protocol " + std::to_string(v));
        doc_.protocol_ = v;
        break;
      }
      case FRAME: {
        const uint64_t n = le8(take(8, "FRAME"));
        if (frame_end_ > static_cast<size_t>(op_ - begin_)) fail("FRAME before the end of the current frame");
        if (n > static_cast<size_t>(end_ - cur_)) {
          fail("truncated FRAME (declares " + std::to_string(n) + " bytes, " +
               std::to_string(end_ - cur_) + " left)");
        }
        frame_end_ = static_cast<size_t>(cur_ - begin_) + n;
        break;
      }
      case STOP: {
        if (!marks_.empty() || stack_.size() != 1) {
          fail("STOP with " + std::to_string(stack_.size()) + " items on the stack and " +
               std::to_string(marks_.size()) + " open MARKs (expected one item)");
        }
        doc_.root_ = stack_.back();
        return;  // trailing bytes are ignored, as pickle.load does
      }
      case MARK: marks_.push_back(stack_.size()); break;
      case POP: pop("POP"); break;
      case POP_MARK: stack_.set_size(pop_mark("POP_MARK")); break;
      case DUP: push(top("DUP")); break;

      case NONE: push(new_node(PickleKind::none)); break;
      case NEWTRUE:
      case NEWFALSE: {
        const uint32_t id = new_node(PickleKind::boolean);
        doc_.nodes_[id].i = op == NEWTRUE;
        push(id);
        break;
      }
      case BININT: {
        const uint32_t v = static_cast<uint32_t>(le4(take(4, "BININT")));
        push(new_int(static_cast<int32_t>(v)));
        break;
      }
      case BININT1: push(new_int(*take(1, "BININT1"))); break;
      case BININT2: {
        const unsigned char* p = take(2, "BININT2");
        push(new_int(p[0] | (int64_t{p[1]} << 8)));
        break;
      }
      case LONG1: {
        const size_t n = *take(1, "LONG1");
        push(read_long(n, "LONG1"));
        break;
      }
      case LONG4: {
        const int32_t n = static_cast<int32_t>(static_cast<uint32_t>(le4(take(4, "LONG4"))));
        if (n < 0) fail("LONG4 with negative length");
        push(read_long(static_cast<size_t>(n), "LONG4"));
        break;
      }
      case BINFLOAT: {
        const unsigned char* p = take(8, "BINFLOAT");
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];  // big-endian
        const uint32_t id = new_node(PickleKind::float64);
        std::memcpy(&doc_.nodes_[id].f, &bits, sizeof bits);
        push(id);
        break;
      }
      case SHORT_BINUNICODE:
        push(read_text(*take(1, "SHORT_BINUNICODE"), PickleKind::str, "SHORT_BINUNICODE"));
        break;
      case BINUNICODE:
        push(read_text(le4(take(4, "BINUNICODE")), PickleKind::str, "BINUNICODE"));
        break;
      case BINUNICODE8:
        push(read_text(le8(take(8, "BINUNICODE8")), PickleKind::str, "BINUNICODE8"));
        break;
      case SHORT_BINBYTES:
        push(read_text(*take(1, "SHORT_BINBYTES"), PickleKind::bytes, "SHORT_BINBYTES"));
        break;
      case BINBYTES:
        push(read_text(le4(take(4, "BINBYTES")), PickleKind::bytes, "BINBYTES"));
        break;
      case BINBYTES8:
        push(read_text(le8(take(8, "BINBYTES8")), PickleKind::bytes, "BINBYTES8"));
        break;

      case EMPTY_LIST: push(new_container(PickleKind::list)); break;
      case EMPTY_DICT: push(new_container(PickleKind::dict)); break;
      case EMPTY_TUPLE: push(new_container(PickleKind::tuple)); break;
      case LIST: {
        const size_t start = pop_mark("LIST");
        const uint32_t l = new_container(PickleKind::list);
        append_items(l, start);
        push(l);
        break;
      }
      case DICT: {
        const size_t start = pop_mark("DICT");
        const uint32_t d = new_container(PickleKind::dict);
        set_items(d, start, "DICT");
        push(d);
        break;
      }
      case TUPLE: make_tuple(pop_mark("TUPLE")); break;
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        const size_t n = op - TUPLE1 + 1;
        if (available() < n) fail("stack underflow in TUPLE" + std::to_string(n));
        make_tuple(stack_.size() - n);
        break;
      }
      case APPEND: {
        const uint32_t item = pop("APPEND");
        const uint32_t list = top("APPEND");
        check_mutable(list, PickleKind::list, "APPEND");
        reserve(list, 1);
        insert(list, item);
        break;
      }
      case APPENDS: {
        const size_t start = pop_mark("APPENDS");
        if (start <= floor()) fail("stack underflow in APPENDS");
        const uint32_t list = stack_[start - 1];
        check_mutable(list, PickleKind::list, "APPENDS");
        append_items(list, start);
        break;
      }
      case SETITEM: {
        const uint32_t value = pop("SETITEM");
        const uint32_t key = pop("SETITEM");
        const uint32_t dict = top("SETITEM");
        check_mutable(dict, PickleKind::dict, "SETITEM");
        check_key(key);
        if (!drop_key_.empty()) maybe_drop(key, value);
        reserve(dict, 2);
        insert(dict, key);
        insert(dict, value);
        break;
      }
      case SETITEMS: {
        const size_t start = pop_mark("SETITEMS");
        if (start <= floor()) fail("stack underflow in SETITEMS");
        const uint32_t dict = stack_[start - 1];
        check_mutable(dict, PickleKind::dict, "SETITEMS");
        set_items(dict, start, "SETITEMS");
        break;
      }

      case MEMOIZE: memo_put(memo_entries_, top("MEMOIZE")); break;
      case BINPUT: memo_put(*take(1, "BINPUT"), top("BINPUT")); break;
      case LONG_BINPUT: memo_put(le4(take(4, "LONG_BINPUT")), top("LONG_BINPUT")); break;
      case BINGET: push(memo_get(*take(1, "BINGET"))); break;
      case LONG_BINGET: push(memo_get(le4(take(4, "LONG_BINGET")))); break;

      default: {
        const char* why = nullptr;
        const char* opname = refused_opcode(op, &why);
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        if (opname) fail(std::string("opcode ") + opname + " (" + hex + ") " + why);
        fail(std::string("unknown opcode ") + hex);
      }
    }
  }
}

PickleDoc parse_pickle(std::string_view bytes, const std::string& name, const PickleParseOptions& options) {
  LargeBuffer<char> copy = allocate_large_array<char>(bytes.size());
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
  return parse_pickle(std::move(copy), bytes.size(), name, options);
}

PickleDoc parse_pickle(LargeBuffer<char> bytes, size_t size, const std::string& name,
                       const PickleParseOptions& options) {
  PickleDoc doc;
  PickleParser(doc, name, options).run(std::move(bytes), size);
  return doc;
}

}  // namespace memsim
