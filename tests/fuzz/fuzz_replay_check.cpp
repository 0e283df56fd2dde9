// A fuzz target for checking fuzz_replay itself (check_replay.sh), not a parser: an input that
// starts with byte 0xff traps, as a target's own check does, one that starts with "segv" raises
// SIGSEGV, as a bad read would (AddressSanitizer reports it where the build has it), and one that
// starts with "{{" throws an exception no target may let escape. Built only into fuzz_replay
// (tests/fuzz/CMakeLists.txt).
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 1 && data[0] == 0xff) __builtin_trap();
  if (size >= 4 && std::memcmp(data, "segv", 4) == 0) std::raise(SIGSEGV);
  if (size >= 2 && data[0] == '{' && data[1] == '{') throw std::logic_error("replay_check: an input starting with {{");
  return 0;
}
