#!/usr/bin/env python3
"""An ATOM swarm under churn: peers killed and started on a schedule; the loss curve with the events.

    python3 bench/atom_churn.py BUILD_DIR [--steps 300] [--out bench/results/atom_churn_cpu]

Peers of tiny_gpt in batch mode (target batch 48: three peers' local steps of 16) on loopback. The
schedule, in swarm steps (the step every live peer shares):
  0            peers A, B and C start (A first, B and C from A's address);
  steps/7      A, the first started, is killed (SIGKILL: no goodbye);
  2 steps/7    D starts from B's address: a late joiner, it takes the swarm's state from the donors;
  3 steps/7    C is stopped (SIGTERM: it checkpoints and leaves);
  4 steps/7    C restarts from its run directory alone (no config): it rejoins;
  5 steps/7    B is killed (SIGKILL);
  steps        C and D, the two left, finish.
Each event is marked at the swarm step a live peer had reached when it happened. At the end: every
finished peer's samples are accounted for (processed = contributed to a round + dropped for a newer
state + still accumulated), the final parameters of C and D are compared bit for bit, and their
last validation losses are printed. Writes OUT.md and OUT.svg (each peer's training loss against
the swarm step, validation dots, the events as vertical lines).
"""
import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

from swarm_peers import ROOT, keygen, last, prepared_corpus, start_peer

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import plot_losses  # noqa: E402  (scripts/ is not a package)


# After A, B and C start: at k sevenths of the run, (stop, peer, signal) or (start, peer, the peer it
# starts from); a peer started again restarts from its run directory.
SCHEDULE = [
    (1, ("stop", "A", signal.SIGKILL), "A killed (the first started)"),
    (2, ("start", "D", "B"), "D joins from B"),
    (3, ("stop", "C", signal.SIGTERM), "C stopped"),
    (4, ("start", "C", "B"), "C restarts from its run directory"),
    (5, ("stop", "B", signal.SIGKILL), "B killed"),
]


class Swarm:
    def __init__(self, build, work, steps):
        self.build, self.work, self.steps = build, work, steps
        self.key = keygen(build, os.path.join(work, "swarm.key"))
        self.data = prepared_corpus(build)
        self.procs, self.addresses, self.events = {}, {}, []

    def settings(self):
        return ["--config", "tiny_gpt", "--set", "data.path=" + self.data, "--set", "train.steps=%d" % self.steps,
                "--set", "train.batch_size=16", "--set", "train.threads=1", "--set", "train.log_every=1",
                "--set", "eval.every=%d" % max(1, self.steps // 15), "--set", "eval.batches=8",
                "--set", "checkpoint.every=10", "--set", "swarm.key_file=" + self.key,
                "--set", "swarm.target_batch_size=48", "--set", "swarm.record_ttl_s=3",
                "--set", "swarm.publish_interval_s=0.25", "--set", "swarm.round_timeout_min_s=1",
                "--set", "swarm.round_timeout_max_s=10"]

    def start(self, name, initial=None, restart=False):
        out = os.path.join(self.work, name)
        cmd = [os.path.join(self.build, "tessera"), "peer", "--swarm", "churn", "--listen", "127.0.0.1:0",
               "--out", out] + ([] if restart else self.settings()) + (["--initial-peer", initial] if initial else [])
        self.procs[name], self.addresses[name] = start_peer(cmd, out)

    def step(self):
        """The highest swarm step a live peer has logged."""
        steps = [(last(os.path.join(self.work, n), "swarm") or {}).get("swarm_step", 0)
                 for n, p in self.procs.items() if p.poll() is None]
        return max(steps, default=0)

    def wait_for(self, step):
        while self.step() < step:
            if all(p.poll() is not None for p in self.procs.values()):
                sys.exit("every peer has exited before swarm step %d; logs in %s" % (step, self.work))
            time.sleep(0.2)

    def event(self, label):
        self.events.append((self.step(), label))
        print("swarm step %4d: %s" % self.events[-1], flush=True)

    def stop(self, name, sig):
        self.procs[name].send_signal(sig)
        code = self.procs[name].wait()
        expected = 3 if sig == signal.SIGTERM else -sig  # a stop request's exit code
        if code != expected:
            sys.exit("%s exited with %d after %s (expected %d); see %s.log"
                     % (name, code, signal.Signals(sig).name, expected, os.path.join(self.work, name)))


def accounted(run_dir):
    s = last(run_dir, "swarm")
    return s, s["samples_processed"] == s["samples_contributed"] + s["samples_dropped"] + s["samples_accumulated"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/atom_churn_cpu"))
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    work = tempfile.mkdtemp(prefix="atom_churn_")
    s = Swarm(build, work, a.steps)
    try:
        s.start("A")
        s.start("B", s.addresses["A"])
        s.start("C", s.addresses["A"])
        s.event("A, B, C start")
        for seventh, (action, name, arg), label in SCHEDULE:
            s.wait_for(a.steps * seventh // 7)
            if action == "stop":
                s.stop(name, arg)
            else:
                s.start(name, s.addresses[arg], restart=name in s.procs)
            s.event(label)
        for name in ("C", "D"):
            if s.procs[name].wait() != 0:
                sys.exit("%s did not finish; see %s.log" % (name, os.path.join(work, name)))
    finally:
        for p in s.procs.values():
            if p.poll() is None:
                p.kill()
    ok = True
    lines = ["| peer | swarm step | samples processed | contributed | dropped | accumulated | accounted | last val loss |",
             "|---|---|---|---|---|---|---|---|"]
    for name in ("C", "D"):
        d = os.path.join(work, name)
        sw, balanced = accounted(d)
        ok = ok and balanced
        lines.append("| %s | %d | %d | %d | %d | %d | %s | %.4f |" % (
            name, sw["swarm_step"], sw["samples_processed"], sw["samples_contributed"], sw["samples_dropped"],
            sw["samples_accumulated"], "yes" if balanced else "NO", last(d, "val_loss")))
    final = [open(os.path.join(work, n, "checkpoints", "step_%d" % a.steps, "model.safetensors"), "rb").read()
             for n in ("C", "D")]
    took = [line.strip() for line in open(os.path.join(work, "D.log")) if "took the swarm's state" in line]
    events = "\n".join("- swarm step %d: %s" % e for e in s.events)
    summary = "\n".join(lines)
    same = "bit-identical" if final[0] == final[1] else "DIFFERENT"
    print("\n" + summary + "\n\nfinal parameters of C and D: " + same)
    plot_losses.plot([(n, os.path.join(work, n, "metrics.jsonl")) for n in "ABCD"], a.out + ".svg",
                     title="ATOM swarm under churn (batch mode, tiny_gpt): loss against swarm step",
                     events=s.events)
    with open(a.out + ".md", "w") as f:
        f.write("# ATOM swarm under churn (CPU, loopback)\n\n`python3 bench/atom_churn.py build --steps %d`, %s. "
                "See the script's header for the schedule.\n\nEvents:\n\n%s\n\nD, the late joiner: %s\n\n%s\n\n"
                "Final parameters of C and D at swarm step %d: %s.\n\n![loss under churn](%s.svg)\n"
                % (a.steps, time.strftime("%Y-%m-%d"), events, took[0] if took else "took no state", summary,
                   a.steps, same, os.path.basename(a.out)))
    shutil.rmtree(work)
    if final[0] != final[1] or not ok:
        sys.exit("the two peers left differ, or a peer's samples are not accounted for: see " + a.out + ".md")


if __name__ == "__main__":
    main()
