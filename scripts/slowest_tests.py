"""Prints the ten slowest tests of a CTest log (ctest's stdout, as `make test` tees it), then CTest's
own summary line again, so that where the suite's time goes stays in sight.

usage: slowest_tests.py CTEST_LOG [COUNT]
"""
import re
import sys

RESULT = re.compile(r"Test\s+#\d+: (\S+) .*?([\d.]+) sec$")

log, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10
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
