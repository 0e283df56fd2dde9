#!/usr/bin/env python3
"""Where a swarm round's time goes: each peer's timeline of rounds, from its metrics.jsonl.

    python3 bench/swarm_round_timeline.py RUN_DIR [RUN_DIR ...] [--rounds FIRST:LAST] --out OUT

Every `tessera peer` writes its last round's timeline into metrics.jsonl (swarm.round_times, Unix
seconds; atom/swarm.h): when its reduction began (its local step's backward done), when it had the
others' fresh claims (batch mode), and the round's phases (atom/averaging.h). Each round is cut into
  local step     the previous round's end to this reduction's start (forward, backward, update, data)
  claims         waiting for the other peers' fresh records in the DHT (batch mode); for a round
                 that started with its local step (swarm.overlap_rounds), its decision to its start
  group          the round's start to its group formed (JOINs gathered at the host)
  parts          the group formed to every contribution to this peer's part in (its parts sent to
                 their owners, the others' parts received and summed)
  sums           its part's sum done to every sum back (the butterfly's second phase)
The local step is drawn in the upper half of a peer's row and the round's phases in the lower half,
so a round that started with its local step shows under it. Writes OUT.svg (one row per peer,
rounds FIRST..LAST, every peer on one clock) and OUT.md (each phase's mean seconds per peer over
those rounds, and the round's time after the backward ended: what the local step did not hide).
The peers' clocks are the hosts'; on one machine (network namespaces) they are one clock.
"""
import argparse
import json
import os

from results_file import write_results

PHASES = [("local step", "#bbbbbb"), ("claims", "#ff7f0e"), ("group", "#9467bd"), ("parts", "#1f77b4"),
          ("sums", "#2ca02c")]


def rounds_of(run_dir):
    """{swarm step: round_times} from RUN_DIR/metrics.jsonl."""
    rounds = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            times = (row.get("swarm") or {}).get("round_times")
            if times:
                rounds[times["swarm_step"]] = times
    return rounds


def segments(rounds, step):
    """[(phase, start, end)] of round `step` at one peer (the local step needs round step - 1)."""
    t = rounds[step]
    out = []
    if step - 1 in rounds:
        out.append(("local step", rounds[step - 1]["finished"], t["entered"]))
    overlapped = t.get("overlapped", t["entered"] > t["started"])  # files from before the flag: by time
    claims_from = t["claims_seen"] if overlapped else t["entered"]
    out += [("claims", claims_from, t["started"]), ("group", t["started"], t["grouped"]),
            ("parts", t["grouped"], t["part_summed"]), ("sums", t["part_summed"], t["finished"])]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--rounds", default="", help="FIRST:LAST swarm steps to draw (default: the middle six)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="Swarm rounds")
    a = ap.parse_args()
    peers = [rounds_of(d) for d in a.run_dirs]
    common = sorted(set.intersection(*(set(p) for p in peers)))
    if not common:
        raise SystemExit("no round is in every peer's metrics.jsonl")
    if a.rounds:
        first, last = (int(x) for x in a.rounds.split(":"))
    else:
        mid = common[len(common) // 2]
        first, last = mid - 2, mid + 3
    chosen = [s for s in common if first <= s <= last]
    t0 = min(seg[1] for p in peers for s in chosen for seg in segments(p, s))
    t1 = max(seg[2] for p in peers for s in chosen for seg in segments(p, s))
    width, left, row, top = 900, 90, 28, 40
    height = top + row * len(peers) + 50
    scale = (width - left - 20) / (t1 - t0)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
           % (width, height), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="14">%s: rounds %d-%d, %.2f s</text>' % (left, a.title, chosen[0],
                                                                                  chosen[-1], t1 - t0)]
    colors = dict(PHASES)
    for i, p in enumerate(peers):
        y = top + i * row
        out.append('<text x="%d" y="%d" text-anchor="end">peer %d</text>' % (left - 6, y + 16, i))
        half = (row - 8) // 2
        for s in chosen:
            for phase, b, e in segments(p, s):
                lane = y + 4 + (0 if phase == "local step" else half)
                out.append('<rect x="%.1f" y="%d" width="%.2f" height="%d" fill="%s"><title>round %d, %s: %.3f s'
                           '</title></rect>' % (left + (b - t0) * scale, lane, max(0.5, (e - b) * scale), half,
                                                colors[phase], s, phase, e - b))
    for j, (phase, color) in enumerate(PHASES):
        x = left + 150 * j
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>'
                   % (x, height - 30, color, x + 16, height - 20, phase))
    out.append("</svg>")
    with open(a.out + ".svg", "w") as f:
        f.write("\n".join(out) + "\n")
    lines = ["# %s: where a round's time goes" % a.title, "",
             "Mean seconds per phase over rounds %d-%d (%d rounds), each peer (bench/swarm_round_timeline.py)."
             % (chosen[0], chosen[-1], len(chosen)), "",
             "| peer | " + " | ".join(name for name, _ in PHASES) + " | round after the backward | round period |",
             "|---|" + "---|" * (len(PHASES) + 2)]
    for i, p in enumerate(peers):
        sums = {name: [] for name, _ in PHASES}
        for s in chosen:
            for phase, b, e in segments(p, s):
                sums[phase].append(e - b)
        period = (p[chosen[-1]]["finished"] - p[chosen[0]]["finished"]) / max(1, len(chosen) - 1)
        exposed = sum(p[s]["finished"] - p[s]["entered"] for s in chosen) / len(chosen)
        lines.append("| %d | " % i + " | ".join("%.3f" % (sum(v) / len(v)) if v else "-" for v in sums.values()) +
                     " | %.3f | %.3f |" % (exposed, period))
    lines += ["", "![round timeline](%s.svg)" % os.path.basename(a.out)]
    write_results(a.out + ".md", lines)


if __name__ == "__main__":
    main()
