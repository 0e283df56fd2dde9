// Runs the tessera binary for end-to-end tests, and prepares a small data directory once per
// test process.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/subprocess.h"
#include "test_util.h"

namespace tessera::test {

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// A shell command line, its stderr joined to its stdout.
inline CommandResult run_command(const std::string& command_line) {
  const std::string command = command_line + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// `env` is prepended to the command line (e.g. "RANK=1 WORLD_SIZE=2").
inline CommandResult run_tessera_env(const std::string& env, const std::string& args) {
  return run_command(env + " " + std::string(kTesseraBinary) + " " + args);
}

inline CommandResult run_tessera(const std::string& args) { return run_tessera_env("", args); }

// `tessera ARGS` started in the background (through `sh -c exec`, so the pid is tessera's own),
// its output in `output_file`.
inline pid_t spawn_tessera(const std::string& args, const std::string& output_file) {
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", "exec " + std::string(kTesseraBinary) + " " + args};
  spec.output_file = output_file;
  return spawn(spec);
}

// Polls `done` every 50 ms for up to `seconds`; whether it became true.
inline bool wait_until(const std::function<bool()>& done, double seconds) {
  for (int i = 0; i < static_cast<int>(seconds * 20); ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

// The bundled corpus prepared with the byte tokenizer (once per process).
inline const std::string& prepared_corpus() {
  static std::string dir = [] {
    std::string out = fresh_dir("corpus");
    auto r = run_tessera("prepare --input " + source_path("data/kjv/genesis_to_ruth.txt") + " --out " + out);
    if (r.exit_code != 0) throw std::runtime_error("prepare failed: " + r.output);
    return out;
  }();
  return dir;
}

// Settings for a model small enough to train a dozen steps in about a second.
inline std::string tiny_settings(const std::string& data_dir) {
  return " --set data.path=" + data_dir +
         " --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2 --set model.block_size=32"
         " --set train.batch_size=4 --set train.seq_len=32 --set train.log_every=1 --set train.threads=1"
         " --set eval.batches=2 --set optim.warmup_steps=2";
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The lines of RUN_DIR/metrics.jsonl, parsed.
inline std::vector<nlohmann::json> metrics_lines(const std::string& run_dir) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(slurp(run_dir + "/metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// Expects exit code 2 and every `needle` in the message. A `train` without --out or --resume gets
// a run directory of its own (cases run in parallel, and each run locks its directory).
inline void expect_error(const std::string& args, std::initializer_list<std::string> needles) {
  static int runs = 0;
  const bool own_dir = args.rfind("train ", 0) == 0 && args.find("--out") == std::string::npos &&
                       args.find("--resume") == std::string::npos;
  auto r = run_tessera(args + (own_dir ? " --out " + fresh_dir("bad_input_run_" + std::to_string(runs++)) : ""));
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  for (const auto& needle : needles) EXPECT_NE(r.output.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << r.output;
}

}  // namespace tessera::test
