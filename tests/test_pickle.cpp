// The pickle reader/writer on their own: values CPython wrote, the writer's output read
// back, and hostile inputs (each must end in a PickleError/SnapshotError, never a crash,
// hang or huge allocation; run under -DMEMSIM_SANITIZE=ON to check the "never crash").
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "allocator/snapshot/pickle.h"
#include "allocator/snapshot/snapshot.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// String literals with embedded NULs.
template <size_t N>
std::string bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string parse_error(const std::string& pickle) {
  try {
    parse_pickle(pickle, "<memory>");
  } catch (const PickleError& e) {
    return e.what();
  }
  return "(no error)";
}

// pickle.dumps({'a': [1, 2**40, -1, -2**40, 3.5, None, True, False, 'xyz', (0, 0), 2**63,
//               2**64-1, -2**63, 255, 65535, 65536, -129], 'b': {}, 'ü': 'é'}, protocol=N)
const std::string kProto4 = bytes(
    "\x80\x04\x95\x7b\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x01\x61\x94\x5d\x94\x28\x4b\x01"
    "\x8a\x06\x00\x00\x00\x00\x00\x01\x4a\xff\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\xff\x47\x40"
    "\x0c\x00\x00\x00\x00\x00\x00\x4e\x88\x89\x8c\x03\x78\x79\x7a\x94\x4b\x00\x4b\x00\x86\x94\x8a"
    "\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00\x8a\x08"
    "\x00\x00\x00\x00\x00\x00\x00\x80\x4b\xff\x4d\xff\xff\x4a\x00\x00\x01\x00\x4a\x7f\xff\xff\xff"
    "\x65\x8c\x01\x62\x94\x7d\x94\x8c\x02\xc3\xbc\x94\x8c\x02\xc3\xa9\x94\x75\x2e");
const std::string kProto2 = bytes(
    "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x28\x4b\x01\x8a\x06\x00"
    "\x00\x00\x00\x00\x01\x4a\xff\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\xff\x47\x40\x0c\x00\x00"
    "\x00\x00\x00\x00\x4e\x88\x89\x58\x03\x00\x00\x00\x78\x79\x7a\x71\x03\x4b\x00\x4b\x00\x86\x71"
    "\x04\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00"
    "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x4b\xff\x4d\xff\xff\x4a\x00\x00\x01\x00\x4a\x7f\xff"
    "\xff\xff\x65\x58\x01\x00\x00\x00\x62\x71\x05\x7d\x71\x06\x58\x02\x00\x00\x00\xc3\xbc\x71\x07"
    "\x58\x02\x00\x00\x00\xc3\xa9\x71\x08\x75\x2e");

void check_reference_value(const PickleDoc& doc) {
  const PickleValue root = doc.root();
  REQUIRE(root.kind() == PickleKind::dict);
  REQUIRE(root.size() == 3);
  CHECK(root.key(0).as_string() == "a");
  CHECK(root.key(2).as_string() == "\xc3\xbc");
  PickleValue a(nullptr, 0), v(nullptr, 0);
  REQUIRE(root.find("a", &a));
  REQUIRE(a.kind() == PickleKind::list);
  REQUIRE(a.size() == 17);
  CHECK(a.item(0).as_int64() == 1);
  CHECK(a.item(1).as_int64() == (int64_t{1} << 40));
  CHECK(a.item(2).as_int64() == -1);
  CHECK(a.item(3).as_int64() == -(int64_t{1} << 40));
  CHECK(a.item(4).kind() == PickleKind::float64);
  CHECK(a.item(4).as_double() == 3.5);
  CHECK(a.item(5).is_none());
  CHECK(a.item(6).as_bool());
  CHECK_FALSE(a.item(7).as_bool());
  CHECK(a.item(8).as_string() == "xyz");
  REQUIRE(a.item(9).kind() == PickleKind::tuple);
  CHECK(a.item(9).size() == 2);
  CHECK(a.item(10).kind() == PickleKind::uint64);
  CHECK(a.item(10).as_uint64() == (uint64_t{1} << 63));
  CHECK(a.item(11).as_uint64() == UINT64_MAX);
  CHECK(a.item(12).as_int64() == INT64_MIN);
  CHECK(a.item(13).as_int64() == 255);
  CHECK(a.item(14).as_int64() == 65535);
  CHECK(a.item(15).as_int64() == 65536);
  CHECK(a.item(16).as_int64() == -129);
  REQUIRE(root.find("b", &v));
  CHECK(v.kind() == PickleKind::dict);
  CHECK(v.size() == 0);
  REQUIRE(root.find("\xc3\xbc", &v));
  CHECK(v.as_string() == "\xc3\xa9");
  CHECK_FALSE(root.find("missing", &v));
}

}  // namespace

