#!/usr/bin/env python3
"""The fault matrix's table for docs/reliability.md, from the JSON lines that
tests/cli/test_fault_matrix.cpp appends to $TESSERA_FAULT_MATRIX_RESULTS (`make fault-matrix`).

Per cell: passed or FAILED, and the seconds from the fault to the run's end (every process gone).
Per layout: how long the survivor took to notice (its flight record written, after the fault) and
the run to end, median and max over the layout's cells.
"""
import json
import statistics
import sys


def seconds(values):
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: fault_matrix_table.py RESULTS.jsonl")
    with open(sys.argv[1]) as f:
        cells = [json.loads(line) for line in f if line.strip()]
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
    total = sum(1 for c in cells if c.get("passed"))
    print(f"\n{total} of {len(cells)} cells passed.")


if __name__ == "__main__":
    main()
