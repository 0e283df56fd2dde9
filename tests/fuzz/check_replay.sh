#!/usr/bin/env bash
# CTest fuzz.replay_finds_what_fails: fuzz_replay (replay.cpp) must pass a corpus its target survives,
# reach by its mutants an input that traps and save it where it says, fail again when that input is
# replayed alone, save an input that crashes (SIGSEGV; AddressSanitizer's report where the build has
# it) and report an exception escaping the target (target replay_check, fuzz_replay_check.cpp).
#   usage: tests/fuzz/check_replay.sh FUZZ_REPLAY
set -uo pipefail
replay=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "check_replay: $*" >&2; cat "$dir/err" >&2 2>/dev/null; exit 1; }
# The crash below is meant: AddressSanitizer's report of it stays here, not among make test-sanitize's.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}log_path=$dir/asan"

printf 'abc' >"$dir/seed"
"$replay" replay_check "$dir/seed" --runs 1 --findings "$dir/clean" >/dev/null 2>"$dir/err" ||
  fail "the corpus alone (nothing traps) did not pass"

"$replay" replay_check "$dir/seed" --runs 100000 --findings "$dir/findings" >/dev/null 2>"$dir/err" &&
  fail "100,000 mutants of 'abc' passed: none began with byte 0xff"
finding=$(sed -n 's/.* saved to //p' "$dir/err" | head -1)
[ -f "$finding" ] || fail "no saved finding named in the report"
[ "$(head -c1 "$finding" | od -An -tx1 | tr -d ' ')" = ff ] || fail "the saved finding $finding does not start with 0xff"
grep -q "^replay: .* replay_check $finding" "$dir/err" || fail "no replay command for $finding"
"$replay" replay_check "$finding" --findings "$dir/again" >/dev/null 2>"$dir/err" && fail "the finding replayed alone passed"

printf 'segv' >"$dir/crashes"
"$replay" replay_check "$dir/crashes" --runs 1 --findings "$dir/crashed" >/dev/null 2>"$dir/err" &&
  fail "an input raising SIGSEGV passed"
cmp -s "$dir/crashes" "$dir/crashed/replay_check-0" || fail "the crashing input was not saved as replay_check-0"

printf '{{x' >"$dir/throws"
"$replay" replay_check "$dir/throws" --runs 1 --findings "$dir/thrown" >/dev/null 2>"$dir/err" &&
  fail "an exception escaping the target passed"
grep -q "an exception escaped the target: replay_check" "$dir/err" || fail "the escaping exception was not named"
cmp -s "$dir/throws" "$dir/thrown/replay_check-0" || fail "the throwing input was not saved as replay_check-0"
echo "check_replay: passes a clean corpus, finds and saves a trap among the mutants, saves a crash, names an escaping exception"
