#!/usr/bin/env python3
"""The fault matrix's table for docs/reliability.md, from the JSON lines that
tests/cli/test_fault_matrix.cpp appends to $TESSERA_FAULT_MATRIX_RESULTS (`make fault-matrix`).

Per cell: passed or FAILED, and the seconds from the fault to the run's end (every process gone).
Per layout: how long the survivor took to notice (its flight record written, after the fault) and
the run to end, median and max over the layout's cells. The swarm's cells (layout "swarm3"): passed
or FAILED, and the seconds from the fault to the other peers' next completed round.
"""
import json
import statistics
import sys


def seconds(values):
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def swarm_table(cells):
    """The swarm's cells: a peer of three killed or stopped; the others carry on."""
    print("| swarm of 3 peers: point | SIGKILL of a peer | SIGSTOP of a peer |")
    print("|---|---|---|")
    for point in dict.fromkeys(c["point"] for c in cells):
        row = []
        for signal in ("KILL", "STOP"):
            found = [c for c in cells if c["point"] == point and c["signal"] == signal]
            if not found:
                row.append("not run")
                continue
            c = found[-1]
            verdict = "ok" if c.get("passed") else "FAILED"
            if "recovered_s" in c:
                verdict += f", the others' next round {c['recovered_s']:.1f} s after"
            row.append(verdict)
        print(f"| {point} | " + " | ".join(row) + " |")
    print()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: fault_matrix_table.py RESULTS.jsonl")
    with open(sys.argv[1]) as f:
        every = [json.loads(line) for line in f if line.strip()]
    swarm = [c for c in every if c["layout"] == "swarm3"]
    cells = [c for c in every if c["layout"] != "swarm3"]
    if swarm:
        swarm_table(swarm)
    columns = [("KILL", 0), ("KILL", 1), ("STOP", 1)]
    layouts = list(dict.fromkeys(c["layout"] for c in cells))
    print("| layout | point | " + " | ".join(f"SIG{s} rank {v}" for s, v in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for layout in layouts:
        mine = [c for c in cells if c["layout"] == layout]
        for point in dict.fromkeys(c["point"] for c in mine):
            row = []
            for signal, victim in columns:
                found = [c for c in mine if c["point"] == point and c["signal"] == signal and c["victim"] == victim]
                if not found:
                    row.append("not run")
                    continue
                c = found[-1]
                verdict = "ok" if c.get("passed") else "FAILED"
                row.append(f"{verdict} {c['end_s']:.1f} s" if "end_s" in c else verdict)
            print(f"| {layout} | {point} | " + " | ".join(row) + " |")
    print()
    print("| layout | cells passed | survivor noticed, s (median / max) | run ended, s: SIGKILL | run ended, s: SIGSTOP |")
    print("|---|---|---|---|---|")
    for layout in layouts:
        mine = [c for c in cells if c["layout"] == layout]
        passed = sum(1 for c in mine if c.get("passed"))
        noticed = [c["noticed_s"] for c in mine if "noticed_s" in c]
        killed = [c["end_s"] for c in mine if c["signal"] == "KILL" and "end_s" in c]
        stopped = [c["end_s"] for c in mine if c["signal"] == "STOP" and "end_s" in c]
        print(f"| {layout} | {passed} of {len(mine)} | {seconds(noticed)} | {seconds(killed)} | {seconds(stopped)} |")
    total = sum(1 for c in every if c.get("passed"))
    print(f"\n{total} of {len(every)} cells passed.")


if __name__ == "__main__":
    main()
