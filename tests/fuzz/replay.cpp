// fuzz_replay: runs tessera's fuzz targets (tests/fuzz/fuzz_<target>.cpp) without libFuzzer, in the
// build's own compiler and flags, as `make test` does (CTest fuzz.<target>; tests/fuzz/CMakeLists.txt):
// every input of the target's seed corpus, then mutants of them, a fixed sequence drawn from a seed
// (bit flips, interesting bytes, erased, inserted, duplicated and overwritten ranges, truncations,
// splices of two corpus inputs, numbers in text replaced by boundary values), up to --runs inputs or
// --seconds, whichever comes first. In the sanitized build (make test-sanitize) the same runs are
// checked by AddressSanitizer and UndefinedBehaviorSanitizer. libFuzzer's coverage-guided runs are
// `make fuzz`'s (tests/fuzz/run.sh, clang); this is their regression check, not a replacement.
//
// A target passes an input by returning; a crash, a trap (a target's own check), an abort or an
// exception escaping the target is a finding: the input is written to --findings (default
// ./fuzz-findings) as <target>-<n> and the command that replays it alone is printed.
//
//   usage: fuzz_replay TARGET PATH... [--runs N] [--seconds S] [--seed K] [--findings DIR]
//   PATH: a corpus folder (every file in it) or one input file; `fuzz_replay --list` names the targets.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "mutator.h"

using FuzzTarget = int (*)(const uint8_t*, size_t);

#define TESSERA_FUZZ_TARGET(name) extern "C" int tessera_fuzz_##name(const uint8_t*, size_t);
#include "fuzz_targets.inc"
#undef TESSERA_FUZZ_TARGET

namespace {

namespace fs = std::filesystem;

const std::map<std::string, FuzzTarget>& targets() {
  static const std::map<std::string, FuzzTarget> all = {
#define TESSERA_FUZZ_TARGET(name) {#name, &tessera_fuzz_##name},
#include "fuzz_targets.inc"
#undef TESSERA_FUZZ_TARGET
  };
  return all;
}

// What a crash handler needs, prepared before the runs (a handler may only write): the input being
// run, its index, and the text around them. Each run sets only `input` and `index`.
struct Current {
  const std::string* input = nullptr;
  int64_t index = 0;
  int64_t corpus_size = 0;
  std::string path_prefix;  // <findings>/<target>-, the index completes it
  std::string target, self;
};
Current current;

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void write_text(int fd, const char* text) { write_all(fd, text, strlen(text)); }

// Async-signal-safe: writes the current input to <findings>/<target>-<index> and says how to
// replay it.
void save_finding() {
  const std::string* input = current.input;
  if (input == nullptr) return;
  current.input = nullptr;
  char digits[24];
  char* number = digits + sizeof digits - 1;
  *number = '\0';
  int64_t n = current.index;
  do {
    *--number = static_cast<char>('0' + n % 10);
    n /= 10;
  } while (n > 0);
  char path[4096];
  const size_t prefix = std::min(current.path_prefix.size(), sizeof path - sizeof digits);
  memcpy(path, current.path_prefix.data(), prefix);
  memcpy(path + prefix, number, strlen(number) + 1);
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    write_all(fd, input->data(), input->size());
    close(fd);
  }
  for (const char* text : {"fuzz_replay: ", current.target.c_str(), " input ", static_cast<const char*>(number),
                           current.index < current.corpus_size ? " (corpus)" : " (mutant)", " failed; saved to ",
                           static_cast<const char*>(path), "\nreplay: ", current.self.c_str(), " ",
                           current.target.c_str(), " ", static_cast<const char*>(path), "\n"})
    write_text(2, text);
}

void on_fatal_signal(int signal) {
  save_finding();
  ::signal(signal, SIG_DFL);
  raise(signal);
}

}  // namespace

// AddressSanitizer and UndefinedBehaviorSanitizer end the process through their own exit, not a
// signal; in a sanitized build they call this back first (declared weak: absent elsewhere).
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

// UndefinedBehaviorSanitizer's hook, called on each of its reports before halt_on_error ends the
// process (its own runtime: the death callback above is AddressSanitizer's); a no-op elsewhere.
extern "C" void __ubsan_on_report() { save_finding(); }

