#!/usr/bin/env python3
"""How fast a late joiner catches up with a swarm whose rounds are fast: by state downloads alone
(swarm.replay_mb = 0) against a download and then the rounds it missed replayed from the peers' logs.

    python3 bench/swarm_catch_up.py BUILD_DIR [--rounds 3] [--limit 60]

Peer A of tiny_gpt (2 blocks of width 32: tens of milliseconds a local step) trains alone in batch
mode (swarm.target_batch_size = one local step), so its swarm step advances at every local step;
peer B starts from A's address. Printed per setting and try: the seconds from B's address to its
first round with A ("round N: 2 peers"), or "-" when not within --limit, and how B caught up (state
downloads, rounds replayed). The settings alternate within each try, on the same machine.
"""
import argparse
import os
import re
import shutil
import signal
import tempfile
import time

from swarm_peers import keygen, prepared_corpus, start_peer


def settings(build, key, data):
    return ["--config", "tiny_gpt", "--set", "data.path=" + data, "--set", "train.steps=1000000",
            "--set", "model.n_layer=2", "--set", "model.n_embd=32", "--set", "model.n_head=2",
            "--set", "model.block_size=32", "--set", "train.seq_len=32", "--set", "train.batch_size=4",
            "--set", "train.threads=1", "--set", "train.log_every=1000", "--set", "eval.every=1000000",
            "--set", "checkpoint.every=1000000", "--set", "swarm.key_file=" + key,
            "--set", "swarm.target_batch_size=4", "--set", "swarm.record_ttl_s=2",
            "--set", "swarm.publish_interval_s=0.2", "--set", "swarm.round_timeout_min_s=1",
            "--set", "swarm.round_timeout_max_s=8"]


def one(build, work, replay_mb, limit):
    key = keygen(build, os.path.join(work, "swarm.key"))
    data = prepared_corpus(build)
    base = [os.path.join(build, "tessera"), "peer", "--swarm", "demo", "--listen", "127.0.0.1:0"]
    a_dir = os.path.join(work, "a")
    replay = ["--set", "swarm.replay_mb=%g" % replay_mb]  # the donor's log is the one B reads
    a, address = start_peer(base + ["--out", a_dir] + settings(build, key, data) + replay, a_dir)
    time.sleep(3)  # A runs ahead alone
    b_dir = os.path.join(work, "b")
    t0 = time.time()
    b, _ = start_peer(base + ["--out", b_dir, "--initial-peer", address] + settings(build, key, data) + replay, b_dir)
    seconds = None
    while time.time() - t0 < limit:
        with open(b_dir + ".log") as f:
            text = f.read()
        if re.search(r"round [0-9]+: 2 peers", text):
            seconds = time.time() - t0
            break
        time.sleep(0.1)
    for p in (a, b):
        p.send_signal(signal.SIGKILL)
        p.wait()
    with open(b_dir + ".log") as f:
        text = f.read()
    downloads = len(re.findall(r"took the swarm's state", text))
    replayed = sum(int(n) for n in re.findall(r"\(([0-9]+) round\(s\)\)", text))
    return seconds, downloads, replayed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=float, default=60)
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    print("| try | setting | seconds to B's first round with A | state downloads | rounds replayed |")
    print("|---|---|---|---|---|")
    for r in range(args.rounds):
        for name, replay_mb in (("downloads only (swarm.replay_mb = 0)", 0), ("download, then replay (256 MB)", 256)):
            work = tempfile.mkdtemp(prefix="tessera_catch_up_")
            try:
                seconds, downloads, replayed = one(build, work, replay_mb, args.limit)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            print("| %d | %s | %s | %d | %d |" % (r + 1, name, "-" if seconds is None else "%.1f" % seconds,
                                                  downloads, replayed), flush=True)


if __name__ == "__main__":
    main()
