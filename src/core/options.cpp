#include "core/options.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace tessera {

bool Range::contains(double value) const {
  const bool low = min_open ? value > min : value >= min;
  const bool high = max_open ? value < max : value <= max;
  return low && high;
}

std::string Range::describe() const {
  std::ostringstream s;
  s << (min_open ? "(" : "[") << min << ", " << max << (max_open ? ")" : "]");
  return s.str();
}

TomlSectionReader::TomlSectionReader(const toml::table* table, std::string section, std::string source)
    : table_(table), section_(std::move(section)), source_(std::move(source)) {}

const toml::node* TomlSectionReader::find(const char* key) {
  known_.insert(key);
  if (!table_) return nullptr;
  const toml::node* node = table_->get(key);
  if (node) assigned_.insert(key);
  return node;
}

void require_in_range(const std::string& source, const std::string& section, const char* key, double value,
                      const Range& range) {
  require(range.contains(value), source, ": ", section, ".", key, " = ", value, " is outside its range ",
          range.describe());
}

void TomlSectionReader::wrong_type(const char* key, const char* expected) const {
  fail(source_, ": ", section_, ".", key, " must be ", expected);
}

void TomlSectionReader::operator()(const char* key, int64_t& value, const char*, const Range& range) {
  const toml::node* node = find(key);
  if (!node) return;
  if (auto v = node->value_exact<int64_t>()) {
    value = *v;
  } else if (auto d = node->value_exact<double>(); d && std::isfinite(*d) && std::trunc(*d) == *d) {
    require_in_range(source_, section_, key, *d, range);  // before the cast: 1e30 does not fit an int64
    value = static_cast<int64_t>(*d);  // 1e6 written for a count
  } else {
    wrong_type(key, "an integer");
  }
}

void TomlSectionReader::operator()(const char* key, double& value, const char*, const Range& range) {
  const toml::node* node = find(key);
  if (!node) return;
  const auto v = node->value<double>();  // accepts integers too
  if (!v) wrong_type(key, "a number");
  // Every real-valued key reaches float32 arithmetic (optimizer, loss terms): a value that is not
  // finite, or that float32 would turn into inf or 0, trains into NaN or into nothing.
  const double magnitude = std::fabs(*v);
  require(std::isfinite(*v) && magnitude <= std::numeric_limits<float>::max() &&
              (magnitude == 0 || magnitude >= std::numeric_limits<float>::min()),
          source_, ": ", section_, ".", key, " = ", *v, " is not a finite number within float32's normal range (",
          std::numeric_limits<float>::min(), " to ", std::numeric_limits<float>::max(), ", or 0)");
  value = *v;
}

void TomlSectionReader::operator()(const char* key, bool& value, const char*) {
  const toml::node* node = find(key);
  if (!node) return;
  if (auto v = node->value_exact<bool>()) value = *v;
  else wrong_type(key, "true or false");
}

void TomlSectionReader::operator()(const char* key, std::string& value, const char*) {
  const toml::node* node = find(key);
  if (!node) return;
  if (auto v = node->value_exact<std::string>()) value = *v;
  else wrong_type(key, "a string");
}

void TomlSectionReader::operator()(const char* key, std::vector<std::string>& value, const char*) {
  const toml::node* node = find(key);
  if (!node) return;
  if (auto v = node->value_exact<std::string>()) {
    value = {*v};
    return;
  }
  const toml::array* array = node->as_array();
  if (!array) wrong_type(key, "a list of strings");
  value.clear();
  for (const toml::node& item : *array) {
    auto s = item.value_exact<std::string>();
    if (!s) wrong_type(key, "a list of strings");
    value.push_back(*s);
  }
}

void TomlSectionReader::finish() const {
  if (!table_) return;
  for (const auto& [key, node] : *table_) {
    std::string name(key.str());
    if (known_.count(name)) continue;
    std::string hint = closest_key(name, known_);
    fail(source_, ": unknown key '", section_, ".", name, "'",
         hint.empty() ? std::string() : " (did you mean '" + section_ + "." + hint + "'?)",
         "; `tessera train --help` lists every key");
  }
}

void TomlSectionReader::operator()(const char* key, std::vector<int64_t>& value, const char*) {
  const toml::node* node = find(key);
  if (!node) return;
  const toml::array* array = node->as_array();
  if (!array) wrong_type(key, "a list of integers");
  value.clear();
  for (const toml::node& item : *array) {
    auto n = item.value_exact<int64_t>();
    if (!n) wrong_type(key, "a list of integers");
    value.push_back(*n);
  }
}

void TomlSectionWriter::operator()(const char* key, const std::vector<int64_t>& value, const char*) {
  toml::array array;
  for (int64_t n : value) array.push_back(n);
  out_.insert_or_assign(key, std::move(array));
}

void TomlSectionWriter::operator()(const char* key, const std::vector<std::string>& value, const char*) {
  toml::array array;
  for (const auto& s : value) array.push_back(s);
  out_.insert_or_assign(key, std::move(array));
}

void HelpWriter::line(const char* key, const std::string& value, const char* help) {
  std::ostringstream s;
  std::string name = section_ + "." + key;
  s << "  " << std::left << std::setw(30) << name << " " << std::setw(14) << value << " " << help << "\n";
  out_ += s.str();
}
void HelpWriter::operator()(const char* key, const int64_t& value, const char* help, const Range& range) {
  line(key, std::to_string(value), (std::string(help) + " " + range.describe()).c_str());
}
void HelpWriter::operator()(const char* key, const double& value, const char* help, const Range& range) {
  std::ostringstream s;
  s << value;
  line(key, s.str(), (std::string(help) + " " + range.describe()).c_str());
}
void HelpWriter::operator()(const char* key, const bool& value, const char* help) {
  line(key, value ? "true" : "false", help);
}
void HelpWriter::operator()(const char* key, const std::string& value, const char* help) {
  line(key, "\"" + value + "\"", help);
}
void HelpWriter::operator()(const char* key, const std::vector<std::string>& value, const char* help) {
  std::string joined = "[";
  for (size_t i = 0; i < value.size(); ++i) joined += (i ? ", \"" : "\"") + value[i] + "\"";
  line(key, joined + "]", help);
}

void HelpWriter::operator()(const char* key, const std::vector<int64_t>& value, const char* help) {
  std::string joined = "[";
  for (size_t i = 0; i < value.size(); ++i) joined += (i ? ", " : "") + std::to_string(value[i]);
  line(key, joined + "]", help);
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string closest_key(const std::string& key, const std::set<std::string>& known) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, key.size() / 3) + 1;
  for (const auto& candidate : known) {
    size_t d = edit_distance(key, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

void apply_override(toml::table& root, const std::string& assignment) {
  size_t eq = assignment.find('=');
  size_t dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 || dot + 1 == eq)
    fail("--set ", assignment, ": expected section.key=value (e.g. train.steps=100)");
  std::string section = assignment.substr(0, dot);
  std::string key = assignment.substr(dot + 1, eq - dot - 1);
  std::string text = assignment.substr(eq + 1);
  if (text.find_first_of("\n\r") != std::string::npos)
    fail("--set ", section, ".", key, ": the value holds a line break; give one value per --set");
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", text}};  // a bare word: take it as a string
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* table = root.get(section)->as_table();
  if (!table) fail("--set ", assignment, ": '", section, "' is not a config section");
  table->insert_or_assign(key, *parsed.get("v"));
}

}  // namespace tessera
