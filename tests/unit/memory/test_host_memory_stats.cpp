// The counting CPU allocator (memory/host_memory_stats.h): exact byte counts for allocations and
// frees of known size, the peak, storages from before install(), views, empty tensors, storage
// resizes, the raw interface and allocations from several threads.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "memory/host_memory_stats.h"

namespace tessera {
namespace {

class HostMemoryStats : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    made_before_install_ = !host_memory::installed();  // false when gtest repeats the suite
    before_install_ = new at::Tensor(at::empty({1000}, at::kFloat));
    host_memory::install();
  }
  static void TearDownTestSuite() { delete before_install_; }
  static at::Tensor* before_install_;
  static bool made_before_install_;
};
at::Tensor* HostMemoryStats::before_install_ = nullptr;
bool HostMemoryStats::made_before_install_ = false;

TEST_F(HostMemoryStats, InstallsItselfAsTheCpuAllocatorOnce) {
  EXPECT_TRUE(host_memory::installed());
  c10::Allocator* counting = c10::GetCPUAllocator();
  EXPECT_NE(counting, c10::GetDefaultCPUAllocator());
  host_memory::install();
  EXPECT_EQ(c10::GetCPUAllocator(), counting);
}

TEST_F(HostMemoryStats, CountsAllocationAndFreeExactly) {
  const int64_t base = host_memory::current();
  at::Tensor a = at::empty({1000}, at::kFloat);
  EXPECT_EQ(host_memory::current(), base + 4000);
  at::Tensor b = at::zeros({3, 7}, at::kDouble);
  EXPECT_EQ(host_memory::current(), base + 4000 + 3 * 7 * 8);
  a.reset();
  EXPECT_EQ(host_memory::current(), base + 3 * 7 * 8);
  b.reset();
  EXPECT_EQ(host_memory::current(), base);
}

TEST_F(HostMemoryStats, PeakIsTheHighestLiveTotal) {
  host_memory::reset_peak();
  const int64_t base = host_memory::current();
  EXPECT_EQ(host_memory::peak(), base);
  {
    at::Tensor a = at::empty({1 << 20}, at::kByte);
    at::Tensor b = at::empty({2 << 20}, at::kByte);
    a.reset();
    at::Tensor c = at::empty({1 << 19}, at::kByte);
    EXPECT_EQ(host_memory::current(), base + (2 << 20) + (1 << 19));
  }
  EXPECT_EQ(host_memory::current(), base);
  EXPECT_EQ(host_memory::peak(), base + (3 << 20));
  host_memory::reset_peak();
  EXPECT_EQ(host_memory::peak(), base);
}

TEST_F(HostMemoryStats, StorageFromBeforeInstallIsNotCounted) {
  if (!made_before_install_) GTEST_SKIP() << "install() ran before this suite was set up (a repeated run)";
  const int64_t base = host_memory::current();
  before_install_->reset();
  EXPECT_EQ(host_memory::current(), base);
}

TEST_F(HostMemoryStats, ViewsAndEmptyTensorsAllocateNothing) {
  at::Tensor t = at::empty({8, 16}, at::kFloat);
  const int64_t base = host_memory::current();
  at::Tensor v = t.narrow(0, 2, 3).view({-1});
  at::Tensor w = t.t();
  at::Tensor e = at::empty({0}, at::kFloat);
  EXPECT_EQ(host_memory::current(), base);
  EXPECT_EQ(e.data_ptr(), nullptr);
}

TEST_F(HostMemoryStats, DataIsAlignedAndUsable) {
  at::Tensor t = at::arange(1000, at::kFloat);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % c10::gAlignment, 0u);
  EXPECT_EQ(t.sum().item<double>(), 999.0 * 1000 / 2);
  at::Tensor copy = t.clone();
  EXPECT_TRUE(at::equal(copy, t));
}

TEST_F(HostMemoryStats, StorageResizeCountsTheNewSize) {
  const int64_t base = host_memory::current();
  at::Tensor t = at::arange(10, at::kFloat);
  t.resize_({100});
  EXPECT_EQ(host_memory::current(), base + 400);
  EXPECT_EQ(t.narrow(0, 0, 10).sum().item<double>(), 45.0);
  t.reset();
  EXPECT_EQ(host_memory::current(), base);
}

TEST_F(HostMemoryStats, RawInterfaceRoundTrips) {
  c10::Allocator* allocator = c10::GetCPUAllocator();
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  const int64_t base = host_memory::current();
  void* p = allocator->raw_allocate(123);
  EXPECT_EQ(host_memory::current(), base + 123);
  allocator->raw_deallocate(p);
  EXPECT_EQ(host_memory::current(), base);
}

TEST_F(HostMemoryStats, CountsAllocationsOfOtherThreads) {
  const int64_t base = host_memory::current();
  constexpr int kThreads = 4, kEach = 500, kBytes = 1000;
  std::vector<std::vector<at::Tensor>> kept(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&kept, i] {
      for (int j = 0; j < kEach; ++j) {
        kept[i].push_back(at::empty({kBytes}, at::kByte));
        at::empty({kBytes}, at::kByte);  // freed at once
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(host_memory::current(), base + int64_t{kThreads} * kEach * kBytes);
  EXPECT_GE(host_memory::peak(), host_memory::current());
  kept.clear();
  EXPECT_EQ(host_memory::current(), base);
}

}  // namespace
}  // namespace tessera
