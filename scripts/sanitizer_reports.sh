#!/bin/bash
# Prints the sanitizer reports written under DIR (the log_path of `make test-sanitize`, Makefile;
# `make test-tsan` judges its own with scripts/tsan_reports.py) after a failed run, so that they stand at the end of the output
# where CI keeps it: a report printed by a worker of a multi-process test lands in that worker's
# log, which the test's own output shows only in part. Frames inside the C++ standard library's
# headers are left out (they are most of a report's lines, and CI keeps a limited tail), then each
# report's first 120 lines.
dir="$1"
shopt -s nullglob
reports=("$dir"/*)
if [ ${#reports[@]} -eq 0 ]; then
  echo "sanitizer reports: none under $dir (the failure was not a sanitizer's)"
  exit 0
fi
echo "sanitizer reports (${#reports[@]}) under $dir:"
for report in "${reports[@]}"; do
  echo "==== $report"
  grep -v -E '^ +#[0-9]+ .* /usr/include/c\+\+/' "$report" | head -n 120
done
