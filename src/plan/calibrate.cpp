// This machine measured as a cluster file (calibrate.h).
#include "plan/calibrate.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/group.h"
#include "core/error.h"
#include "core/host_heap.h"
#include "memory/activation_codec.h"
#include "optim/optimizer.h"
#include "plan/calibrate_timing.h"

namespace tessera::plan {
namespace {

struct MatmulFit {
  double tflops = 0, overhead_us = 0;
};

struct Shape {
  int64_t m, k, n;
};
const std::vector<Shape> kShapes = {{128, 128, 128},  {256, 256, 256},  {512, 512, 512},  {1024, 1024, 1024},
                                    {2048, 128, 512}, {4096, 512, 128}, {512, 2048, 512}, {2048, 256, 1024}};

MatmulFit fit_matmul(c10::ScalarType dtype, double budget) {
  std::vector<double> flops;
  std::vector<std::function<void()>> ops;
  for (const Shape& s : kShapes) {
    const at::Tensor a = at::randn({s.m, s.k}).to(dtype), b = at::randn({s.k, s.n}).to(dtype);
    at::Tensor c = at::empty({s.m, s.n}, a.options());
    ops.push_back([a, b, c]() mutable { at::mm_out(c, a, b); });
    flops.push_back(2.0 * static_cast<double>(s.m * s.k * s.n));
  }
  const std::vector<double> seconds = calibration::medians_in_rounds(ops, budget);
  const auto [intercept, per_flop] = calibration::fit_line(flops, seconds);
  require(per_flop > 0, "tessera plan calibrate: the products' times did not grow with their size");
  return {1e-12 / per_flop, std::max(0.0, intercept) * 1e6};
}

// Causal softmax attention (the fused kernel), forward and backward, at four shapes, counted as the
// planner counts it (model/operations.h: 2 b h s^2 d forward, the backward 2.5x): the fitted rate.
double fit_attention(c10::ScalarType dtype, double budget) {
  struct Shape {
    int64_t b, h, s, d;
  };
  std::vector<double> flops;
  std::vector<std::function<void()>> ops;
  for (const Shape& x : {Shape{4, 8, 128, 32}, Shape{2, 8, 256, 64}, Shape{1, 8, 512, 64}, Shape{1, 4, 1024, 64}}) {
    const at::Tensor q = at::randn({x.b, x.h, x.s, x.d}).to(dtype).set_requires_grad(true);
    ops.push_back([q] {
      at::Tensor o = at::scaled_dot_product_attention(q, q, q, {}, 0.0, /*is_causal=*/true);
      o.sum().backward();
    });
    flops.push_back(3.5 * 2.0 * static_cast<double>(x.b * x.h * x.s * x.s * x.d));
  }
  const std::vector<double> seconds = calibration::medians_in_rounds(ops, budget);
  const auto [intercept, per_flop] = calibration::fit_line(flops, seconds);
  require(per_flop > 0, "tessera plan calibrate: the attention times did not grow with their size");
  return 1e-12 / per_flop;
}

// Memory-bound kernels as a step runs them: LayerNorm then GELU, forward and backward through
// autograd, at four sizes; the bytes counted as the planner counts them (model/operations.h: each
// reads and writes its tensor, the backward twice that: 24 bytes per float32 element each), fitted
// as time = a + bytes / bandwidth.
double fit_memory_kernels(double budget) {
  std::vector<double> bytes, seconds;
  for (int64_t rows : {256, 1024, 4096, 16384}) {
    const int64_t width = 256;
    const at::Tensor x = at::randn({rows, width}).set_requires_grad(true);
    const at::Tensor weight = at::ones({width}).set_requires_grad(true), bias = at::zeros({width}).set_requires_grad(true);
    seconds.push_back(calibration::median_seconds(
        [&] { at::gelu(at::layer_norm(x, {width}, weight, bias)).sum().backward(); }, budget));
    bytes.push_back(48.0 * static_cast<double>(rows * width));
  }
  const auto [intercept, per_byte] = calibration::fit_line(bytes, seconds);
  require(per_byte > 0, "tessera plan calibrate: the memory-bound kernels' times did not grow with their size");
  return 1e-9 / per_byte;
}
// Runs `work(rank)` in `ranks` forked processes at once (each with one intra-op thread) and returns
// what each reports through its pipe (`values` doubles), by rank; a process that fails or reports
// short is refused naming `what`.
std::vector<std::vector<double>> in_processes(int64_t ranks, size_t values, const std::string& what,
                                              const std::function<std::vector<double>(int rank)>& work) {
  std::vector<int> readers;
  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    int fds[2];
    require(pipe(fds) == 0, "tessera plan calibrate: pipe() failed");
    const pid_t pid = fork();
    require(pid >= 0, "tessera plan calibrate: fork() failed");
    if (pid == 0) {
      close(fds[0]);
      at::set_num_threads(1);
      const std::vector<double> out = work(rank);
      const ssize_t size = static_cast<ssize_t>(out.size() * sizeof(double));
      const ssize_t written = write(fds[1], out.data(), static_cast<size_t>(size));
      _exit(written == size && out.size() == values ? 0 : 1);
    }
    close(fds[1]);
    readers.push_back(fds[0]);
    children.push_back(pid);
  }
  std::vector<std::vector<double>> reported;
  for (size_t r = 0; r < readers.size(); ++r) {
    std::vector<double> got(values);
    const ssize_t want = static_cast<ssize_t>(values * sizeof(double));
    const ssize_t read_bytes = read(readers[r], got.data(), static_cast<size_t>(want));
    close(readers[r]);
    int status = 0;
    waitpid(children[r], &status, 0);
    require(read_bytes == want && WIFEXITED(status) && WEXITSTATUS(status) == 0, "tessera plan calibrate: a process ",
            what, " failed");
    reported.push_back(std::move(got));
  }
  return reported;
}

// The median time of a product (1024^3) or of memory-bound kernels (LayerNorm then GELU forward and
// backward over [4096, 256]) in `ranks` processes computing at once: their mean. Products hardly
// slow down when CPU cores share memory; memory-bound kernels may (2% to 28% with two processes in
// four calibrations here, docs/plan.md).
double concurrent_seconds(bool products, int64_t ranks, double budget) {
  const auto times = in_processes(ranks, 1, "timing the shared cores", [&](int) {
    const at::Tensor a = at::randn({1024, 1024}), b = at::randn({1024, 1024});
    at::Tensor c = at::empty({1024, 1024});
    const at::Tensor x = at::randn({4096, 256}).set_requires_grad(true);
    const at::Tensor w = at::ones({256}), bias = at::zeros({256});
    return std::vector<double>{calibration::median_seconds(
        [&] {
          if (products) at::mm_out(c, a, b);
          else at::gelu(at::layer_norm(x, {256}, w, bias)).sum().backward();
        },
        budget)};
  });
  double mean = 0;
  for (const std::vector<double>& t : times) mean += t[0] / static_cast<double>(ranks);
  return mean;
}

// That time with `ranks` processes computing at once over one alone (processes, as ranks
// run: threads of one process share less than processes do).
double shared_slowdown(bool products, int64_t ranks, double budget) {
  if (ranks <= 1) return 1;
  const double alone = concurrent_seconds(products, 1, budget);
  return std::max(1.0, concurrent_seconds(products, ranks, budget) / alone);
}

struct LinkFit {
  double gbs = 0, latency_us = 0;
};

// Gloo all-reduce of two idle ranks of this process (a thread each, one store), 1 KiB to 16 MiB of
// float32: time = 2 latency + bytes / bandwidth (n = 2: 2 (n-1)/n = 1). The ring steps' own latency.
LinkFit fit_gloo_idle(double budget) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> bytes, seconds;
  for (int64_t kib = 1; kib <= 16384; kib *= 4) bytes.push_back(static_cast<double>(kib * 1024));
  std::vector<std::vector<double>> times(2);
  auto rank_main = [&](int rank) {
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, 2, options);
    for (double b : bytes) {
      std::vector<at::Tensor> tensors = {at::ones({static_cast<int64_t>(b) / 4})};
      // Both ranks run the same number of all-reduces: a fixed count from the size.
      const int reps = std::max(5, static_cast<int>(budget * 2e8 / std::max(b, 1e5)));
      group->allreduce(tensors)->wait();
      std::vector<double> each;
      for (int i = 0; i < reps; ++i) {
        const calibration::Clock::time_point t = calibration::Clock::now();
        group->allreduce(tensors)->wait();
        each.push_back(calibration::seconds_since(t));
      }
      times[static_cast<size_t>(rank)].push_back(calibration::median(std::move(each)));
    }
  };
  std::thread other(rank_main, 1);
  rank_main(0);
  other.join();
  for (size_t i = 0; i < bytes.size(); ++i) seconds.push_back(std::max(times[0][i], times[1][i]));
  const auto [intercept, per_byte] = calibration::fit_line(bytes, seconds);
  require(per_byte > 0, "tessera plan calibrate: the all-reduce times did not grow with their size");
  return {1e-9 / per_byte, std::max(0.0, intercept) / 2 * 1e6};
}

