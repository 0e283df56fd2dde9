// `tessera peer`: one peer of an ATOM swarm (atom/swarm.h), training with its run directory as
// `tessera train` does (config.toml, metrics.jsonl, train.log, checkpoints/, the run lock), and
// `tessera swarm status|keygen`.
//
// A run directory that already holds this peer (its peer.json and a checkpoint) is a restart: the
// peer continues from its newest checkpoint with its own identity, config and swarm state, and
// rejoins. A fresh peer needs --config; its first record reaches the swarm through any live peer
// named by --initial-peer (none for the first peer of a swarm).
#include <filesystem>
#include <iostream>
#include <map>

#if TESSERA_ATOM
#include "atom/membership.h"
#include "atom/swarm.h"
#include "atom/wire.h"
#endif
#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/json_file.h"
#include "config/config.h"
#include "train/run_dir.h"
#include "train/stop_request.h"
#include "train/trainer.h"

namespace tessera::cli {
namespace {

// A build without OpenDHT (CMakeLists.txt: TESSERA_ATOM) has the commands, which say so.
[[maybe_unused]] void require_atom() {
  require(TESSERA_ATOM, "this tessera was built without OpenDHT and OpenSSL, which the ATOM swarm needs: install "
          "them (Debian: apt-get install libopendht-dev libssl-dev, or scripts/install.sh) and rebuild");
}

}  // namespace

Command add_peer_command(CLI::App& app) {
  struct Args {
    std::string config, out, swarm, listen;
    std::vector<std::string> initial, sets;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("peer", "train as one peer of an ATOM swarm (no coordinator; docs/atom.md)");
  cmd->add_option("--config", args->config, "config file or preset (its [swarm] section: sync, target batch, key)");
  cmd->add_option("--set", args->sets, "override a config key: section.key=value (repeatable)")->take_all();
  cmd->add_option("--swarm", args->swarm, "the swarm's name")->required();
  cmd->add_option("--listen", args->listen, "HOST:PORT this peer listens on (TCP and the DHT's UDP; port 0: any)")
      ->required();
  cmd->add_option("--initial-peer", args->initial, "HOST:PORT of any live peer (repeatable; none for the first peer)")
      ->take_all();
  cmd->add_option("--out", args->out, "the peer's run directory (a directory holding this peer: restart)")->required();
  cmd->footer("Config keys (section.key, default, meaning):\n" + config_reference());
  return [args]() {
    require_atom();
#if TESSERA_ATOM
    const std::string identity_file = args->out + "/peer.json";
    const bool restart = std::filesystem::exists(identity_file) &&
                         std::filesystem::exists(args->out + "/checkpoints/latest");
    RunClaim claim;
    if (restart) claim.resume_from = resolve_checkpoint_dir(args->out + "/checkpoints");
    // This peer, stopped before its first checkpoint: it starts again (same identity), its files replaced.
    claim.overwrite = !restart && std::filesystem::exists(identity_file);
    require(restart || !args->config.empty(), "peer: give --config FILE|PRESET (", args->out,
            " holds no checkpoint of a peer to restart from)");
    Config config = restart && args->config.empty()
                        ? Config::from_checkpoint_meta(claim.resume_from + "/meta.json", args->sets)
                        : Config::load(args->config, args->sets);
    const std::unique_ptr<RunLock> lock = claim_run_dir(args->out, claim);
    atom::PeerIdentity identity = atom::load_or_create_identity(args->out, args->swarm);
    identity.listen = args->listen;
    identity.initial_peers = args->initial;
    identity.run_dir = args->out;
    std::printf("config (after each key: where its value came from)\n%s\n", config.to_annotated_toml().c_str());
    stop_request::install();
    atom::Swarm swarm(identity, config);
    std::printf("peer %s of swarm '%s' listening on %s%s\n", identity.id.c_str(), identity.swarm.c_str(),
                swarm.address().c_str(), restart ? (", restarting from " + claim.resume_from).c_str() : "");
    std::fflush(stdout);
    fault::arm(0);  // a peer is the rank 0 of its own process
    Trainer trainer(config, args->out, TrainStart{claim.resume_from, ""}, nullptr, &swarm);
    TrainSummary summary = trainer.run();
    if (!summary.stopped.empty()) {
      std::printf("stopped: swarm step %lld of %lld (%s), checkpoint %s\n", static_cast<long long>(summary.steps),
                  static_cast<long long>(config.train.steps), summary.stopped.c_str(), summary.checkpoint.c_str());
      return kStoppedExitCode;
    }
    std::printf("done: %lld steps, train loss %.4f, val loss %.4f, checkpoint %s\n",
                static_cast<long long>(summary.steps), summary.last_loss, summary.last_val_loss,
                summary.checkpoint.c_str());
#endif
    return 0;
  };
}

Command add_swarm_command(CLI::App& app) {
  struct Args {
    std::string swarm, key_file, out, listen = "127.0.0.1:0";
    std::vector<std::string> initial;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("swarm", "inspect an ATOM swarm, or make its key");
  cmd->require_subcommand(1);
  CLI::App* status = cmd->add_subcommand("status", "print the swarm's live peers and its progress");
  status->add_option("--swarm", args->swarm, "the swarm's name")->required();
  status->add_option("--key-file", args->key_file, "the swarm's key file (swarm.key_file)")->required();
  status->add_option("--initial-peer", args->initial, "HOST:PORT of any live peer")->required()->take_all();
  status->add_option("--listen", args->listen, "HOST:PORT for this query's DHT node (default: any port)");
  CLI::App* keygen = cmd->add_subcommand("keygen", "write a new swarm key (32 random bytes, mode 0600)");
  keygen->add_option("--out", args->out, "the key file to create")->required();
  return [args, status, keygen]() {
    require_atom();
#if TESSERA_ATOM
    if (keygen->parsed()) {
      atom::SwarmKey::generate(args->out);
      std::printf("wrote a new swarm key to %s (fingerprint %s); give every peer this file as swarm.key_file\n",
                  args->out.c_str(), atom::SwarmKey::load(args->out).fingerprint().c_str());
      return 0;
    }
    const atom::SwarmKey key = atom::SwarmKey::load(args->key_file);
    const auto [host, port] = atom::split_address(args->listen, "--listen");
    atom::Membership dht(args->swarm, key, host, port, args->initial, 3600);
    // A read returns what the nodes that answered within its wait hold: under load one may end with
    // some peers' records still on their way. Read until a read finds peers and the next finds no
    // more (a settled view), for at most 10 s (a stranger's key sees none).
    std::vector<atom::PeerRecord> peers;
    for (const double until = atom::unix_now() + 10; atom::unix_now() < until;) {
      const size_t before = peers.size();
      peers = dht.live_peers(1.0);
      if (!peers.empty() && peers.size() == before) break;
    }
    std::printf("swarm '%s' (key %s): %zu live peer(s)\n", args->swarm.c_str(), key.fingerprint().c_str(), peers.size());
    std::printf("%-34s %-22s %10s %10s %10s %9s %10s %8s  %s\n", "peer", "address", "swarm_step", "local_step",
                "samples", "loss", "samples/s", "age_s", "state");
    int64_t top = 0;
    for (const atom::PeerRecord& r : peers) {
      top = std::max(top, r.swarm_step);
      std::printf("%-34s %-22s %10lld %10lld %10lld %9.4f %10.1f %8.1f  %s\n", r.id.c_str(), r.address.c_str(),
                  static_cast<long long>(r.swarm_step), static_cast<long long>(r.local_step),
                  static_cast<long long>(r.samples + r.claimed), r.loss, r.samples_per_s, atom::unix_now() - r.time,
                  r.state.empty() ? "-" : r.state.c_str());
    }
    if (!peers.empty()) std::printf("swarm step %lld\n", static_cast<long long>(top));
    // Members the robust aggregation found an outlier in most of a peer's recent rounds.
    std::map<std::string, int> named;
    for (const atom::PeerRecord& r : peers)
      for (const std::string& s : r.suspects) ++named[s];
    for (const auto& [suspect, by] : named)
      std::printf("suspect %s: an outlier in most recent rounds, as %d of %zu live peer(s) report\n", suspect.c_str(),
                  by, peers.size());
#endif
    return 0;
  };
}

}  // namespace tessera::cli
