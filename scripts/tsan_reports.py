#!/usr/bin/env python3
"""Judges the ThreadSanitizer reports of `make test-tsan` (Makefile) and fails on any that is ours.

`make test-tsan` runs with halt_on_error=0 and exitcode=0 and writes every report to DIR (log_path):
a report no suppression (tests/tsan.supp) names does not fail its test by itself; this script does,
after CTest, for every report except two kinds it can prove are not tessera's.

Suppressions match a frame's function, file or module, one at a time. Two libraries close a file
descriptor where TSan cannot see it, and the next user of that descriptor number then reads as a
race with the library's last access to it:

- OpenDHT (Debian's libopendht.so.2, uninstrumented, without its local symbols) closes its UDP
  socket in its receive thread's loop, a function without a name in the library, while its DHT
  thread may have sent on that socket with no order TSan can see (their order goes through atomics
  in uninstrumented code). Its frame can only be named by the library, and a suppression by the
  library would hide every race in tessera's DHT callbacks too (their stacks hold the library's
  frame that called them). Let through: a data race on a descriptor OpenDHT's own socket() created,
  whose accesses have no frame but the sanitizer's interceptor and OpenDHT's (a stack TSan could not
  restore has none).
- libuv inside libtorch_cpu.so (the TCPStore server's thread, pt_tcpstore_uv) closes the sockets it
  accepted with syscall(SYS_close, fd) (uv__close_nocancel; `objdump -d` shows the call to
  syscall@plt), which no interceptor sees. When a client leaves, the descriptor number is free
  again, and any thread of the process that next opens a file or socket gets it: TSan reports that
  open as a race with libuv's last read on the old connection. Let through: a data race on a
  descriptor libuv's uv__accept created whose earlier access has no frame but the interceptor's and
  libuv's own (uv__ functions in libtorch_cpu.so). The other access may be anyone's: it is the
  reuse. A tessera thread never touches a socket libuv accepted.

Anything else is printed in full (less the frames inside the C++ standard library's headers, first
120 lines) and makes the exit status 1.

Usage: tsan_reports.py DIR
"""
import pathlib
import re
import sys

SEPARATOR = "=================="
ACCESS = re.compile(r"^  (Previous )?(atomic |Atomic )?(read|write|Read|Write) of size")
PREVIOUS_ACCESS = re.compile(r"^  Previous ")
FRAME = re.compile(r"^\s+#\d+ .*\(([^()+]+)\+0x[0-9a-f]+\)$")
FUNCTION = re.compile(r"^\s+#\d+ (\S+) ")
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


def function(frame):
    m = FUNCTION.match(frame)
    return m.group(1) if m else None


def libuv_frame(frame):
    name = module(frame) or ""
    return name.startswith("libtsan.so") or (name.startswith("libtorch_cpu.so") and (function(frame) or "").startswith("uv__"))


def on_libuv_accepted_socket(report):
    """True for a data race on a socket libuv's server accepted whose earlier access is libuv's."""
    if not report or "WARNING: ThreadSanitizer: data race" not in report[0]:
        return False
    previous, location = None, None
    for header, frames in blocks(report):
        if ACCESS.match(header) and PREVIOUS_ACCESS.match(header):
            previous = frames
        elif FD_LOCATION.match(header):
            location = frames
    if not previous or location is None or len(location) < 2:
        return False
    if function(location[1]) != "uv__accept" or not (module(location[1]) or "").startswith("libtorch_cpu.so"):
        return False
    return all(libuv_frame(frame) for frame in previous) and any(not (module(f) or "").startswith("libtsan.so") for f in previous)


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    files = sorted(p for p in pathlib.Path(argv[1]).glob("*") if p.is_file())
    opendht, libuv, ours = 0, 0, []
    for path in files:
        for report in reports(path.read_text(errors="replace")):
            if inside_opendht(report):
                opendht += 1
            elif on_libuv_accepted_socket(report):
                libuv += 1
            else:
                ours.append((path, report))
    if opendht:
        print(f"tsan reports: {opendht} race(s) on OpenDHT's own socket inside OpenDHT let through (scripts/tsan_reports.py)")
    if libuv:
        print(f"tsan reports: {libuv} reuse(s) of a socket number libuv closed unseen let through (scripts/tsan_reports.py)")
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
