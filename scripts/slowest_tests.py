"""Prints the ten slowest tests of a CTest log (ctest's stdout, as `make test` tees it), then CTest's
own summary line again, so that where the suite's time goes stays in sight. With --cost-data OUT it
also writes the log's times in CTest's cost-data format (name, runs, seconds; tests/CMakeLists.txt
seeds a new build's CTest with tests/ctest_cost_data.txt, written so).

usage: slowest_tests.py CTEST_LOG [COUNT] [--cost-data OUT]
"""
import re
import sys

RESULT = re.compile(r"Test\s+#\d+: (\S+) .*?([\d.]+) sec$")

args = sys.argv[1:]
cost_data = None
if "--cost-data" in args:
    at = args.index("--cost-data")
    cost_data = args[at + 1]
    del args[at:at + 2]
log, count = args[0], int(args[1]) if len(args) > 1 else 10
times, summary = [], []
with open(log, errors="replace") as f:
    for line in f:
        match = RESULT.search(line)
        if match:
            times.append((float(match.group(2)), match.group(1)))
        elif "tests passed" in line or line.startswith("Total Test time"):
            summary.append(line.rstrip())
if times:
    total = sum(t for t, _ in times)
    print(f"\nThe {min(count, len(times))} slowest of {len(times)} tests ({total:.0f} s over all tests):")
    for seconds, name in sorted(times, reverse=True)[:count]:
        print(f"  {seconds:7.1f} s  {name}")
    for line in summary:
        print(line)
if cost_data:
    with open(cost_data, "w") as out:
        for seconds, name in sorted(times, reverse=True):
            out.write(f"{name} 1 {seconds:.2f}\n")
        out.write("---\n")
