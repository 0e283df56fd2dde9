// `tessera peer` processes for the swarm's end-to-end tests (test_swarm.cpp) and its fault cells
// (test_swarm_faults.cpp): a peer started in the background and read through its log and
// metrics, and a fixture with a fresh swarm key and small-swarm settings.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <deque>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace tessera::test {

// A peer started in the background; its output in DIR.log.
struct Peer {
  std::string dir;
  pid_t pid = -1;
  std::string log() const { return slurp(dir + ".log"); }
  // The HOST:PORT it printed ("... listening on HOST:PORT").
  std::string address() const {
    std::smatch m;
    const std::string text = log();
    return std::regex_search(text, m, std::regex("listening on (127\\.0\\.0\\.1:[0-9]+)")) ? m[1].str() : "";
  }
  // The newest metrics line's swarm fields (null before the first).
  nlohmann::json swarm() const {
    nlohmann::json last;
    std::istringstream in(slurp(dir + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("swarm")) last = j["swarm"];
    }
    return last;
  }
  int64_t swarm_step() const {
    const nlohmann::json s = swarm();
    return s.is_null() ? -1 : s["swarm_step"].get<int64_t>();
  }
  void kill(int signal) const { ::kill(pid, signal); }
  int wait() const {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
};

class SwarmFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fresh_dir("swarm");
    key_ = root_ + "/swarm.key";
    ASSERT_EQ(run_tessera("swarm keygen --out " + key_).exit_code, 0);
  }
  void TearDown() override {
    for (const Peer& p : peers_)
      if (::kill(p.pid, 0) == 0) {
        p.kill(SIGKILL);
        p.wait();
      }
  }
  // Settings of a small swarm: rounds of 3 peers x 8 sequences, short record lifetimes and round
  // deadlines so dead peers are noticed within seconds.
  std::string settings(int64_t steps, const std::string& key) const {
    return " --config tiny_gpt" + tiny_settings(prepared_corpus()) + " --set train.steps=" + std::to_string(steps) +
           " --set swarm.key_file=" + key + " --set swarm.target_batch_size=24 --set swarm.record_ttl_s=2"
           " --set swarm.publish_interval_s=0.2 --set swarm.round_timeout_min_s=1 --set swarm.round_timeout_max_s=8"
           " --set eval.every=1000 --set checkpoint.every=5";
  }
  // `env`: added to the peer's environment (TESSERA_FAULT for the fault matrix).
  Peer& start(const std::string& name, const std::string& args, const std::string& initial = "",
              const std::map<std::string, std::string>& env = {}) {
    Peer p;
    p.dir = root_ + "/" + name;
    ChildSpec spec;
    spec.argv = {kTesseraBinary, "peer", "--swarm", "demo", "--listen", "127.0.0.1:0", "--out", p.dir};
    std::istringstream words(args + (initial.empty() ? "" : " --initial-peer " + initial));
    for (std::string word; words >> word;) spec.argv.push_back(word);
    spec.env = env;
    spec.output_file = p.dir + ".log";
    p.pid = spawn(spec);
    peers_.push_back(p);
    Peer& added = peers_.back();
    EXPECT_TRUE(wait_until([&] { return !added.address().empty(); }, 60)) << added.log();
    return added;
  }
  // Waits until `p` has taken `rounds` more swarm steps than `from`.
  static bool advances(const Peer& p, int64_t from, int64_t rounds, double seconds = 90) {
    return wait_until([&] { return p.swarm_step() >= from + rounds; }, seconds);
  }
  static void expect_accounted(const Peer& p) {
    const nlohmann::json s = p.swarm();
    ASSERT_FALSE(s.is_null()) << p.log();
    EXPECT_EQ(s["samples_processed"].get<int64_t>(),
              s["samples_contributed"].get<int64_t>() + s["samples_dropped"].get<int64_t>() +
                  s["samples_accumulated"].get<int64_t>())
        << s.dump();
  }

  std::string root_, key_;
  std::deque<Peer> peers_;
};

}  // namespace tessera::test
