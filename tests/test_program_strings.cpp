// Program::intern (program/program.h): one index per distinct string, "" at 0, str()
// gives the text back; the index survives the table growing, copies and clear().
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "program/program.h"

using namespace memsim;

TEST_CASE("Program::intern gives one index per distinct string", "[program]") {
  Program p;
  CHECK(p.intern("") == 0);
  CHECK(p.str(0).empty());
  std::vector<std::string> texts;
  for (int i = 0; i < 1000; ++i)  // past several doublings of the table
    texts.push_back(i % 3 == 0 ? "model.layers." + std::to_string(i) + ".mlp.up_proj.weight"
                               : std::to_string(i));
  std::vector<uint32_t> ids;
  for (const std::string& t : texts) ids.push_back(p.intern(t));
  for (size_t i = 0; i < texts.size(); ++i) {
    CHECK(ids[i] == i + 1);  // dense, in order of first use
    CHECK(p.str(ids[i]) == texts[i]);
    CHECK(p.intern(texts[i]) == ids[i]);  // again: the same index, nothing added
  }
  CHECK(p.intern("") == 0);

  // A copy has its own table: it finds what the original had, and grows on its own.
  Program copy = p;
  CHECK(copy.intern(texts[500]) == ids[500]);
  const uint32_t extra = copy.intern("only in the copy");
  CHECK(extra == texts.size() + 1);
  CHECK(p.intern("only in the original") == texts.size() + 1);
  CHECK(copy.str(extra) == "only in the copy");

  // clear(): a new Program's indices again.
  p.clear();
  CHECK(p.intern("") == 0);
  CHECK(p.intern(texts[7]) == 1);
  CHECK(p.intern(texts[3]) == 2);
  CHECK(p.intern(texts[7]) == 1);
  CHECK(p.str(2) == texts[3]);
}
