#include "core/options.h"

#include <algorithm>
#include <cctype>
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
  if (!range.contains(value))  // the range's text built only for the message
    fail(source, ": ", section, ".", key, " = ", value, " is outside its range ", range.describe());
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

namespace {

// The length of the UTF-8 sequence starting at text[i] (1 for ASCII), or 0 when it is invalid
// (a stray continuation byte, a truncated or overlong sequence, a surrogate, past U+10FFFF).
size_t utf8_length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  const size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? (c <= 0xEF ? 3 : 0) : c >= 0xC2 ? 2 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  const unsigned char d = byte(i + 1);
  if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) || (c == 0xF0 && d < 0x90) || (c == 0xF4 && d > 0x8F))
    return 0;
  return n;
}

// The first place where `text` is not valid UTF-8 or holds a non-ASCII character outside a string
// or a comment: its byte offset and what is wrong; npos when there is none. `ascii` receives the
// text with every non-ASCII byte replaced by 'x'.
std::pair<size_t, const char*> unsafe_toml_byte(const std::string& text, std::string& ascii) {
  ascii = text;
  enum class In { code, comment, basic, literal, multi_basic, multi_literal } in = In::code;
  bool line_start = true;    // in code, nothing but whitespace yet on this line
  bool opens_string = true;  // in code, a quote here starts a string (a key's or a value's place)
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    if (n == 0) return {i, "invalid UTF-8"};
    if (n > 1 && in == In::code)
      return {i, "a non-ASCII character outside a string or a comment (TOML allows them there only)"};
    const char c = text[i];
    for (size_t k = 1; k < n; ++k) ascii[i] = ascii[i + k] = 'x';
    const auto starts = [&](const char* s) { return text.compare(i, std::char_traits<char>::length(s), s) == 0; };
    if ((in == In::basic || in == In::multi_basic) && c == '\\' && i + 1 < text.size() &&
        static_cast<unsigned char>(text[i + 1]) >= 0x80)
      return {i + 1, "a backslash before a non-ASCII character (TOML escapes are ASCII)"};
    switch (in) {
      case In::code:
        if (c == '[' && line_start) {  // a table header: toml++ asserts that a key starts it
          size_t k = i + 1 + (starts("[[") ? 1 : 0);
          while (k < text.size() && (text[k] == ' ' || text[k] == '\t')) ++k;
          const char first = k < text.size() ? text[k] : '\0';
          if (static_cast<unsigned char>(first) < 0x80 && !(std::isalnum(static_cast<unsigned char>(first)) ||
                first == '_' || first == '-' || first == '"' || first == '\'' || first == ']'))
            return {k, "a table header that does not start with a key"};
        }
        if (c == '#') {
          in = In::comment;
        } else if ((c == '"' || c == '\'') && opens_string) {  // a string starts only where a key or value does
          if (starts("\"\"\"")) in = In::multi_basic, i += 2;
          else if (starts("'''")) in = In::multi_literal, i += 2;
          else in = c == '"' ? In::basic : In::literal;
        }
        if (c != ' ' && c != '\t' && c != '\r') {
          line_start = c == '\n';
          opens_string = c == '\n' || c == '=' || c == '[' || c == ',' || c == '{' || c == '.';
        }
        break;
      case In::comment:
        if (c == '\n') in = In::code, line_start = opens_string = true;
        break;
      case In::basic:
        if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n' && static_cast<unsigned char>(text[i + 1]) < 0x80) ++i;
        else if (c == '"' || c == '\n') in = In::code, line_start = opens_string = c == '\n';
        break;
      case In::literal:
        if (c == '\'' || c == '\n') in = In::code, line_start = opens_string = c == '\n';
        break;
      case In::multi_basic:
        if (c == '\\' && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) < 0x80) ++i;
        else if (starts("\"\"\"")) in = In::code, opens_string = false, i += 2;
        break;
      case In::multi_literal:
        if (starts("'''")) in = In::code, opens_string = false, i += 2;
        break;
    }
    i += n;
  }
  return {std::string::npos, nullptr};
}

}  // namespace

toml::table parse_toml(const std::string& text, const std::string& source) {
  std::string ascii;
  const auto [at, what] = unsafe_toml_byte(text, ascii);
  if (what) {
    const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
    const size_t line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
    const size_t column = at - (line_start == std::string::npos || at == 0 ? 0 : line_start + 1) + 1;
    fail(source, ":", line, ":", column, ": TOML syntax error: ", what);
  }
  auto parse = [&](const std::string& t) {
    try {
      return toml::parse(t, source);
    } catch (const toml::parse_error& e) {
      const auto& where = e.source().begin;
      fail(source, ":", where.line, ":", where.column, ": TOML syntax error: ", e.description());
    }
  };
  // With non-ASCII characters, the ASCII copy first: once it parses, they are where the parser
  // reads them as strings and comments (the scan above can be wrong only about a text the parser
  // refuses).
  if (ascii != text) parse(ascii);
  return parse(text);
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
    parsed = parse_toml("v = " + text, "--set " + assignment);
  } catch (const Error&) {
    parsed = toml::table{{"v", text}};  // a bare word: take it as a string
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* table = root.get(section)->as_table();
  if (!table) fail("--set ", assignment, ": '", section, "' is not a config section");
  table->insert_or_assign(key, *parsed.get("v"));
}

}  // namespace tessera
