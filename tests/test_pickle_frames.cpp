// PickleParseOptions::drop_items_of_key (allocator/snapshot/pickle.h): lists stored under
// the key keep their kind and length but no items, every item is still checked, other
// lists are untouched, and the snapshot reader (which drops 'frames') refuses a dropped
// list that is also a record list (a shared memo reference, which no real snapshot has).
#include <catch2/catch.hpp>

#include <string>

#include "allocator/snapshot/pickle.h"
#include "allocator/snapshot/snapshot.h"

using namespace memsim;

namespace {

template <size_t N>
std::string bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

PickleParseOptions drop_frames() {
  PickleParseOptions o;
  o.drop_items_of_key = "frames";
  return o;
}

std::string parse_error(const std::string& pickle, const PickleParseOptions& options) {
  try {
    parse_pickle(pickle, "<memory>", options);
  } catch (const PickleError& e) {
    return e.what();
  }
  return "(no error)";
}

// Protocol 2, by hand: {'x': [4, 5], 'frames': [1, 2, 3]} (frames last, as PyTorch writes
// a trace entry), and {'frames': [1, 2, 3], 'x': [4, 5]}.
const std::string kFramesLast = bytes(
    "\x80\x02}(X\x01\x00\x00\x00x](K\x04K\x05" "eX\x06\x00\x00\x00" "frames](K\x01K\x02K\x03" "eu.");
const std::string kFramesFirst = bytes(
    "\x80\x02}(X\x06\x00\x00\x00" "frames](K\x01K\x02K\x03" "eX\x01\x00\x00\x00x](K\x04K\x05" "eu.");

}  // namespace

TEST_CASE("Lists under the dropped key keep their length, not their items", "[pickle]") {
  PickleValue frames(nullptr, 0), x(nullptr, 0);
  const PickleDoc kept = parse_pickle(kFramesLast, "kept");
  REQUIRE(kept.root().find("frames", &frames));
  CHECK_FALSE(frames.items_dropped());
  REQUIRE(frames.size() == 3);
  CHECK(frames.item(2).as_int64() == 3);

  const PickleDoc dropped = parse_pickle(kFramesLast, "dropped", drop_frames());
  REQUIRE(dropped.root().size() == 2);
  REQUIRE(dropped.root().find("frames", &frames));
  CHECK(frames.kind() == PickleKind::list);
  CHECK(frames.items_dropped());
  CHECK(frames.size() == 3);
  REQUIRE(dropped.root().find("x", &x));
  CHECK_FALSE(x.items_dropped());
  REQUIRE(x.size() == 2);
  CHECK(x.item(0).as_int64() == 4);
  CHECK(x.item(1).as_int64() == 5);

  // A list whose slots are not the last ones (another list came after it) keeps its
  // items: giving them back would leave a hole, not shrink the array.
  const PickleDoc first = parse_pickle(kFramesFirst, "first", drop_frames());
  REQUIRE(first.root().find("frames", &frames));
  CHECK_FALSE(frames.items_dropped());
  REQUIRE(frames.size() == 3);
  CHECK(frames.item(0).as_int64() == 1);
  REQUIRE(first.root().find("x", &x));
  CHECK(x.item(1).as_int64() == 5);
}

TEST_CASE("Items of a dropped list are checked as any others", "[pickle]") {
  // {'frames': [{[]: 1}]}: an unhashable key inside a frame.
  const std::string unhashable = bytes("\x80\x02}(X\x06\x00\x00\x00" "frames](}(]K\x01ueu.");
  CHECK(parse_error(unhashable, drop_frames()) == "<memory>: byte 22: unhashable dict key of type list");
  CHECK(parse_error(unhashable, drop_frames()) == parse_error(unhashable, {}));
  // {'frames': L} where L is then APPENDed to through the memo: frozen, refused alike.
  const std::string mutated = bytes("\x80\x02}q\x00X\x06\x00\x00\x00" "framesq\x01]q\x02K\x01\x61sh\x02K\x02\x61.");
  CHECK(parse_error(mutated, drop_frames()) ==
        "<memory>: byte 29: APPEND on a container already inside another one");
  CHECK(parse_error(mutated, drop_frames()) == parse_error(mutated, {}));
}

TEST_CASE("A trace entry's frames list reused as a segment's blocks is refused", "[snapshot]") {
  // pickle.dumps(protocol=4) of {'device_traces': [[{..., 'frames': L}]],
  // 'segments': [{..., 'blocks': L}]} with L = [one valid block]: the pickler writes L
  // under 'frames' and refers to it from 'blocks'.
  const std::string shared = bytes(
      "\x80\x04\x95\x1e\x01\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f"
      "\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x7d\x94\x28\x8c\x06\x61\x63\x74\x69\x6f\x6e\x94"
      "\x8c\x05\x61\x6c\x6c\x6f\x63\x94\x8c\x04\x61\x64\x64\x72\x94\x4d\x00\x10\x8c\x04\x73\x69\x7a"
      "\x65\x94\x4d\x00\x02\x8c\x06\x73\x74\x72\x65\x61\x6d\x94\x4b\x00\x8c\x06\x66\x72\x61\x6d\x65"
      "\x73\x94\x5d\x94\x7d\x94\x28\x8c\x07\x61\x64\x64\x72\x65\x73\x73\x94\x4d\x00\x10\x68\x08\x4a"
      "\x00\x00\x20\x00\x8c\x0e\x72\x65\x71\x75\x65\x73\x74\x65\x64\x5f\x73\x69\x7a\x65\x94\x4b\x00"
      "\x8c\x05\x73\x74\x61\x74\x65\x94\x8c\x08\x69\x6e\x61\x63\x74\x69\x76\x65\x94\x68\x0a\x5d\x94"
      "\x75\x61\x75\x61\x61\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\x94\x5d\x94\x7d\x94\x28\x8c\x06"
      "\x64\x65\x76\x69\x63\x65\x94\x4b\x00\x68\x0d\x4d\x00\x10\x8c\x0a\x74\x6f\x74\x61\x6c\x5f\x73"
      "\x69\x7a\x65\x94\x4a\x00\x00\x20\x00\x8c\x0e\x61\x6c\x6c\x6f\x63\x61\x74\x65\x64\x5f\x73\x69"
      "\x7a\x65\x94\x4b\x00\x8c\x0b\x61\x63\x74\x69\x76\x65\x5f\x73\x69\x7a\x65\x94\x4b\x00\x68\x0e"
      "\x4b\x00\x68\x09\x4b\x00\x8c\x0c\x73\x65\x67\x6d\x65\x6e\x74\x5f\x74\x79\x70\x65\x94\x8c\x05"
      "\x73\x6d\x61\x6c\x6c\x94\x8c\x06\x62\x6c\x6f\x63\x6b\x73\x94\x68\x0b\x75\x61\x75\x2e");
  REQUIRE(shared.size() == 297);
  std::string error = "(no error)";
  try {
    read_snapshot_bytes(shared, "<memory>");
  } catch (const SnapshotError& e) {
    error = e.what();
  }
  CHECK(error == "<memory>: segments[0].blocks: the same object appears twice (shared memo reference)");
}
