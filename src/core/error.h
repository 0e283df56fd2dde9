// Errors that reach the user. Every message names what is wrong and where: the file, the
// config key, the rank. main() catches tessera::Error, prints its message alone and exits 2;
// anything else escaping is a bug and prints as "internal error".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Builds a message from streamable parts: fail("data.path: ", p, " does not exist").
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  throw Error(out.str());
}

template <class... Parts>
void require(bool condition, const Parts&... parts) {
  if (!condition) fail(parts...);
}

}  // namespace tessera
