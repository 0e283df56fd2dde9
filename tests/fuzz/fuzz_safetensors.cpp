// libFuzzer target: the safetensors reader (checkpoint/safetensors.h) on arbitrary bytes. Every
// input must either read or end in tessera::Error; anything else (a crash, a sanitizer report, an
// allocation past the input's size, another exception type) is a finding. Built and run by
// tests/fuzz/run.sh with clang's -fsanitize=fuzzer,address,undefined.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "checkpoint/safetensors.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    tessera::read_safetensors(in, "fuzz.safetensors");
  } catch (const tessera::Error&) {
  }
  return 0;
}
