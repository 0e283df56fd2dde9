#!/usr/bin/env python3
"""Judges the ThreadSanitizer reports of `make test-tsan` (Makefile) and fails on any that is ours.

`make test-tsan` runs with halt_on_error=0 and exitcode=0 and writes every report to DIR (log_path):
a report no suppression (tests/tsan.supp) names does not fail its test by itself; this script does,
after CTest, for every report except those it can prove lie wholly inside OpenDHT.

Suppressions match a frame's function, file or module, one at a time. OpenDHT (Debian's
libopendht.so.2, uninstrumented, without its local symbols) closes its UDP socket in its receive
thread's loop, a function without a name in the library, while its DHT thread may have sent on that
socket with no order TSan can see (their order goes through atomics in uninstrumented code). Its
frame can only be named by the library, and a suppression by the library would hide every race in
tessera's DHT callbacks too (their stacks hold the library's frame that called them). So this script
lets through exactly: a data race on a file descriptor that OpenDHT's own socket() created, whose
accesses have no frame but the sanitizer's interceptor and OpenDHT's (a stack TSan could not restore
has none). Anything else is printed in full (less the frames inside the C++ standard library's
headers, first 120 lines) and makes the exit status 1.

Usage: tsan_reports.py DIR
"""
import pathlib
import re
import sys

SEPARATOR = "=================="
ACCESS = re.compile(r"^  (Previous )?(atomic |Atomic )?(read|write|Read|Write) of size")
FRAME = re.compile(r"^\s+#\d+ .*\(([^()+]+)\+0x[0-9a-f]+\)$")
FD_LOCATION = re.compile(r"^  Location is file descriptor \d+ created by .* at:$")
INSIDE_OPENDHT = ("libtsan.so", "libopendht.so")
STDLIB_FRAME = re.compile(r"^ +#[0-9]+ .* /usr/include/c\+\+/")


def reports(text):
    """The reports in one log file: each the lines between two separator lines that open with
    TSan's WARNING (the "ThreadSanitizer: reported N warnings" line at exit is not one)."""
    found, current = [], None
    for line in text.splitlines():
        if line.strip() == SEPARATOR:
            if current:
                found.append(current)
            current = []
        elif current is not None:
            current.append(line)
    if current:
        found.append(current)
    return [r for r in found if any(line.startswith("WARNING: ThreadSanitizer:") for line in r[:2])]


def blocks(report):
    """A report's blocks: a header line (two spaces of indent) and the frames under it."""
    out = []
    for line in report:
        if line.startswith("  ") and not line.startswith("    "):
            out.append((line, []))
        elif out and line.startswith("    "):
            out[-1][1].append(line)
    return out


def module(frame):
    m = FRAME.match(frame)
    return pathlib.PurePath(m.group(1)).name if m else None


def inside_opendht(report):
    """True for a data race on OpenDHT's own socket with no frame of anyone else's in its accesses."""
    if not report or "WARNING: ThreadSanitizer: data race" not in report[0]:
        return False
    accesses, location = [], None
    for header, frames in blocks(report):
        if ACCESS.match(header):
            accesses.append(frames)
        elif FD_LOCATION.match(header):
            location = frames
    if not accesses or location is None or len(location) < 2:
        return False
    if not (module(location[1]) or "").startswith("libopendht.so"):
        return False
    seen_opendht = False
    for frames in accesses:
        for frame in frames:
            if "[failed to restore the stack]" in frame:
                continue
            name = module(frame)
            if name is None or not name.startswith(INSIDE_OPENDHT):
                return False
            seen_opendht |= name.startswith("libopendht.so")
    return seen_opendht


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    files = sorted(p for p in pathlib.Path(argv[1]).glob("*") if p.is_file())
    allowed, ours = 0, []
    for path in files:
        for report in reports(path.read_text(errors="replace")):
            if inside_opendht(report):
                allowed += 1
            else:
                ours.append((path, report))
    if allowed:
        print(f"tsan reports: {allowed} race(s) on OpenDHT's own socket inside OpenDHT let through (scripts/tsan_reports.py)")
    if not ours:
        print(f"tsan reports: none of tessera's under {argv[1]}")
        return 0
    print(f"tsan reports: {len(ours)} under {argv[1]}:")
    for path, report in ours:
        print(f"==== {path}")
        kept = [line for line in report if not STDLIB_FRAME.match(line)]
        print("\n".join(kept[:120]))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
