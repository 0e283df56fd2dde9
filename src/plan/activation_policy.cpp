// The activation policy for a device budget (activation_policy.h).
#include "plan/activation_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/byte_size.h"
#include "memory/activation_codec.h"
#include "model/operations.h"
#include "parallel/pipeline/schedule.h"
#include "plan/activation_estimate.h"
#include "plan/layout.h"
#include "plan/memory_estimate.h"

namespace tessera {
namespace {

// `attention`: memory.attention_compression ("same": the block's codec; the run's by default).
double block_bytes(const Config& config, const ParallelDims& dims, int64_t layer, const std::string& checkpointing,
                   const std::string& compression, const std::string& attention = "") {
  Config c = config;
  c.memory.activation_policy = "manual";  // the estimate then counts the option's codec
  c.memory.activation_checkpointing = checkpointing;
  c.memory.activation_compression = compression;
  if (!attention.empty()) c.memory.attention_compression = attention;
  return block_activation_bytes(c, dims, layer);
}

// "none" and the codecs memory.activation_compression allows the policy.
std::vector<std::string> codec_choices(const Config& config) {
  std::vector<std::string> out{"none"};
  for (ActivationCodec codec : parse_activation_codecs(config.memory.activation_compression))
    out.push_back(activation_codec_name(codec));
  return out;
}

// The attention core's share of the block's forward FLOPs (what selective checkpointing redoes).
double core_share(const Config& config, const ParallelDims& dims, int64_t layer) {
  OperationShape shape;
  shape.batch = config.train.batch_size;
  shape.seq_len = config.train.seq_len;
  shape.tp = dims.tp();
  shape.sp = dims.sp();
  shape.ep = dims.ep();
  shape.megatron_sp = config.parallel.megatron_sp;
  shape.sp_method = config.parallel.sp_method;
  double core = 0, all = 0;
  for (const Operation& op : block_operations(config.model, layer, shape)) {
    all += op.flops;
    if (op.attention_core) core += op.flops;
  }
  return all > 0 ? core / all : 0;
}

// Preference among one kind's blocks: offload to the earliest, keeping to the latest; an encoded
// option before the same option unencoded (and, in the sort below, the smaller encoding first).
int order(const ActivationOption& o) {
  const int kind = o.offload ? (o.checkpointing == "full" ? 0 : 1)
                             : o.checkpointing == "full" ? 2 : o.checkpointing == "selective" ? 3 : 4;
  return 2 * kind + (o.compression == "none" ? 1 : 0);
}

bool same_options(const std::vector<ActivationOption>& a, const std::vector<ActivationOption>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name() != b[i].name() || a[i].bytes != b[i].bytes || a[i].group != b[i].group ||
        a[i].seconds != b[i].seconds)
      return false;
  return true;
}

// The reserve an option needs beside the blocks' held bytes: the largest offloaded group as many
// times as groups can be in flight, the largest fully recomputed block once (its backward holds it
// whole).
struct Caps {
  double group = 0, whole = 0;
  int64_t groups_in_flight = 2;
  double reserve() const { return static_cast<double>(groups_in_flight) * group + whole; }
  bool allow(const ActivationOption& o, double whole_of_block) const {
    return (!o.offload || o.group <= group) && (o.checkpointing != "full" || whole_of_block <= whole);
  }
};

constexpr double kNever = std::numeric_limits<double>::infinity();

// Each block's whole activations (what its full recomputation holds in the backward: its first
// option's bytes), and the caps worth trying: no offload or each offloaded group's size, and no
// recomputation or each block's whole.
struct CapChoices {
  std::vector<double> whole;
  std::set<double> groups{0}, wholes{0};
};

CapChoices cap_choices(const std::vector<std::vector<ActivationOption>>& options) {
  CapChoices out;
  for (const auto& block : options) {
    out.whole.push_back(block.front().bytes);
    out.wholes.insert(block.front().bytes);
    for (const ActivationOption& o : block)
      if (o.offload) out.groups.insert(o.group);
  }
  return out;
}

// What an option holds at the moment that needs the most of it (choose_activation_policy).
double held_bytes(const ActivationOption& o, const std::vector<HeldMoment>& moments) {
  double most = 0;
  for (const HeldMoment& m : moments)
    most = std::max(most, m.before_i * o.bytes + m.awaiting_w * o.awaiting + m.offloaded * o.held_stays);
  return most;
}

// The most micro-batches of any moment.
double most_held(const std::vector<HeldMoment>& moments) {
  double most = 0;
  for (const HeldMoment& m : moments) most = std::max(most, m.before_i + m.awaiting_w + m.offloaded);
  return most;
}

// The least bytes `caps` allows: its reserve and each block's smallest allowed option at
// `moments` (never when a block has none).
double least_bytes(const std::vector<std::vector<ActivationOption>>& options, const std::vector<double>& whole,
                   const Caps& caps, const std::vector<HeldMoment>& moments) {
  double least = caps.reserve();
  for (size_t l = 0; l < options.size(); ++l) {
    double m = kNever;
    for (const ActivationOption& o : options[l])
      if (caps.allow(o, whole[l])) m = std::min(m, held_bytes(o, moments));
    least += m;
  }
  return least;
}

// The smallest any choice of `options` holds.
double smallest_bytes(const std::vector<std::vector<ActivationOption>>& options,
                      const std::vector<HeldMoment>& moments, int64_t groups_in_flight) {
  const CapChoices choices = cap_choices(options);
  double smallest = kNever;
  for (double g : choices.groups)
    for (double w : choices.wholes)
      smallest = std::min(smallest, least_bytes(options, choices.whole, Caps{g, w, groups_in_flight}, moments));
  return smallest;
}

// The options of `share`'s blocks, in its order.
std::vector<std::vector<ActivationOption>> share_options(const std::vector<std::vector<ActivationOption>>& all,
                                                         const ActivationShare& share) {
  std::vector<std::vector<ActivationOption>> out;
  for (int64_t layer : share.layers) out.push_back(all.at(static_cast<size_t>(layer)));
  return out;
}

// The host link an offload's copies cross: measured on CUDA, modelled on a CPU "device", whose
// memcpys also take the computing cores' time (per byte each way).
struct HostLink {
  double bytes_per_s = 0, core_seconds_per_byte = 0;
};
HostLink host_link(const Config& config, const BlockCosts& measured, bool cpu_device) {
  return {measured.link_bytes_per_s > 0 ? measured.link_bytes_per_s : config.memory.modelled_bandwidth_gbps * 1e9,
          cpu_device && measured.copy_bytes_per_s > 0 ? 1 / measured.copy_bytes_per_s : 0};
}

// Each way a pipeline rank may keep R of the micro-batches it holds (in units of one stage) on the
// device and offload every block of the rest (ActivationPolicy::resident_micro_batches): its
// options paying their held group's copies for the share of its forwards offloaded
// (pipeline::held_offloaded_forwards), hidden behind the rank's stage (`stage`: its mean F and B
// per stage, from `measured`), its moments holding the others at their held_stays, its
// budget less 2 + v of the largest block's groups (never more than the offloaded micro-batches
// have; plan/memory_estimate.h). None under a split backward (an offloaded group fetched for I
// waits whole for its W: measured, the peak did not move) or where the rank holds one.
struct HeldOffload {
  int64_t resident = 0;
  double offloaded = 0, reserve = 0, budget_bytes = 0;
  std::vector<std::vector<ActivationOption>> options;
  std::vector<HeldMoment> moments;
};

std::vector<HeldOffload> held_offloads(const Layout& layout, const ActivationShare& share,
                                       const std::vector<std::vector<ActivationOption>>& options,
                                       const BlockCosts& measured, const HostLink& host) {
  std::vector<HeldOffload> out;
  double before = 0;
  for (const HeldMoment& m : share.moments) {
    if (m.awaiting_w > 0) return out;
    before = std::max(before, m.before_i);
  }
  const double chunks = static_cast<double>(layout.stage_of(share.pipeline_rank).chunks.size());
  const int64_t held = static_cast<int64_t>(std::llround(before * chunks));
  const std::vector<pipeline::Action>& row = layout.schedule().ranks.at(static_cast<size_t>(share.pipeline_rank));
  const double forwards =
      static_cast<double>(std::count_if(row.begin(), row.end(), [](const pipeline::Action& a) { return a.op == pipeline::Op::F; }));
  double largest = 0;
  for (const std::vector<ActivationOption>& block : options)
    for (const ActivationOption& o : block)
      if (!o.offload) largest = std::max(largest, o.bytes - o.held_stays);
  const double stage_blocks = static_cast<double>(options.size()) / chunks;
  double f = 0, b = 0;  // the rank's mean stage
  for (int64_t layer : share.layers)
    if (static_cast<size_t>(layer) < measured.block_split.size()) {
      f += measured.block_split[static_cast<size_t>(layer)].f / chunks;
      b += measured.block_split[static_cast<size_t>(layer)].b / chunks;
    }
  for (int64_t r = 1; r < held; ++r) {
    HeldOffload h;
    h.resident = r;
    h.offloaded = static_cast<double>(pipeline::held_offloaded_forwards(row, r).size()) / forwards;
    const double resident = static_cast<double>(r) / chunks;
    for (const HeldMoment& m : share.moments)
      h.moments.push_back({std::min(m.before_i, resident), 0, m.before_i - std::min(m.before_i, resident)});
    h.reserve = std::min(2 + chunks, static_cast<double>(held - r) * stage_blocks) * largest;
    h.budget_bytes = share.budget_bytes - h.reserve;
    h.options = options;
    for (std::vector<ActivationOption>& block : h.options)
      for (ActivationOption& o : block)
        o.seconds +=
            h.offloaded * offload_copy_seconds(o.held_group, f, b, host.bytes_per_s, host.core_seconds_per_byte);
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace

double offload_copy_seconds(double bytes, double forward_s, double backward_s, double link_bytes_per_s,
                            double core_seconds_per_byte) {
  const double one_way = link_bytes_per_s > 0 ? bytes / link_bytes_per_s : 0;
  return 2 * bytes * core_seconds_per_byte + std::max(0.0, one_way - backward_s) + std::max(0.0, one_way - forward_s);
}

std::string ActivationOption::name() const {
  const std::string kind = offload ? (checkpointing == "full" ? "full + offload" : "offload")
                                   : checkpointing == "none" ? "keep" : checkpointing;
  return compression == "none" ? kind : kind + " + " + compression;
}

const ActivationOption& ActivationPolicy::of(int64_t layer) const {
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i] == layer) return blocks[i];
  fail("internal: block ", layer, " is not among the activation policy's blocks");
}

int64_t ActivationPolicy::offloaded() const {
  int64_t n = 0;
  for (const ActivationOption& o : blocks) n += o.offload ? 1 : 0;
  return n;
}

std::vector<std::vector<ActivationOption>> activation_options(const Config& config, const ParallelDims& dims,
                                                              const BlockCosts& measured, bool cpu_device) {
  // The host link: measured on CUDA, modelled on a CPU "device".
  const HostLink host = host_link(config, measured, cpu_device);
  auto copy_seconds = [&](double bytes, double f, double b) {
    return offload_copy_seconds(bytes, f, b, host.bytes_per_s, host.core_seconds_per_byte);
  };
  const std::vector<std::string> codecs = codec_choices(config);
  std::vector<std::vector<ActivationOption>> out;
  for (int64_t l = 0; l < config.model.n_layer; ++l) {
    const size_t i = static_cast<size_t>(l);
    const double f = i < measured.block_split.size() ? measured.block_split[i].f : 0;
    const double b = i < measured.block_split.size() ? measured.block_split[i].b : 0;
    const double keep = block_bytes(config, dims, l, "none", "none");
    const double selective = block_bytes(config, dims, l, "selective", "none");
    const double input = block_bytes(config, dims, l, "full", "none");
    const double recompute_core = f * core_share(config, dims, l);
    const double stays = block_statistics_bytes(config, dims);  // an offloaded block's, on the device
    // After I, until W (a split backward): I's kept output gradients, and what W needs of the
    // forward's saved tensors less what the split released (counted at the option's encoding); an
    // offloaded block's fetched group stays whole until its last tensor goes (activation_offload.h);
    // a fully recomputed block finishes inside I.
    const double tokens = static_cast<double>(config.train.batch_size * (config.train.seq_len / dims.sp()));
    const AwaitingW after_i = awaiting_w_bytes_per_token(config, dims, l);
    const double kept = after_i.kept * tokens, released = after_i.released * tokens;
    std::vector<ActivationOption> options;
    // Encoding and decoding a byte of what a codec encodes (0 where it was not timed, or keeps it).
    auto codec_per_byte = [&](const std::string& codec) {
      const auto rate = measured.codec_seconds_per_byte.find(codec);
      return rate != measured.codec_seconds_per_byte.end() ? rate->second : 0;
    };
    // What the attention core saves, unencoded (only a block that keeps its activations saves it):
    // under memory.attention_compression encoded by its own codec, the rest by the option's.
    const double keep_plain = block_bytes(config, dims, l, "none", "none", "same");
    const std::optional<ActivationCodec> core_codec = parse_attention_codec(config.memory.attention_compression);
    auto core_bytes = [&](ActivationCodec codec) {
      const AttentionCoreElements e = attention_core_elements_per_token(config, dims, codec);
      return (e.compute * compute_element_bytes(config) + 4 * e.float32) * tokens;
    };
    const double core_plain = core_bytes(ActivationCodec::none);
    for (const std::string& codec : codecs) {
      const bool encoded = codec != "none";
      // Encoding and decoding what the option would otherwise keep (`plain`); where the option keeps
      // the block's activations, the attention core's share of it at the core's codec's rate, on the
      // elements that codec encodes.
      const ActivationCodec core = core_codec.value_or(parse_activation_codec(codec));
      const double core_encoded = core_bytes(core);
      auto coding = [&, codec, core](double plain, bool keeps_core) {
        return (plain - (keeps_core ? core_plain : 0)) * codec_per_byte(codec) +
               (keeps_core ? core_encoded * codec_per_byte(activation_codec_name(core)) : 0);
      };
      const double keep_c = encoded ? block_bytes(config, dims, l, "none", codec) : keep;
      const double selective_c = encoded ? block_bytes(config, dims, l, "selective", codec) : selective;
      const double input_c = encoded ? block_bytes(config, dims, l, "full", codec) : input;
      const double kept_after_i = std::max(0.0, keep_c + kept - released * (keep > 0 ? keep_c / keep : 1));
      options.push_back({"none", false, keep_c, 0, coding(keep_plain, true), codec, kept_after_i, keep_c - stays, stays});
      options.push_back({"selective", false, selective_c, 0, recompute_core + coding(selective, false), codec,
                         selective_c + kept, std::max(0.0, selective_c - stays), stays});
      options.push_back({"full", false, input_c, 0, f + coding(input, false), codec, 0, input_c, 0});
      options.push_back({"none", true, stays, keep_c - stays,
                         copy_seconds(keep_c - stays, f, b) + coding(keep_plain, true), codec, keep_c + kept, 0, stays});
      options.push_back({"full", true, 0, input_c, f + copy_seconds(input_c, f, b) + coding(input, false), codec, 0, 0, 0});
    }
    out.push_back(std::move(options));
  }
  return out;
}

ActivationPolicy choose_activation_policy(const std::vector<std::vector<ActivationOption>>& options,
                                          double budget_bytes, const std::vector<HeldMoment>& moments,
                                          int64_t groups_in_flight) {
  const size_t L = options.size();
  const CapChoices choices = cap_choices(options);
  const std::vector<double>& whole = choices.whole;
  constexpr int64_t kUnits = 4096;
  ActivationPolicy best;
  best.seconds = kNever;
  const double smallest = smallest_bytes(options, moments, groups_in_flight);
  const double held = most_held(moments);
  for (double g : choices.groups)
    for (double w : choices.wholes) {
      const Caps caps{g, w, groups_in_flight};
      const double room = budget_bytes - caps.reserve();
      const bool possible = least_bytes(options, whole, caps, moments) < kNever;
      if (!possible || room < 0) continue;
      const double unit = room / static_cast<double>(kUnits);
      auto units = [&](double bytes) {
        return unit > 0 ? static_cast<int64_t>(std::ceil(bytes / unit - 1e-9)) : (bytes > 0 ? kUnits + 1 : 0);
      };
      // seconds[u]: the least added seconds of the blocks so far within u units; choice per block.
      std::vector<double> seconds(kUnits + 1, 0.0);
      std::vector<std::vector<int8_t>> choice(L, std::vector<int8_t>(kUnits + 1, -1));
      for (size_t l = 0; l < L; ++l) {
        std::vector<double> next(kUnits + 1, kNever);
        for (int64_t u = 0; u <= kUnits; ++u)
          for (size_t j = 0; j < options[l].size(); ++j) {
            const ActivationOption& o = options[l][j];
            if (!caps.allow(o, whole[l])) continue;
            const int64_t need = units(held_bytes(o, moments));
            if (need > u || seconds[static_cast<size_t>(u - need)] == kNever) continue;
            const double t = seconds[static_cast<size_t>(u - need)] + o.seconds;
            if (t < next[static_cast<size_t>(u)]) {
              next[static_cast<size_t>(u)] = t;
              choice[l][static_cast<size_t>(u)] = static_cast<int8_t>(j);
            }
          }
        seconds = std::move(next);
      }
      if (seconds[kUnits] >= best.seconds) continue;
      ActivationPolicy p;
      p.budget_bytes = budget_bytes;
      p.seconds = seconds[kUnits];
      p.blocks.resize(L);
      int64_t u = kUnits;
      for (size_t l = L; l-- > 0;) {
        const ActivationOption& o = options[l][static_cast<size_t>(choice[l][static_cast<size_t>(u)])];
        p.blocks[l] = o;
        u -= units(held_bytes(o, moments));
      }
      best = p;
    }
  require(best.seconds < kNever, "memory.device_budget_gb leaves ", format_bytes(budget_bytes),
          " for the blocks' activations, but the smallest activation policy (every block offloaded, whole or as "
          "the input it recomputes from) needs ", format_bytes(smallest),
          held > 1 ? " for the micro-batches held at once" : " per micro-batch",
          ": raise memory.device_budget_gb, or lower train.batch_size or train.seq_len");
  // Among blocks with the same options, offload goes to the earliest and keeping to the latest.
  std::vector<bool> done(L, false);
  for (size_t l = 0; l < L; ++l) {
    if (done[l]) continue;
    std::vector<size_t> kind;
    for (size_t k = l; k < L; ++k)
      if (!done[k] && same_options(options[k], options[l])) kind.push_back(k);
    std::vector<ActivationOption> chosen;
    for (size_t k : kind) chosen.push_back(best.blocks[k]);
    std::stable_sort(chosen.begin(), chosen.end(), [](const ActivationOption& a, const ActivationOption& b) {
      return order(a) < order(b) || (order(a) == order(b) && a.bytes + a.group < b.bytes + b.group);
    });
    for (size_t n = 0; n < kind.size(); ++n) {
      best.blocks[kind[n]] = chosen[n];
      done[kind[n]] = true;
    }
  }
  double group = 0, recompute = 0;
  best.bytes = 0;
  for (size_t l = 0; l < L; ++l) {
    const ActivationOption& o = best.blocks[l];
    best.bytes += held_bytes(o, moments);
    if (o.offload) group = std::max(group, o.group);
    if (o.checkpointing == "full") recompute = std::max(recompute, whole[l]);
  }
  best.bytes += static_cast<double>(groups_in_flight) * group + recompute;
  best.held = held;
  best.moments = moments;
  best.groups_in_flight = groups_in_flight;
  for (size_t l = 0; l < L; ++l) best.layers.push_back(static_cast<int64_t>(l));
  return best;
}

std::vector<ActivationPolicy> choose_activation_policies(const Config& config, const Layout& layout,
                                                         const BlockCosts& measured, bool cpu_device) {
  const auto options = activation_options(config, layout.dims(), measured, cpu_device);
  const HostLink host = host_link(config, measured, cpu_device);
  std::vector<ActivationPolicy> policies;
  for (const ActivationShare& share : activation_shares(config, layout)) {
    const std::vector<std::vector<ActivationOption>> own = share_options(options, share);
    std::optional<ActivationPolicy> best;
    std::string refusal;
    try {
      best = choose_activation_policy(own, share.budget_bytes, share.moments, share.groups_in_flight);
    } catch (const Error& e) {
      refusal = e.what();
    }
    if (share.pipeline_rank >= 0)
      for (const HeldOffload& held : held_offloads(layout, share, own, measured, host)) {
        if (held.budget_bytes <= 0) continue;
        try {
          ActivationPolicy p = choose_activation_policy(held.options, held.budget_bytes, held.moments,
                                                        share.groups_in_flight);
          if (best && p.seconds >= best->seconds) continue;
          p.budget_bytes = share.budget_bytes;
          p.bytes += held.reserve;
          p.resident_micro_batches = held.resident;
          p.held_offloaded = held.offloaded;
          p.held_reserve = held.reserve;
          best = p;
        } catch (const Error&) {
        }
      }
    if (!best) {
      if (share.pipeline_rank < 0) fail(refusal);
      fail("pipeline rank ", share.pipeline_rank, ": ", refusal);
    }
    ActivationPolicy p = *best;
    p.pipeline_rank = share.pipeline_rank;
    p.layers = share.layers;
    policies.push_back(std::move(p));
  }
  return policies;
}

double smallest_activation_bytes(const Config& config, const ParallelDims& dims, const ActivationShare& share) {
  return smallest_bytes(share_options(activation_options(config, dims, BlockCosts(), false), share), share.moments,
                        share.groups_in_flight);
}

}  // namespace tessera