// A collective as training meets it: two ranks (forked processes, one thread each, a file store)
// that each compute a block's mix of work (a [256, 1024] x [1024, 1024] product, LayerNorm and GELU
// forward and backward) and then all-reduce, 1 KiB to 16 MiB of float32, through tessera's own
// comm::Group (its queue thread, Gloo underneath). A rank's call lasts the collective and its wait
// for the other rank's compute, which on cores the ranks share varies from call to call: the mean
// call over both ranks is what a step's sync point adds beyond the mean compute. Fitted: time = 2
// latency + bytes / bandwidth (n = 2: 2 (n-1)/n = 1). Idle, the same all-reduce's fixed cost is a
// fifth to a tenth of this one's here (0.1-0.3 ms a call against 1-2 ms): the difference is each
// call's overhead (intra_node.call_overhead_us), which the planner lacked when it under-priced
// every two-rank layout of bench/plan_runs_here.py (docs/plan.md).
LinkFit fit_gloo_loaded(double budget) {
  std::vector<double> bytes;
  for (int64_t kib = 1; kib <= 16384; kib *= 4) bytes.push_back(static_cast<double>(kib * 1024));
  const std::string path = "/tmp/tessera_calibrate_store_" + std::to_string(getpid());
  std::remove(path.c_str());
  const auto means = in_processes(2, bytes.size(), "measuring the all-reduce", [&](int rank) {
    auto store = c10::make_intrusive<c10d::FileStore>(path, 2);
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, 2, options);
    comm::Group group("calibrate", {0, 1}, rank, backend, std::chrono::milliseconds(120000));
    const at::Tensor a = at::randn({256, 1024}), b = at::randn({1024, 1024});
    at::Tensor c = at::empty({256, 1024});
    const at::Tensor x = at::randn({1024, 256}).set_requires_grad(true);
    const at::Tensor w = at::ones({256}), bias = at::zeros({256});
    std::vector<double> out;
    for (double size : bytes) {
      const at::Tensor t = at::ones({static_cast<int64_t>(size) / 4});
      // Both ranks run the same number of calls: a fixed count from the size.
      const int reps = std::max(8, static_cast<int>(budget * 4e8 / std::max(size, 1e5)));
      group.all_reduce(t);
      double total = 0;
      for (int i = 0; i < reps; ++i) {
        at::mm_out(c, a, b);
        at::gelu(at::layer_norm(x, {256}, w, bias)).sum().backward();
        const calibration::Clock::time_point start = calibration::Clock::now();
        group.all_reduce(t);
        total += calibration::seconds_since(start);
      }
      out.push_back(total / reps);
    }
    return out;
  });
  std::remove(path.c_str());
  std::vector<double> seconds(bytes.size(), 0.0);
  for (const std::vector<double>& rank : means)
    for (size_t i = 0; i < bytes.size(); ++i) seconds[i] += rank[i] / 2;
  const auto [intercept, per_byte] = calibration::fit_line(bytes, seconds);
  require(per_byte > 0, "tessera plan calibrate: the all-reduce times did not grow with their size");
  return {1e-9 / per_byte, std::max(0.0, intercept) / 2 * 1e6};
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "CPU";
}


}  // namespace