TEST_CASE("Pickle reader reads what CPython writes, protocols 4 and 2", "[pickle]") {
  const PickleDoc p4 = parse_pickle(kProto4, "p4");
  CHECK(p4.protocol() == 4);
  check_reference_value(p4);
  const PickleDoc p2 = parse_pickle(kProto2, "p2");
  CHECK(p2.protocol() == 2);
  check_reference_value(p2);
}

TEST_CASE("Pickle reader keeps ints wider than 64 bits as big_int", "[pickle]") {
  // pickle.dumps([2**64, -2**63 - 1], protocol=4)
  const PickleDoc doc = parse_pickle(bytes("\x80\x04\x95\x1b\x00\x00\x00\x00\x00\x00\x00\x5d\x94\x28\x8a\x09"
                                           "\x00\x00\x00\x00\x00\x00\x00\x00\x01\x8a\x09\xff\xff\xff\xff"
                                           "\xff\xff\xff\x7f\xff\x65\x2e"),
                                     "big");
  REQUIRE(doc.root().size() == 2);
  CHECK(doc.root().item(0).kind() == PickleKind::big_int);
  CHECK(doc.root().item(1).kind() == PickleKind::big_int);
}

TEST_CASE("Pickle writer output reads back, and memo, batches and frames", "[pickle]") {
  PickleWriter w;
  w.begin_dict(3);
  w.string("ints");
  w.begin_list(2500);  // three APPENDS batches: 1000, 1000, 500
  for (int64_t i = 0; i < 2500; ++i) w.integer(i * i * i * 1000003 - 7);
  w.end_list();
  w.string("one");
  w.begin_list(1);  // a one-item batch: APPEND without MARK
  w.unsigned_integer(UINT64_MAX);
  w.end_list();
  w.string("mixed");
  w.begin_list(7);
  w.none();
  w.boolean(true);
  w.real(-0.25);
  w.string(std::string(70000, 'q'));  // BINUNICODE, and forces a second frame
  w.string("ints");                   // memoized: BINGET
  w.tuple2_ints(0, 0);
  w.integer(INT64_MIN);
  w.end_list();
  w.end_dict();
  const std::string out = w.finish();

  CHECK(static_cast<unsigned char>(out[0]) == 0x80);
  CHECK(out[1] == 4);
  const PickleDoc doc = parse_pickle(out, "written");
  PickleValue v(nullptr, 0);
  REQUIRE(doc.root().find("ints", &v));
  REQUIRE(v.size() == 2500);
  for (int64_t i = 0; i < 2500; ++i) REQUIRE(v.item(i).as_int64() == i * i * i * 1000003 - 7);
  REQUIRE(doc.root().find("one", &v));
  REQUIRE(v.size() == 1);
  CHECK(v.item(0).as_uint64() == UINT64_MAX);
  REQUIRE(doc.root().find("mixed", &v));
  REQUIRE(v.size() == 7);
  CHECK(v.item(0).is_none());
  CHECK(v.item(1).as_bool());
  CHECK(v.item(2).as_double() == -0.25);
  CHECK(v.item(3).as_string().size() == 70000);
  CHECK(v.item(4).as_string() == "ints");
  CHECK(v.item(5).kind() == PickleKind::tuple);
  CHECK(v.item(6).as_int64() == INT64_MIN);
}

TEST_CASE("Pickle writer rejects miscounted containers", "[pickle]") {
  PickleWriter w;
  w.begin_list(2);
  w.integer(1);
  CHECK_THROWS_AS(w.end_list(), std::logic_error);
  PickleWriter w2;
  w2.begin_list(0);
  CHECK_THROWS_AS(w2.integer(1), std::logic_error);
}

TEST_CASE("Pickle reader error messages name the byte and the problem", "[pickle]") {
  CHECK(parse_error(bytes("\x80\x04\xff")) == "<memory>: byte 2: unknown opcode 0xff");
  CHECK(parse_error(bytes("\x80\x04\x8c\x05" "ab")) ==
        "<memory>: byte 2: truncated SHORT_BINUNICODE (needs 5 bytes, 2 left)");
  CHECK(parse_error(bytes("\x80\x04")) == "<memory>: byte 2: truncated pickle: no STOP opcode");
  CHECK(parse_error(bytes("\x80\x06N.")) == "<memory>: byte 0: unsupported pickle protocol 6");
  // pickle.dumps(collections.OrderedDict) starts with a GLOBAL-like import: refused.
  CHECK(parse_error(bytes("\x80\x02" "ccollections\nOrderedDict\n.")).find("opcode GLOBAL (0x63) builds Python objects") !=
        std::string::npos);
  CHECK(parse_error(bytes("\x80\x04\x8c\x01" "a\x94\x8c\x01" "b\x93.")).find("STACK_GLOBAL") != std::string::npos);
  CHECK(parse_error(bytes("\x80\x04NR.")).find("REDUCE") != std::string::npos);
  CHECK(parse_error(bytes("\x80\x04Nb.")).find("BUILD") != std::string::npos);
  CHECK(parse_error(bytes("\x80\x04I1\n.")).find("text opcode") != std::string::npos);
}

