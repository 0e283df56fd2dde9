#!/usr/bin/env python3
"""scripts/tsan_reports.py lets through only a race inside OpenDHT on OpenDHT's own socket, and the
reuse of a socket number libtorch's libuv closed where TSan could not see it.

opendht_close() gives the report CI printed for stop 75 (Swarm, `tessera swarm status`), with the line
TSan writes at the process's exit (not a report). libuv_reuse() the one CI printed for stop 79
(`tessera train` under test-tsan): its previous access, location and thread are CI's; of the main
thread's access CI printed only frames #10 and up, so frames #0-#1 here are an open() as the reuse
would make it. Each other case changes one thing that makes the race possibly tessera's, and must
fail the run.
"""
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "tsan_reports.py"

def race_report(access, previous_thread, previous, location, thread, summary):
    """A data race report as TSan writes it, between two separator lines."""
    return "\n".join(["==================", "WARNING: ThreadSanitizer: data race (pid=28354)", access, "",
                      f"  Previous read of size 8 at 0x7ba000000060 by {previous_thread}:", previous, "", location, "",
                      thread, "", f"SUMMARY: ThreadSanitizer: data race ({summary})", "==================", ""])


def opendht_close(previous, creator):
    return race_report(
        "  Write of size 8 at 0x7ba000000060 by thread T1:\n"
        "    #0 close ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1749 (libtsan.so.2+0x4002c)\n"
        "    #1 <null> <null> (libopendht.so.2+0x142887)",
        "thread T2", previous,
        "  Location is file descriptor 6 created by main thread at:\n"
        "    #0 socket ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1708 (libtsan.so.2+0x428e8)\n"
        f"    #1 <null> <null> ({creator}+0x141b8e)\n"
        "    #2 operator() ../src/cli/peer_command.cpp:123 (tessera+0x133312)\n"
        "    #8 main ../src/cli/main.cpp:53 (tessera+0x8ef9e)",
        "  Thread T1 (tid=28550, running) created by main thread at:\n"
        "    #0 pthread_create ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1001 (libtsan.so.2+0x5e686)\n"
        "    #2 operator() ../src/cli/peer_command.cpp:123 (tessera+0x133312)",
        "/lib/x86_64-linux-gnu/libopendht.so.2+0x142887") + "ThreadSanitizer: reported 1 warnings\n"


UNRESTORED = "    [failed to restore the stack]"
OPENDHT_SEND = ("    #0 sendto sanitizer_common_interceptors.inc:6812 (libtsan.so.2+0x58161)\n"
                "    #1 dht::net::UdpSocket::sendTo(dht::SockAddr const&) <null> (libopendht.so.2+0x1422a0)")
TESSERA_SEND = ("    #0 sendto sanitizer_common_interceptors.inc:6812 (libtsan.so.2+0x58161)\n"
                "    #1 tessera::atom::send_piece ../src/atom/averaging.cpp:210 (libtessera_atom.so+0x1234)")
def libuv_reuse(previous, creator):
    return race_report(
        "  Write of size 8 at 0x7ba000000160 by main thread:\n"
        "    #0 open ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1650 (libtsan.so.2+0x3f6d1)\n"
        "    #1 std::__basic_file<char>::open(char const*, std::_Ios_Openmode, int) <null> (libstdc++.so.6+0x16a72d)\n"
        "    #10 operator() ../src/cli/train_command.cpp:191 (tessera+0x13856e)\n"
        "    #15 run ../src/cli/main.cpp:36 (tessera+0x9fd73)\n"
        "    #16 main ../src/cli/main.cpp:53 (tessera+0x91fbe)",
        "thread T1", previous,
        "  Location is file descriptor 22 created by thread T1 at:\n"
        "    #0 accept4 ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:2952 (libtsan.so.2+0x5955d)\n"
        f"    #1 {creator} <null> (libtorch_cpu.so+0x11dec793)",
        "  Thread T1 'pt_tcpstore_uv' (tid=10121, running) created by main thread at:\n"
        "    #0 pthread_create ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1001 (libtsan.so.2+0x5e686)\n"
        "    #1 std::thread::_M_start_thread(std::unique_ptr<std::thread::_State, std::default_delete<std::thread::_State> >, void (*)()) <null> (libstdc++.so.6+0xd4578)\n"
        "    #2 operator() ../src/cli/train_command.cpp:184 (tessera+0x1374ae)\n"
        "    #7 run ../src/cli/main.cpp:36 (tessera+0x9fd73)\n"
        "    #8 main ../src/cli/main.cpp:53 (tessera+0x91fbe)",
        "/lib/x86_64-linux-gnu/libstdc++.so.6+0x16a72d")


LIBUV_READ = ("    #0 read ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:1019 (libtsan.so.2+0x50f19)\n"
              "    #1 uv__read <null> (libtorch_cpu.so+0x11df267c)")
TESSERA_READ = ("    #0 read ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:1019 (libtsan.so.2+0x50f19)\n"
                "    #1 tessera::comm::read_frame ../src/comm/socket.cpp:88 (libtessera_comm.so+0x4321)")
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
        "the race CI saw (other access unrestored)": (opendht_close(UNRESTORED, "libopendht.so.2"), 0),
        "the same with the other access restored inside OpenDHT": (opendht_close(OPENDHT_SEND, "libopendht.so.2"), 0),
        "the other access in tessera": (opendht_close(TESSERA_SEND, "libopendht.so.2"), 1),
        "a descriptor tessera created": (opendht_close(UNRESTORED, "libtessera_atom.so"), 1),
        "a lock-order inversion inside OpenDHT": (LOCK_ORDER, 1),
        "the reuse CI saw of a socket libuv accepted": (libuv_reuse(LIBUV_READ, "uv__accept"), 0),
        "a libuv socket whose earlier access is tessera's": (libuv_reuse(TESSERA_READ, "uv__accept"), 1),
        "a libuv socket whose earlier access was not restored": (libuv_reuse(UNRESTORED, "uv__accept"), 1),
        "a descriptor not accepted by libuv": (libuv_reuse(LIBUV_READ, "uv__tcp_connect"), 1),
    }
    failed = 0
    for name, (text, want) in cases.items():
        status, out = judge(text)
        ok = status == want and (want == 0 or "==== " in out)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {status}, want {want}")
        failed += not ok
    status, _ = judge(opendht_close(UNRESTORED, "libopendht.so.2"), LOCK_ORDER)
    print(f"{'ok  ' if status == 1 else 'FAIL'} one allowed and one other report: exit {status}, want 1")
    failed += status != 1
    status, out = judge()
    print(f"{'ok  ' if status == 0 else 'FAIL'} no reports: exit {status}, want 0")
    failed += status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
