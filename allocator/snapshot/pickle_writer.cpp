// The pickle writer: protocol 4 in the shape CPython's pickler produces for plain data
// (memoized strings and containers, APPENDS/SETITEMS batches of 1000, 64 KiB frames),
// restricted to the opcodes memory_viz's JavaScript unpickler accepts (§10.1).
#include <cstring>
#include <stdexcept>

#include "allocator/snapshot/pickle.h"

namespace memsim {
namespace {

constexpr uint32_t kBatch = 1000;             // CPython's _BATCHSIZE
constexpr size_t kFrameTarget = 64 * 1024;    // CPython's _FRAME_SIZE_TARGET

void put_le(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

// Called before every value: opens the enclosing container's batch (with a MARK when
// it has more than one item, as CPython does), then cuts a frame when the current one
// is big enough (where CPython's C pickler does: at the start of each save()).
void PickleWriter::before_value() {
  if (!open_.empty()) {
    Open& o = open_.back();
    if (o.remaining == 0) throw std::logic_error("PickleWriter: more items than announced");
    if (o.pending == 0 && !(o.is_dict && o.expecting_value)) {
      o.batch = o.remaining < kBatch ? o.remaining : kBatch;
      if (o.batch > 1) body_.push_back('(');  // MARK
    }
  }
  if (body_.size() - frame_start_ >= kFrameTarget) {
    frame_ends_.push_back(body_.size());
    frame_start_ = body_.size();
  }
}

// Called after every complete value: counts it in its container's batch and closes the
// batch with APPENDS/SETITEMS (APPEND/SETITEM for a one-item batch).
void PickleWriter::after_value() {
  if (open_.empty()) return;
  Open& o = open_.back();
  if (o.is_dict) {
    o.expecting_value = !o.expecting_value;
    if (o.expecting_value) return;  // that was a key
  }
  --o.remaining;
  if (++o.pending == o.batch) {
    if (o.batch > 1) body_.push_back(o.is_dict ? 'u' : 'e');  // SETITEMS / APPENDS
    else body_.push_back(o.is_dict ? 's' : 'a');              // SETITEM / APPEND
    o.pending = 0;
  }
}

void PickleWriter::memoize() {
  body_.push_back(static_cast<char>(0x94));  // MEMOIZE
  ++memo_count_;
}

void PickleWriter::none() { before_value(); body_.push_back('N'); after_value(); }

void PickleWriter::boolean(bool v) {
  before_value();
  body_.push_back(static_cast<char>(v ? 0x88 : 0x89));  // NEWTRUE / NEWFALSE
  after_value();
}

void PickleWriter::integer(int64_t v) {
  before_value();
  if (v >= 0 && v < 0x100) {
    body_.push_back('K');  // BININT1
    put_le(body_, static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v < 0x10000) {
    body_.push_back('M');  // BININT2
    put_le(body_, static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    body_.push_back('J');  // BININT
    put_le(body_, static_cast<uint64_t>(v), 4);
  } else {
    // LONG1 with CPython's length: minimal two's complement (bit_length // 8 + 1 bytes).
    const uint64_t u = static_cast<uint64_t>(v);
    int n = 8;
    while (n > 1) {
      const uint64_t top = (u >> (8 * (n - 1))) & 0xFF;
      const uint64_t next_sign = (u >> (8 * (n - 1) - 1)) & 1;
      if ((v >= 0 && top == 0 && next_sign == 0) || (v < 0 && top == 0xFF && next_sign == 1)) --n;
      else break;
    }
    body_.push_back(static_cast<char>(0x8a));
    body_.push_back(static_cast<char>(n));
    put_le(body_, u, n);
  }
  after_value();
}

void PickleWriter::unsigned_integer(uint64_t v) {
  if (v <= static_cast<uint64_t>(INT64_MAX)) return integer(static_cast<int64_t>(v));
  before_value();
  body_.push_back(static_cast<char>(0x8a));  // LONG1, 9 bytes: a 0x00 sign byte on top
  body_.push_back(9);
  put_le(body_, v, 8);
  body_.push_back(0);
  after_value();
}

void PickleWriter::real(double v) {
  before_value();
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  body_.push_back('G');  // BINFLOAT, big-endian
  for (int i = 7; i >= 0; --i) body_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  after_value();
}

void PickleWriter::string(std::string_view s) {
  before_value();
  auto it = string_memo_.find(std::string(s));
  if (it != string_memo_.end()) {
    if (it->second < 0x100) {
      body_.push_back('h');  // BINGET
      put_le(body_, it->second, 1);
    } else {
      body_.push_back('j');  // LONG_BINGET
      put_le(body_, it->second, 4);
    }
  } else {
    if (s.size() < 0x100) {
      body_.push_back(static_cast<char>(0x8c));  // SHORT_BINUNICODE
      put_le(body_, s.size(), 1);
    } else {
      // BINUNICODE (4-byte length); BINUNICODE8 is not accepted by memory_viz.
      if (s.size() > UINT32_MAX) throw std::length_error("PickleWriter: string longer than 4 GiB");
      body_.push_back('X');
      put_le(body_, s.size(), 4);
    }
    body_.append(s.data(), s.size());
    string_memo_.emplace(std::string(s), memo_count_);
    memoize();
  }
  after_value();
}

void PickleWriter::begin_list(size_t count) {
  before_value();
  body_.push_back(']');  // EMPTY_LIST
  memoize();
  open_.push_back(Open{false, false, 0, 0, count});
}

void PickleWriter::begin_dict(size_t count) {
  before_value();
  body_.push_back('}');  // EMPTY_DICT
  memoize();
  open_.push_back(Open{true, false, 0, 0, count});
}

void PickleWriter::end_list() {
  if (open_.empty() || open_.back().is_dict || open_.back().remaining != 0) {
    throw std::logic_error("PickleWriter: end_list without begin_list, or fewer items than announced");
  }
  open_.pop_back();
  after_value();
}

void PickleWriter::end_dict() {
  if (open_.empty() || !open_.back().is_dict || open_.back().remaining != 0) {
    throw std::logic_error("PickleWriter: end_dict without begin_dict, or fewer entries than announced");
  }
  open_.pop_back();
  after_value();
}

void PickleWriter::tuple2_ints(int64_t a, int64_t b) {
  before_value();
  // The two ints are written as a detached mini-sequence: park the container state so
  // they are not counted as items of the enclosing list/dict.
  std::vector<Open> saved;
  saved.swap(open_);
  integer(a);
  integer(b);
  open_.swap(saved);
  body_.push_back(static_cast<char>(0x86));  // TUPLE2
  memoize();
  after_value();
}

std::string PickleWriter::finish() {
  if (!open_.empty()) throw std::logic_error("PickleWriter: finish with open containers");
  body_.push_back('.');  // STOP
  frame_ends_.push_back(body_.size());
  std::string out;
  out.reserve(body_.size() + 9 * frame_ends_.size() + 2);
  out.push_back(static_cast<char>(0x80));  // PROTO 4
  out.push_back(4);
  size_t start = 0;
  for (size_t end : frame_ends_) {
    if (end == start) continue;
    out.push_back(static_cast<char>(0x95));  // FRAME
    put_le(out, end - start, 8);
    out.append(body_, start, end - start);
    start = end;
  }
  body_.clear();
  frame_ends_.clear();
  frame_start_ = 0;
  string_memo_.clear();
  memo_count_ = 0;
  return out;
}

}  // namespace memsim