TEST_CASE("Pickle reader rejects hostile structure", "[pickle]") {
  SECTION("huge declared lengths") {
    CHECK(parse_error(bytes("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f.")).find("truncated BINUNICODE8") !=
          std::string::npos);
    CHECK(parse_error(bytes("\x80\x04X\xff\xff\xff\xff.")).find("truncated BINUNICODE") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04\x8b\xff\xff\xff\x7f.")).find("truncated LONG4") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04\x8b\xff\xff\xff\xff.")).find("negative length") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xffN.")).find("truncated FRAME") !=
          std::string::npos);
    CHECK(parse_error(bytes("\x80\x04\x8e\x00\x00\x00\x00\x00\x00\x00\x80.")).find("truncated BINBYTES8") !=
          std::string::npos);
  }
  SECTION("memo") {
    CHECK(parse_error(bytes("\x80\x04h\x00.")) == "<memory>: byte 2: memo index 0 is not defined");
    CHECK(parse_error(bytes("\x80\x04j\xff\xff\xff\xff.")).find("memo index 4294967295") != std::string::npos);
    // A far-away LONG_BINPUT is kept sparsely (no 16 GiB table) and can be read back.
    const PickleDoc doc = parse_pickle(bytes("\x80\x04Nr\xfe\xff\xff\xff" "0j\xfe\xff\xff\xff."), "sparse");
    CHECK(doc.root().is_none());
  }
  SECTION("stack and marks") {
    CHECK(parse_error(bytes("\x80\x04" "a.")).find("stack underflow in APPEND") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04(e.")).find("stack underflow in APPENDS") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04]((ee.")).find("stack underflow in APPENDS") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04u.")).find("SETITEMS without a MARK") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04}(Nu.")).find("odd number") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04N\x86.")).find("stack underflow in TUPLE2") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04NN.")).find("STOP with 2 items") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04.")).find("STOP with 0 items") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04(N.")).find("open MARKs") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04NNa.")).find("APPEND on a None") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04}]]s.")).find("unhashable dict key of type list") != std::string::npos);
  }
  SECTION("cycles are impossible") {
    // L = []; L.append(L)
    CHECK(parse_error(bytes("\x80\x04]\x94(h\x00" "e.")).find("cannot contain itself") != std::string::npos);
    // A = []; B = []; A.append(B); B.append(A): B is frozen once inside A.
    CHECK(parse_error(bytes("\x80\x04]\x94]\x94" "ah\x01h\x00" "a0.")).find("already inside another") !=
          std::string::npos);
  }
  SECTION("deep nesting is capped without recursion") {
    // 1e6 nested lists: EMPTY_LIST x 1e6, then APPEND x (1e6 - 1).
    std::string deep = bytes("\x80\x04");
    deep.append(1000000, ']');
    deep.append(999999, 'a');
    deep += '.';
    CHECK(parse_error(deep).find("nesting deeper than 1000") != std::string::npos);
    // 1000 levels are fine.
    std::string ok = bytes("\x80\x04");
    ok.append(1000, ']');
    ok.append(999, 'a');
    ok += '.';
    CHECK(parse_pickle(ok, "ok").root().kind() == PickleKind::list);
  }
  SECTION("invalid UTF-8 in str") {
    CHECK(parse_error(bytes("\x80\x04\x8c\x02\xc3\x28.")).find("not valid UTF-8") != std::string::npos);
    CHECK(parse_error(bytes("\x80\x04\x8c\x02\xc0\x80.")).find("not valid UTF-8") != std::string::npos);
  }
  SECTION("a new FRAME inside a frame") {
    CHECK(parse_error(bytes("\x80\x04\x95\x0a\x00\x00\x00\x00\x00\x00\x00\x95\x01\x00\x00\x00\x00\x00\x00\x00N."))
              .find("FRAME before the end") != std::string::npos);
  }
}

// Inputs the fuzzer (tools/fuzz/fuzz_snapshot_reader.cpp) found or that were hand-made
// as its seeds. Each must be rejected with a SnapshotError (or parse, for seeds named
// *.ok.pickle); a crash here is a regression.
TEST_CASE("Fuzzer regression inputs are rejected cleanly", "[pickle]") {
  const std::filesystem::path dir = MEMSIM_SOURCE_DIR + "/tests/data/fuzz";
  REQUIRE(std::filesystem::is_directory(dir));
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    const std::string data = slurp(entry.path().string());
    INFO(name);
    ++files;
    if (name.size() > 10 && name.substr(name.size() - 10) == ".ok.pickle") {
      CHECK_NOTHROW(read_snapshot_bytes(data, name));
    } else {
      CHECK_THROWS_AS(read_snapshot_bytes(data, name), SnapshotError);
    }
  }
  CHECK(files > 0);
}
