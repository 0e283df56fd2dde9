#!/usr/bin/env python3
"""scripts/tsan_reports.py lets through only a race inside OpenDHT on OpenDHT's own socket.

The first report is the one CI printed for stop 75 (Swarm, `tessera swarm status`), with the line
TSan writes at the process's exit (not a report); each other case changes one thing about it that
makes the race possibly tessera's, and must fail the run.
"""
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "tsan_reports.py"

OPENDHT_CLOSE = """==================
WARNING: ThreadSanitizer: data race (pid=28354)
  Write of size 8 at 0x7ba000000060 by thread T1:
    #0 close ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1749 (libtsan.so.2+0x4002c)
    #1 <null> <null> (libopendht.so.2+0x142887)

  Previous read of size 8 at 0x7ba000000060 by thread T2:
{previous}

  Location is file descriptor 6 created by main thread at:
    #0 socket ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1708 (libtsan.so.2+0x428e8)
    #1 <null> <null> ({creator}+0x141b8e)
    #2 operator() ../src/cli/peer_command.cpp:123 (tessera+0x133312)
    #8 main ../src/cli/main.cpp:53 (tessera+0x8ef9e)

  Thread T1 (tid=28550, running) created by main thread at:
    #0 pthread_create ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1001 (libtsan.so.2+0x5e686)
    #2 operator() ../src/cli/peer_command.cpp:123 (tessera+0x133312)

SUMMARY: ThreadSanitizer: data race (/lib/x86_64-linux-gnu/libopendht.so.2+0x142887)
==================
ThreadSanitizer: reported 1 warnings
"""
UNRESTORED = "    [failed to restore the stack]"
OPENDHT_SEND = ("    #0 sendto sanitizer_common_interceptors.inc:6812 (libtsan.so.2+0x58161)\n"
                "    #1 dht::net::UdpSocket::sendTo(dht::SockAddr const&) <null> (libopendht.so.2+0x1422a0)")
TESSERA_SEND = ("    #0 sendto sanitizer_common_interceptors.inc:6812 (libtsan.so.2+0x58161)\n"
                "    #1 tessera::atom::send_piece ../src/atom/averaging.cpp:210 (libtessera_atom.so+0x1234)")
LOCK_ORDER = """==================
WARNING: ThreadSanitizer: lock-order-inversion (potential deadlock) (pid=1)
  Cycle in lock order graph: M0 (0x1) => M1 (0x2) => M0
    #0 pthread_mutex_lock (libtsan.so.2+0x1) 
    #1 <null> <null> (libopendht.so.2+0x2)
==================
"""


def judge(*texts):
    with tempfile.TemporaryDirectory() as d:
        for i, t in enumerate(texts):
            pathlib.Path(d, f"tsan.{i}").write_text(t)
        r = subprocess.run([sys.executable, str(SCRIPT), d], capture_output=True, text=True)
        return r.returncode, r.stdout


def main():
    cases = {
        "the race CI saw (other access unrestored)": (OPENDHT_CLOSE.format(previous=UNRESTORED, creator="libopendht.so.2"), 0),
        "the same with the other access restored inside OpenDHT": (OPENDHT_CLOSE.format(previous=OPENDHT_SEND, creator="libopendht.so.2"), 0),
        "the other access in tessera": (OPENDHT_CLOSE.format(previous=TESSERA_SEND, creator="libopendht.so.2"), 1),
        "a descriptor tessera created": (OPENDHT_CLOSE.format(previous=UNRESTORED, creator="libtessera_atom.so"), 1),
        "a lock-order inversion inside OpenDHT": (LOCK_ORDER, 1),
    }
    failed = 0
    for name, (text, want) in cases.items():
        status, out = judge(text)
        ok = status == want and (want == 0 or "==== " in out)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {status}, want {want}")
        failed += not ok
    status, _ = judge(OPENDHT_CLOSE.format(previous=UNRESTORED, creator="libopendht.so.2"), LOCK_ORDER)
    print(f"{'ok  ' if status == 1 else 'FAIL'} one allowed and one other report: exit {status}, want 1")
    failed += status != 1
    status, out = judge()
    print(f"{'ok  ' if status == 0 else 'FAIL'} no reports: exit {status}, want 0")
    failed += status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