std::string calibrate_this_machine(const CalibrateOptions& options,
                                   const std::function<void(const std::string&)>& progress) {
  const int64_t cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t ranks = options.ranks > 0 ? options.ranks : cores;
  const double budget = options.seconds_per_point;
  at::set_num_threads(1);  // one rank: one process with one intra-op thread
  // Allocate as a training step does (TrainStep): blocks up to 32 MiB from a heap never trimmed.
  // With glibc's defaults each measured kernel's fresh outputs were faulted in anew, and two
  // calibrations minutes apart measured the int8 codec at 6.72 and 1.28 GB/s, memory_gbs at 11.4
  // and 6.2 (docs/plan.md, "Calibrating a machine").
  keep_host_heap();

  progress("fp32 products at " + std::to_string(kShapes.size()) + " shapes");
  const MatmulFit fp32 = fit_matmul(at::kFloat, budget);
  progress("bf16 products");
  const MatmulFit bf16 = fit_matmul(at::kBFloat16, budget);
  progress("causal attention, forward and backward, at 4 shapes");
  const double attention_fp32 = fit_attention(at::kFloat, budget);
  const double attention_bf16 = fit_attention(at::kBFloat16, budget);
  progress("memory-bound kernels (LayerNorm, GELU) and kernel overhead");
  const double memory_gbs = fit_memory_kernels(budget);
  // A training step's kernels run through autograd.
  const double overhead_us = calibration::autograd_kernel_us(at::kCPU, budget);
  progress("the optimizer step (AdamW) on the host");
  const double host_optimizer_gbs = calibration::adamw_host_gbs(4 << 20, budget);
  progress("the activation codecs (int8, int4, fp8, bf16), encoding and decoding 32 MiB");
  const double codec_int8 = calibration::activation_codec_gbs("int8", at::kCPU, budget);
  const double codec_int4 = calibration::activation_codec_gbs("int4", at::kCPU, budget);
  const double codec_fp8 = calibration::activation_codec_gbs("fp8", at::kCPU, budget);
  const double codec_bf16 = calibration::activation_codec_gbs("bf16", at::kCPU, budget);
  progress(std::to_string(ranks) + " processes computing at once");
  const double slowdown = shared_slowdown(true, ranks, budget * 5);
  const double memory_slowdown = shared_slowdown(false, ranks, budget * 5);
  progress("Gloo all-reduce between two idle ranks over loopback, 1 KiB to 16 MiB");
  const LinkFit idle = fit_gloo_idle(budget);
  progress("all-reduce between two computing processes over loopback, 1 KiB to 16 MiB");
  const LinkFit link = fit_gloo_loaded(budget);
  double round_cpu = 0;
  std::string round_cpu_basis = "not measured (a build without the swarm)";
  if (options.round_cpu_ns_per_byte) {
    progress("an averaging round's CPU: 4 peers summing 16 MiB round a ring over loopback TLS");
    round_cpu = options.round_cpu_ns_per_byte(4, 4 << 20, budget * 10);
    round_cpu_basis = "4 peers in one process averaging 16 MiB of float32 round a ring over loopback TLS "
                      "(atom/round_cpu.h): the process's CPU over the bytes they sent";
  }
  // Per call, beyond the idle ring's two steps: what the loaded fit's intercept adds.
  const double call_overhead_us = std::max(0.0, 2 * (link.latency_us - idle.latency_us));

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  char host[256] = "this machine";
  gethostname(host, sizeof host - 1);
  const std::string by = std::string("# measured by `tessera plan calibrate` on ") + host + ", " + date;
  const std::string cpu = cpu_name();
  const double host_gib = calibration::host_memory_gib();
  char text[8192];
  std::snprintf(
      text, sizeof text,
      "%s\n"
      "# One rank is one process with one intra-op thread; the device is one core's share.\n"
      "[cluster]\n"
      "description = \"%s: %lld ranks of one thread each (calibrated)\"\n"
      "devices_per_node = %lld\n"
      "nodes = 1\n"
      "shared_slowdown = %.3f       # a 1024^3 product: median time in %lld processes at once over one alone\n"
      "shared_slowdown_memory = %.3f  # LayerNorm then GELU forward and backward over [4096, 256]: the same\n\n"
      "[device]\n"
      "name = \"%s (one thread)\"\n"
      "kind = \"cpu\"\n"
      "peak_tflops_bf16 = %.5f     # no published CPU peak: the measured rate below (MFU = fraction of it)\n"
      "peak_tflops_fp32 = %.5f\n"
      "matmul_tflops_bf16 = %.5f   # bf16 products at %zu shapes, fitted: time = overhead + FLOPs / rate\n"
      "matmul_tflops_fp32 = %.5f   # fp32, the same fit\n"
      "matmul_overhead_us = %.2f    # the fp32 fit's intercept less kernel_overhead_us\n"
      "attention_tflops_bf16 = %.5f  # causal SDPA forward + backward at 4 shapes, counted as the planner counts it, fitted\n"
      "attention_tflops_fp32 = %.5f\n"
      "memory_gib = %.1f            # MemTotal\n"
      "memory_gbs = %.2f            # LayerNorm + GELU forward and backward through autograd at 4 sizes, bytes counted as the planner counts them, fitted\n"
      "kernel_overhead_us = %.2f     # 32 chained adds on 8 elements, forward and backward through autograd: median time / 64\n"
      "socket_gbs = %.4f           # a send's copying on a core: the loaded loopback all-reduce's bandwidth ([intra_node] below)\n"
      "activation_codec_int8_gbs = %.2f  # int8 encoding and decoding of a [16384, 512] float32 activation: source bytes / median time\n"
      "activation_codec_int4_gbs = %.2f  # the same, int4\n"
      "activation_codec_fp8_gbs = %.2f   # the same, fp8\n"
      "activation_codec_bf16_gbs = %.2f  # the same, bf16\n\n"
      "[intra_node]\n"
      "bandwidth_gbs = %.4f        # all-reduce of 2 processes that compute between calls (comm::Group, Gloo, loopback), 1 KiB to 16 MiB: mean call, fitted: time = 2 latency + bytes / bandwidth\n"
      "latency_us = %.1f           # the same all-reduce between 2 idle threads, fitted the same way\n"
      "call_overhead_us = %.1f     # the loaded fit's intercept less the idle one's: each call's wait at its sync point\n\n"
      "[inter_node]\n"
      "bandwidth_gbs = %.4f        # not measured (one node): the loopback link again\n"
      "latency_us = %.1f\n"
      "call_overhead_us = %.1f\n\n"
      "[host]\n"
      "memory_gib = %.1f            # MemTotal\n"
      "device_link_gbs = %.2f       # the host is the device: its memory bandwidth\n"
      "optimizer_gbs = %.2f         # AdamW's step over 4M float32 elements, 28 bytes per element, over shared_slowdown_memory\n\n"
      "[peers]\n"
      "bandwidth_gbs = %.4f        # peers on this machine talk over loopback TCP: the loaded fit (above)\n"
      "latency_us = %.1f\n"
      "round_overhead_ms = 0       # not measured\n"
      "cpu_ns_per_byte = %.2f       # %s\n",
      by.c_str(), cpu.c_str(), static_cast<long long>(ranks), static_cast<long long>(ranks), slowdown,
      static_cast<long long>(ranks), memory_slowdown, cpu.c_str(), bf16.tflops, fp32.tflops, bf16.tflops, kShapes.size(),
      fp32.tflops, std::max(0.0, fp32.overhead_us - overhead_us), attention_bf16, attention_fp32, host_gib, memory_gbs, overhead_us,
      link.gbs, codec_int8, codec_int4, codec_fp8, codec_bf16, link.gbs, idle.latency_us, call_overhead_us, link.gbs,
      idle.latency_us, call_overhead_us, host_gib, memory_gbs, host_optimizer_gbs / memory_slowdown, link.gbs, link.latency_us,
      round_cpu, round_cpu_basis.c_str());
  return text;
}

