// A fuzz target for checking fuzz_replay itself (check_replay.sh), not a parser: an input that
// starts with byte 0xff traps, as a target's own check does, and one that starts with "{{" throws
// an exception no target may let escape. Built only into fuzz_replay (tests/fuzz/CMakeLists.txt).
#include <cstddef>
#include <cstdint>
#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 1 && data[0] == 0xff) __builtin_trap();
  if (size >= 2 && data[0] == '{' && data[1] == '{') throw std::logic_error("replay_check: an input starting with {{");
  return 0;
}
