// The counting CPU allocator behind host_memory::current()/peak() (host_memory_stats.h).
//
// Layout of one counted allocation of n > 0 bytes, as obtained from the default allocator:
//
//   base                     base + kHeader = data (the DataPtr's pointer and context)
//   | n as size_t, padding   | n bytes of tensor storage                              |
//
// The deleter reads n back from the header, subtracts it and hands `base` to the default
// allocator's raw deleter. A request for 0 bytes gets a null DataPtr with the same deleter (which
// ignores null), as the default allocator returns null for it.
#include "memory/host_memory_stats.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>

#include "core/error.h"

namespace tessera::host_memory {
namespace {

constexpr size_t kHeader = c10::gAlignment;
static_assert(kHeader >= sizeof(size_t), "the header must hold the allocation's size");

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};
c10::Allocator* g_default = nullptr;
c10::DeleterFnPtr g_default_delete = nullptr;

void add(int64_t bytes) {
  const int64_t now = g_current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t high = g_peak.load(std::memory_order_relaxed);
  while (now > high && !g_peak.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
  }
}

void counted_delete(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  size_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  g_current.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  g_default_delete(base);
}

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &counted_delete, cpu};
    c10::DataPtr inner = g_default->allocate(n + kHeader);
    // The default allocator's context is its data pointer (it has a raw deleter, checked at
    // install), so releasing the context takes ownership of the block.
    char* base = static_cast<char*>(inner.release_context());
    std::memcpy(base, &n, sizeof n);
    add(static_cast<int64_t>(n));
    void* data = base + kHeader;
    return {data, data, &counted_delete, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingAllocator g_counting;

}  // namespace

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_default = c10::GetDefaultCPUAllocator();
    g_default_delete = g_default->raw_deleter();
    require(g_default_delete != nullptr,
            "host memory statistics: c10's default CPU allocator has no raw deleter; cannot wrap it");
    c10::SetCPUAllocator(&g_counting, kInstallPriority);
    require(c10::GetCPUAllocator() == &g_counting,
            "host memory statistics: another CPU allocator of priority above ", int(kInstallPriority),
            " is installed; the counting allocator was not");
    g_installed = true;
  });
}

bool installed() { return g_installed.load(); }

int64_t current() { return g_current.load(std::memory_order_relaxed); }

int64_t peak() { return g_peak.load(std::memory_order_relaxed); }

void reset_peak() { g_peak.store(g_current.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace tessera::host_memory
