// The options machinery. Each component has a FooOptions struct with defaults that lists its
// fields once, in `template <class V> void visit(V& v)`, as v(key, member, help), and for a
// number v(key, member, help, range). Visitors turn that one list into TOML loading (unknown keys
// refused by name, numbers outside their range refused by name), --help text and the resolved
// config that every run directory and checkpoint carries.
//
// Every integer and real key has a Range: the visitors have no numeric overload without one, so a
// key cannot be added without deciding which values it accepts. Upper bounds are generous (far
// beyond any real run) but finite: they turn a typo like threads = 600 or n_embd = 1e9 into an
// error naming the key instead of a hang or an allocation failure minutes later. A section's
// check() adds what one key's range cannot say (n_embd a multiple of n_head, named choices).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

namespace tessera {

// The values a numeric key accepts: [min, max], with either end open when marked.
struct Range {
  double min;
  double max;
  bool min_open = false;
  bool max_open = false;

  bool contains(double value) const;
  std::string describe() const;  // "[0, 1024]", "(0, 10]"
};
inline Range between(double min, double max) { return {min, max, false, false}; }
inline Range above(double min, double max) { return {min, max, true, false}; }       // (min, max]
inline Range fraction_below_one() { return {0, 1, false, true}; }                     // [0, 1)

// Throws "<source>: section.key = value is outside its range [min, max]".
void require_in_range(const std::string& source, const std::string& section, const char* key, double value,
                      const Range& range);

// Checks every numeric field of a section against its range; each section's check() starts with
// check_ranges(*this, "section", source), so options built in code are held to the same ranges as
// options read from a file.
class RangeChecker {
 public:
  RangeChecker(std::string section, std::string source) : section_(std::move(section)), source_(std::move(source)) {}
  void operator()(const char* key, const int64_t& value, const char*, const Range& range) {
    require_in_range(source_, section_, key, static_cast<double>(value), range);
  }
  void operator()(const char* key, const double& value, const char*, const Range& range) {
    require_in_range(source_, section_, key, value, range);
  }
  template <class T>
  void operator()(const char*, const T&, const char*) {}

 private:
  std::string section_;
  std::string source_;
};

template <class Options>
void check_ranges(const Options& options, const char* section, const std::string& source) {
  Options copy = options;  // visit() hands out mutable references
  RangeChecker checker(section, source);
  copy.visit(checker);
}

// Assigns fields from one TOML table (a config section). Keys absent from the table keep their
// current value; keys in the table that no field claims are reported by finish().
class TomlSectionReader {
 public:
  TomlSectionReader(const toml::table* table, std::string section, std::string source);

  void operator()(const char* key, int64_t& value, const char* help, const Range& range);
  void operator()(const char* key, double& value, const char* help, const Range& range);
  void operator()(const char* key, bool& value, const char* help);
  void operator()(const char* key, std::string& value, const char* help);
  void operator()(const char* key, std::vector<std::string>& value, const char* help);
  void operator()(const char* key, std::vector<int64_t>& value, const char* help);

  // The keys this table set (for the resolved config's value sources).
  const std::set<std::string>& assigned() const { return assigned_; }

  // Throws on the first key of the table that no field claimed, suggesting the closest known key.
  void finish() const;

 private:
  const toml::node* find(const char* key);
  [[noreturn]] void wrong_type(const char* key, const char* expected) const;

  const toml::table* table_;
  std::string section_;
  std::string source_;
  std::set<std::string> known_;
  std::set<std::string> assigned_;
};

// Writes fields back as a TOML table (the resolved config).
class TomlSectionWriter {
 public:
  explicit TomlSectionWriter(toml::table& out) : out_(out) {}
  void operator()(const char* key, const int64_t& value, const char*, const Range&) { out_.insert_or_assign(key, value); }
  void operator()(const char* key, const double& value, const char*, const Range&) { out_.insert_or_assign(key, value); }
  void operator()(const char* key, const bool& value, const char*) { out_.insert_or_assign(key, value); }
  void operator()(const char* key, const std::string& value, const char*) { out_.insert_or_assign(key, value); }
  void operator()(const char* key, const std::vector<std::string>& value, const char*);
  void operator()(const char* key, const std::vector<int64_t>& value, const char*);

 private:
  toml::table& out_;
};

// One line per field: "  section.key   default   help [range]".
class HelpWriter {
 public:
  HelpWriter(std::string section, std::string& out) : section_(std::move(section)), out_(out) {}
  void operator()(const char* key, const int64_t& value, const char* help, const Range& range);
  void operator()(const char* key, const double& value, const char* help, const Range& range);
  void operator()(const char* key, const bool& value, const char* help);
  void operator()(const char* key, const std::string& value, const char* help);
  void operator()(const char* key, const std::vector<std::string>& value, const char* help);
  void operator()(const char* key, const std::vector<int64_t>& value, const char* help);

 private:
  void line(const char* key, const std::string& value, const char* help);
  std::string section_;
  std::string& out_;
};

// The known key closest to `key` by edit distance, or "" when none is close.
std::string closest_key(const std::string& key, const std::set<std::string>& known);

// `text` parsed as TOML, or tessera::Error naming `source`, the line and the column. The text is
// checked first, so the parser (toml++) only sees what it handles safely: valid UTF-8, and
// non-ASCII characters only inside strings and comments, where TOML allows them, and a key at the
// start of every table header (toml++ 3.3 reaches an assertion, and in a release build undefined
// behaviour, on a non-ASCII byte where a key starts or a header that starts with another character:
// found by fuzzing, tests/fuzz/fuzz_config.cpp).
toml::table parse_toml(const std::string& text, const std::string& source);

// Parses "section.key=value" (value in TOML syntax; bare words are taken as strings) and sets it
// in `root`, creating the section. Throws naming the argument when it is malformed, or when the
// value holds a line break (TOML would read the rest as further keys, or a bare word would carry
// it into a path).
void apply_override(toml::table& root, const std::string& assignment);

}  // namespace tessera
