// Byte counts as people read them, for logs and errors: "1.50 GiB" (binary units, two decimals).
#pragma once

#include <string>

namespace tessera {

std::string format_bytes(double bytes);

}  // namespace tessera
