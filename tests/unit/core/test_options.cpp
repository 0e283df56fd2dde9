#include <gtest/gtest.h>

#include "core/error.h"
#include "core/options.h"
#include "test_util.h"

namespace tessera {
namespace {

struct DemoOptions {
  int64_t steps = 10;
  double lr = 1e-3;
  bool flag = false;
  std::string name = "x";
  template <class V>
  void visit(V& v) {
    v("steps", steps, "steps", between(1, 100));
    v("lr", lr, "learning rate", above(0, 1));
    v("flag", flag, "a flag");
    v("name", name, "a name");
  }
};

DemoOptions load(const std::string& text) {
  toml::table root = toml::parse(text);
  DemoOptions o;
  TomlSectionReader reader(root["demo"].as_table(), "demo", "test.toml");
  o.visit(reader);
  reader.finish();
  return o;
}

TEST(Options, ReadsKnownKeysAndKeepsDefaults) {
  DemoOptions o = load("[demo]\nsteps = 5\nlr = 2\n");
  EXPECT_EQ(o.steps, 5);
  EXPECT_DOUBLE_EQ(o.lr, 2.0);
  EXPECT_EQ(o.name, "x");
}

TEST(Options, UnknownKeyIsRefusedByNameWithSuggestion) {
  try {
    load("[demo]\nstpes = 5\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("test.toml"), std::string::npos) << m;
    EXPECT_NE(m.find("demo.stpes"), std::string::npos) << m;
    EXPECT_NE(m.find("demo.steps"), std::string::npos) << m;
  }
}

TEST(Options, WrongTypeNamesTheKey) {
  try {
    load("[demo]\nsteps = \"many\"\n");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("demo.steps must be an integer"), std::string::npos) << e.what();
  }
}

TEST(Options, OverrideParsesTomlValuesAndBareWords) {
  toml::table root;
  apply_override(root, "demo.steps=7");
  apply_override(root, "demo.name=hello");
  apply_override(root, "demo.flag=true");
  TomlSectionReader reader(root["demo"].as_table(), "demo", "--set");
  DemoOptions o;
  o.visit(reader);
  EXPECT_EQ(o.steps, 7);
  EXPECT_EQ(o.name, "hello");
  EXPECT_TRUE(o.flag);
  EXPECT_THROW(apply_override(root, "nodot=1"), Error);
  EXPECT_THROW(apply_override(root, "demo.steps"), Error);
}

// TOML would read a second line as a further key (and a bare word would carry it into a path):
// a value holding a line break is refused instead of silently dropping the rest.
TEST(Options, OverrideWithALineBreakIsRefused) {
  toml::table root;
  EXPECT_TRUE(test::throws_naming([&] { apply_override(root, "demo.name=a\nb = 3"); }, {"--set demo.name", "line break"}));
  EXPECT_TRUE(test::throws_naming([&] { apply_override(root, "demo.steps=5\r"); }, {"--set demo.steps", "line break"}));
  EXPECT_FALSE(root.contains("demo"));
}

TEST(Options, RangesDescribeTheirEnds) {
  EXPECT_EQ(between(0, 1024).describe(), "[0, 1024]");
  EXPECT_EQ(above(0, 10).describe(), "(0, 10]");
  EXPECT_FALSE(above(0, 10).contains(0));
  EXPECT_TRUE(above(0, 10).contains(10));
  EXPECT_FALSE(fraction_below_one().contains(1));
  EXPECT_TRUE(fraction_below_one().contains(0));
}

TEST(Options, WriterRoundTrips) {
  DemoOptions o;
  o.steps = 3;
  o.name = "y";
  toml::table section;
  TomlSectionWriter writer(section);
  o.visit(writer);
  toml::table root;
  root.insert("demo", section);
  std::ostringstream s;
  s << root;
  DemoOptions back = load(s.str());
  EXPECT_EQ(back.steps, 3);
  EXPECT_EQ(back.name, "y");
}

}  // namespace
}  // namespace tessera

namespace tessera::test {
namespace {

// toml++ 3.3 asserts (and in a release build runs into undefined behaviour) on a non-ASCII byte
// where a key starts, or a table header that starts with something else than a key; parse_toml
// refuses such text before the parser sees it, naming the line and column, and passes non-ASCII
// text in strings and comments on (inputs found by tests/fuzz/fuzz_config.cpp).
TEST(Options, NonAsciiOutsideStringsAndInvalidUtf8AreNamedBeforeParsing) {
  const toml::table ok = parse_toml("# d\xc3\xa9j\xc3\xa0 vu\n[data]\npath = \"corpus/\xc3\xa9t\xc3\xa9\"\n"
                                    "note = '''\nna\xc3\xafve \"\"\" '''\ntag = \"\\\"\xe2\x82\xac\"\n", "ok.toml");
  EXPECT_EQ(ok["data"]["path"].value<std::string>(), "corpus/\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(ok["data"]["tag"].value<std::string>(), "\"\xe2\x82\xac");
  struct Bad {
    std::string text, says;
  };
  for (const Bad& b : std::vector<Bad>{{"[\xc3\xa9]\nx = 1\n", "bad.toml:1:2: TOML syntax error: a non-ASCII character"},
                                       {"[model]\npreset = \"tiny_moe\"\n[\x90\x9e\x8d\x95llel]\n", "bad.toml:3:2: TOML syntax error: invalid UTF-8"},
                                       {"x = \"\xed\xa0\x80\"\n", "bad.toml:1:6: TOML syntax error: invalid UTF-8"},
                                       {"x = 1 \xc3\xa9\n", "bad.toml:1:7: TOML syntax error: a non-ASCII"},
                                       {"x = \"a\nb\xc3\xa9 = 2\n", "bad.toml:2:2: TOML syntax error: a non-ASCII"},
                                       {"x = \"\"\"\\\xd0\xa3\"\"\"\n", "bad.toml:1:9: TOML syntax error: a backslash before a non-ASCII"},
                                       {"preset = 7i77\"=\"\xcd\x8d\"\n", "bad.toml:1:"},
                                       {"[`arallel]\n", "bad.toml:1:2: TOML syntax error: a table header that does not start"},
                                       {"a = 1\n  [[ =x]]\n", "bad.toml:2:6: TOML syntax error: a table header that does not start"},
                                       {"x = [1,\n", "bad.toml:1:9: TOML syntax error: Error while parsing array"}})
    EXPECT_TRUE(throws_naming([&] { parse_toml(b.text, "bad.toml"); }, {b.says})) << b.text;
  // An override's value with such a byte is a bare word, kept as a string.
  toml::table root;
  apply_override(root, "data.path=\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(root["data"]["path"].value<std::string>(), "\xc3\xa9t\xc3\xa9");
}

}  // namespace
}  // namespace tessera::test