namespace calibration {

double adamw_host_gbs(int64_t elements, double budget) {
  at::Tensor p = at::randn({elements}), g = at::randn({elements});
  OptimOptions adamw;
  adamw.name = "adamw";
  auto optimizer = make_optimizer(adamw, {{"p", p}});
  p.mutable_grad() = g;
  const double seconds = median_seconds([&] { optimizer->step(1e-4); }, budget);
  return 28.0 * static_cast<double>(elements) / seconds / 1e9;
}

double autograd_kernel_us(c10::Device device, double budget, const std::function<void()>& synchronize) {
  const at::Tensor xs = at::randn({8}, at::TensorOptions().device(device)).set_requires_grad(true);
  const double seconds = median_seconds(
      [&] {
        at::Tensor z = xs;
        for (int i = 0; i < 32; ++i) z = z + 1.0;
        z.sum().backward();
        if (synchronize) synchronize();
      },
      budget);
  return seconds / 64 * 1e6;
}

double activation_codec_seconds(const at::Tensor& activation, const std::string& codec, double budget,
                                const std::function<void()>& synchronize) {
  const ActivationCodec parsed = parse_activation_codec(codec);
  at::NoGradGuard no_grad;
  return median_seconds(
      [&] {
        decode_activation(encode_activation(activation, parsed));
        if (synchronize) synchronize();
      },
      budget);
}

double activation_codec_gbs(const std::string& codec, c10::Device device, double budget,
                            const std::function<void()>& synchronize) {
  const at::Tensor a = at::randn({16384, 512}, at::TensorOptions().device(device));
  return static_cast<double>(a.nbytes()) / activation_codec_seconds(a, codec, budget, synchronize) / 1e9;
}

double host_memory_gib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib / (1024.0 * 1024.0);
    in.ignore(256, '\n');
  }
  return 0;
}

}  // namespace calibration

}  // namespace tessera::plan
