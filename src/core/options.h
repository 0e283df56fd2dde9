// The options machinery. Each component has a FooOptions struct with defaults that lists its
// fields once, in `template <class V> void visit(V& v)`, as v(key, member, help). Visitors turn
// that one list into TOML loading (unknown keys refused by name), --help text and the resolved
// config that every run directory and checkpoint carries.
//
// A section's check() throws tessera::Error naming "section.key" for values out of range.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

namespace tessera {

// Assigns fields from one TOML table (a config section). Keys absent from the table keep their
// current value; keys in the table that no field claims are reported by finish().
class TomlSectionReader {
 public:
  TomlSectionReader(const toml::table* table, std::string section, std::string source);

  void operator()(const char* key, int64_t& value, const char* help);
  void operator()(const char* key, double& value, const char* help);
  void operator()(const char* key, bool& value, const char* help);
  void operator()(const char* key, std::string& value, const char* help);
  void operator()(const char* key, std::vector<std::string>& value, const char* help);

  // Throws on the first key of the table that no field claimed, suggesting the closest known key.
  void finish() const;

 private:
  const toml::node* find(const char* key);
  [[noreturn]] void wrong_type(const char* key, const char* expected) const;

  const toml::table* table_;
  std::string section_;
  std::string source_;
  std::set<std::string> known_;
};

// Writes fields back as a TOML table (the resolved config).
class TomlSectionWriter {
 public:
  explicit TomlSectionWriter(toml::table& out) : out_(out) {}
  void operator()(const char* key, const int64_t& value, const char*) { out_.insert_or_assign(key, value); }
  void operator()(const char* key, const double& value, const char*) { out_.insert_or_assign(key, value); }
  void operator()(const char* key, const bool& value, const char*) { out_.insert_or_assign(key, value); }
  void operator()(const char* key, const std::string& value, const char*) { out_.insert_or_assign(key, value); }
  void operator()(const char* key, const std::vector<std::string>& value, const char*);

 private:
  toml::table& out_;
};

// One line per field: "  section.key = default   help".
class HelpWriter {
 public:
  HelpWriter(std::string section, std::string& out) : section_(std::move(section)), out_(out) {}
  void operator()(const char* key, const int64_t& value, const char* help);
  void operator()(const char* key, const double& value, const char* help);
  void operator()(const char* key, const bool& value, const char* help);
  void operator()(const char* key, const std::string& value, const char* help);
  void operator()(const char* key, const std::vector<std::string>& value, const char* help);

 private:
  void line(const char* key, const std::string& value, const char* help);
  std::string section_;
  std::string& out_;
};

// The known key closest to `key` by edit distance, or "" when none is close.
std::string closest_key(const std::string& key, const std::set<std::string>& known);

// Parses "section.key=value" (value in TOML syntax; bare words are taken as strings) and sets it
// in `root`, creating the section. Throws naming the argument when it is malformed.
void apply_override(toml::table& root, const std::string& assignment);

}  // namespace tessera
