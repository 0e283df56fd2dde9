// How tessera's processes end (the `tessera` binary and the test programs).
// By the time main() returns, the program's own objects are gone (run directories unlocked, files
// closed, threads joined); what remains are static objects, libtorch's operator registry above all,
// whose destructors cost about 85 ms of CPU a process, a third of its start (measured on a 2-core
// machine: 0.27 s against 0.185 s for a libtorch program that ends at once). `make test` starts
// over a thousand such processes. So a process flushes its output and ends by _exit.
#pragma once

namespace tessera {

// Flushes stdout and stderr (the C and the C++ streams) and ends the process with `code`, without
// static destructors or atexit handlers. Under AddressSanitizer or ThreadSanitizer it returns
// `code` instead, for main() to return, so that the sanitizer's checks at exit run.
int end_process(int code);

}  // namespace tessera
