// Byte counts as people read them (byte_size.h).
#include "core/byte_size.h"

#include <cstdio>

namespace tessera {

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char out[32];
  std::snprintf(out, sizeof(out), "%.2f %s", bytes, units[u]);
  return out;
}

}  // namespace tessera
