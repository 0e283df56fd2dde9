// Host memory statistics: live and peak bytes of CPU tensor storage, counted by an allocator that
// wraps c10's default CPU allocator (installed with c10::SetCPUAllocator). `tessera bench` uses it
// to measure what a model, its optimizer and DataParallel hold per rank (docs/zero_memory.md).
//
// What is counted: the bytes requested by every CPU storage allocated after install() (at::empty,
// storage resizes, FlatUnit::materialize, ...), until that storage is freed. Each allocation's
// DataPtr carries the counting deleter, so a storage allocated before install() is never counted,
// neither when made nor when freed; views allocate nothing. Memory that libtorch, Gloo or the C++
// runtime obtain outside tensor storage (malloc, new) is not counted.
//
// Invariants:
// - Each counted allocation asks the default allocator for c10::gAlignment extra bytes in front
//   of the data, where it keeps its size; the data pointer stays aligned to c10::gAlignment, and
//   the DataPtr's context is its data pointer, so raw_allocate/raw_deallocate and copy-on-write
//   clones keep working. The header bytes are not counted.
// - current() and peak() are exact whenever no allocation or free is in flight; they are updated
//   atomically, so allocations from several threads (the communication thread) are all counted.
// - peak() >= current(); reset_peak() makes peak() equal current() (both up to allocations made
//   by other threads during the call).
#pragma once

#include <cstdint>

namespace tessera::host_memory {

// Makes the counting allocator c10's CPU allocator (SetCPUAllocator priority kInstallPriority,
// above the default's 0). Only the first call installs; later calls do nothing. Throws
// tessera::Error if the default allocator lacks the raw interface the wrapper relies on.
void install();
bool installed();

// Bytes of counted CPU storage live now, and the most live at once since install() or the last
// reset_peak(). Both are 0 before install().
int64_t current();
int64_t peak();
void reset_peak();

constexpr uint8_t kInstallPriority = 1;

}  // namespace tessera::host_memory