namespace {

std::vector<std::string> read_inputs(const std::vector<std::string>& paths) {
  std::vector<fs::path> files;
  for (const std::string& path : paths) {
    if (fs::is_directory(path)) {
      for (const auto& entry : fs::directory_iterator(path))
        if (entry.is_regular_file()) files.push_back(entry.path());
    } else if (fs::is_regular_file(path)) {
      files.emplace_back(path);
    } else {
      throw std::runtime_error("no corpus folder or input file at '" + path + "'");
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> inputs;
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    inputs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return inputs;
}

// The scratch folders the targets made for this process (/tmp/tessera-fuzz-*-<pid>).
void remove_scratch() {
  const std::string suffix = "-" + std::to_string(getpid());
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator("/tmp", ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("tessera-fuzz-", 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      fs::remove_all(entry.path(), ignored);
  }
}

std::string exception_text(const std::exception_ptr& thrown) {
  try {
    std::rethrow_exception(thrown);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

int usage(const std::string& why) {
  std::cerr << "fuzz_replay: " << why << "\nusage: fuzz_replay TARGET PATH... [--runs N] [--seconds S] [--seed K]"
            << " [--findings DIR]\n       fuzz_replay --list\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && args[0] == "--list") {
    for (const auto& [name, function] : targets()) std::cout << name << "\n";
    return 0;
  }
  if (args.size() < 2) return usage("a target and a corpus are needed");
  const std::string target = args[0];
  const auto found = targets().find(target);
  if (found == targets().end()) return usage("no fuzz target '" + target + "' in this build (--list names them)");
  int64_t runs = 100000;
  double seconds = 0;
  uint64_t seed = 1;
  std::string findings = "fuzz-findings";
  std::vector<std::string> paths;
  for (size_t i = 1; i < args.size(); ++i) {
    const bool has_value = i + 1 < args.size();
    if (args[i] == "--runs" && has_value) runs = std::stoll(args[++i]);
    else if (args[i] == "--seconds" && has_value) seconds = std::stod(args[++i]);
    else if (args[i] == "--seed" && has_value) seed = std::stoull(args[++i]);
    else if (args[i] == "--findings" && has_value) findings = args[++i];
    else if (args[i].rfind("--", 0) == 0) return usage("unknown option '" + args[i] + "'");
    else paths.push_back(args[i]);
  }
  if (paths.empty()) return usage("a corpus folder or an input file is needed");

  const std::vector<std::string> corpus = read_inputs(paths);
  if (corpus.empty()) return usage("no inputs in " + paths[0]);
  fs::create_directories(findings);
  current.path_prefix = (fs::absolute(findings) / (target + "-")).string();
  current.target = target;
  current.self = fs::canonical("/proc/self/exe").string();
  current.corpus_size = static_cast<int64_t>(corpus.size());
  // Under AddressSanitizer its own handlers report SIGSEGV, SIGBUS and SIGFPE (with the stack) and
  // then call the death callback; traps and aborts are this program's to catch in every build.
  const bool sanitized = __sanitizer_set_death_callback != nullptr;
  if (sanitized) __sanitizer_set_death_callback(save_finding);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
    if (!sanitized || sig == SIGILL || sig == SIGABRT) signal(sig, on_fatal_signal);

  const FuzzTarget run = found->second;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  tessera::fuzz::Mutator mutator(corpus, seed ^ std::hash<std::string>{}(target));
  const int64_t corpus_size = current.corpus_size, total = std::max(runs, corpus_size);
  int64_t done = 0;
  std::string input;
  for (; done < total; ++done) {
    if (done >= corpus_size && seconds > 0 && elapsed() >= seconds) break;
    input = done < corpus_size ? corpus[done] : mutator.mutant(done);
    current.index = done;
    current.input = &input;
    try {
      run(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    } catch (...) {
      std::cerr << "fuzz_replay: an exception escaped the target: " << exception_text(std::current_exception()) << "\n";
      save_finding();
      remove_scratch();
      return 1;
    }
    current.input = nullptr;
  }
  remove_scratch();
  std::cout << "fuzz_replay " << target << ": " << corpus.size() << " corpus inputs and "
            << std::max<int64_t>(0, done - corpus_size) << " mutants passed in " << elapsed()
            << " s (seed " << seed << ")\n";
  return 0;
}
