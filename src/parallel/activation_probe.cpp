// The probe of adaptive activation codecs (activation_probe.h).
#include "parallel/activation_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <vector>

#include <torch/autograd.h>

#include "comm/device.h"
#include "core/error.h"
#include "core/random_streams.h"
#include "model/moe.h"
#include "model/parameter_spec.h"
#include "optim/clipping.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

// The gradients of `output` against `inputs`, from `grad_output`; undefined where one is unused.
std::vector<at::Tensor> gradients(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                  const at::Tensor& grad_output = {}) {
  return torch::autograd::grad({output}, inputs, grad_output.defined() ? std::vector<at::Tensor>{grad_output}
                                                                       : std::vector<at::Tensor>{},
                               /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
}

// The weighted squared distance of two gradient lists (weights[i] for entry i), as the clipping
// norm sums its squares (optim/clipping.h), of entries [first, last). With `sequence` the entries are
// this rank's shares of gradients summed over that group (the parameters' under sequence
// parallelism): their differences are summed over it first (one collective), so the distance is
// the whole gradient's, equal on every rank of the group.
double squared_distance(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                        const std::vector<double>& weights, size_t first, size_t last, comm::Group* sequence) {
  std::vector<at::Tensor> differences;
  std::vector<double> counted;
  for (size_t i = first; i < last; ++i) {
    if (!a[i].defined() || !b[i].defined()) continue;
    differences.push_back(a[i] - b[i]);
    counted.push_back(weights[i]);
  }
  if (differences.empty()) return 0.0;
  if (sequence) sequence->all_reduce(differences);  // in place, as one flat buffer
  return weighted_squares(differences, counted, differences.front().device()).item<double>();
}

// `values` reduced over `group` (on `device`, where its collectives run).
std::vector<double> reduced(comm::Group& group, const std::vector<double>& values, c10::Device device,
                            comm::ReduceOp op = comm::ReduceOp::sum) {
  at::Tensor t = at::tensor(values, at::kDouble).to(device);
  group.all_reduce(t, op);
  t = t.cpu().contiguous();
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

std::vector<double> flatten(const SlotErrors& errors) {
  std::vector<double> flat;
  for (const auto& [layer, list] : errors) flat.insert(flat.end(), list.begin(), list.end());
  return flat;
}

// Every stage's slots and errors on every rank of the pp group `pipe`: each rank's blocks as rows
// (layer, elements, element bytes, lossy, int4 error; a block that saves nothing one row of
// elements -1), padded to the longest rank's and gathered. Another rank's slots come without
// made_by and checksum (the budget has counted their elements already).
void gather_stages(comm::Group& pipe, ActivationProbe& probe, c10::Device device) {
  constexpr size_t kColumns = 5;
  std::vector<double> rows;
  for (const auto& [layer, slots] : probe.slots) {
    const double l = static_cast<double>(layer);
    if (slots.empty()) rows.insert(rows.end(), {l, -1, 0, 0, 0});
    const std::vector<double>& errors = probe.int4_error.at(layer);
    for (size_t k = 0; k < slots.size(); ++k)
      rows.insert(rows.end(), {l, static_cast<double>(slots[k].elements), static_cast<double>(slots[k].element_bytes),
                               slots[k].lossy ? 1.0 : 0.0, errors[k]});
  }
  std::vector<double> counts(static_cast<size_t>(pipe.size()), 0.0);
  counts[static_cast<size_t>(pipe.rank())] = static_cast<double>(rows.size() / kColumns);
  counts = reduced(pipe, counts, device);
  const size_t longest = static_cast<size_t>(*std::max_element(counts.begin(), counts.end()));
  rows.resize(longest * kColumns, 0.0);
  at::Tensor all = at::empty({pipe.size() * static_cast<int64_t>(longest * kColumns)}, at::TensorOptions().dtype(at::kDouble).device(device));
  pipe.all_gather(all, at::tensor(rows, at::kDouble).to(device));
  all = all.cpu().contiguous();
  const double* data = all.data_ptr<double>();
  for (size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int64_t>(r) == pipe.rank()) continue;
    for (size_t i = 0; i < static_cast<size_t>(counts[r]); ++i) {
      const double* row = data + (r * longest + i) * kColumns;
      const int64_t layer = static_cast<int64_t>(row[0]);
      std::vector<SavedSlot>& slots = probe.slots[layer];
      std::vector<double>& errors = probe.int4_error[layer];
      if (row[1] < 0) continue;  // a block that saves nothing: its (empty) lists
      SavedSlot slot;
      slot.elements = static_cast<int64_t>(row[1]);
      slot.element_bytes = static_cast<int64_t>(row[2]);
      slot.lossy = row[3] != 0;
      slots.push_back(slot);
      errors.push_back(row[4]);
    }
  }
}

}  // namespace

ActivationProbe probe_activation_codecs(TransformerLM& model, AdaptiveCodecs& codecs, const std::function<void()>& census,
                                        const std::function<at::Tensor(Block&, const at::Tensor&)>& run_block,
                                        const ActivationProbing& probing) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : model->parameters())
    if (p.requires_grad()) params.push_back(p);
  ActivationProbe probe;
  SlotErrors input_error;  // under sequence parallelism: the squares of this rank's chunk of each input gradient
  std::map<int64_t, AdaptiveCodecs::BlockRecord> records;
  // The random streams as the step found them: the probe's draws (dropout) leave no trace.
  const std::optional<c10::Device> cuda =
      params.front().is_cuda() ? std::optional<c10::Device>(params.front().device()) : std::nullopt;
  const auto streams = random::states(cuda);
  const SlotCodecs previous = codecs.table();
  // MoE layers: their statistics as the step left them, and their count sums taken out (moe.h)
  // unless every rank they sum over probes with this one (the sequence group).
  struct MoEState {
    MoE moe;
    MoEStatistics statistics;
    MoEImpl::CountSum count_sum;
  };
  std::vector<MoEState> moe_states;
  for (int64_t layer : model->layers())
    if (MoE moe = model->block(layer)->moe)
      moe_states.push_back({moe, moe->statistics(), probing.sequence ? MoEImpl::CountSum() : moe->take_balance_count_sum()});
  auto restore_moe = [&] {
    for (MoEState& s : moe_states) {
      s.moe->set_statistics(s.statistics);
      if (s.count_sum) s.moe->set_balance_count_sum(s.count_sum);
    }
    moe_states.clear();
  };
  // The step's random streams and MoE state back; on a failure its codecs too.
  auto restore_step_state = [&] {
    random::load_states(streams, cuda, "the adaptive codecs' probe");
    restore_moe();
  };
  auto restore = [&] {
    codecs.apply(previous);
    restore_step_state();
  };
  codecs.begin_census();
  try {
    census();
  } catch (...) {
    codecs.end_census(records);
    restore();
    throw;
  }
  probe.slots = codecs.end_census(records);
  // Under expert parallelism every rank of the ep group computes one process's gradients but for
  // its experts', which sum ep copies of each token's contribution (below).
  const double ep = probing.experts ? static_cast<double>(probing.experts->size()) : 1.0;
  const double replicated_weight = 1.0 / ep, expert_weight = 1.0 / (ep * ep);
  const ResidentOwner::AroundBlock around =
      probing.around_block ? probing.around_block : [](int64_t, const std::function<void()>& fn) { fn(); };
  try {
    for (const auto& [layer, slots] : probe.slots) {
      std::vector<double>& errors = probe.int4_error[layer];
      errors.assign(slots.size(), 0.0);
      if (slots.empty()) continue;
      const AdaptiveCodecs::BlockRecord& record = records.at(layer);
      require(record.output_grad.defined(), "internal: the adaptive codecs' census saw no gradient reach block ", layer,
              "'s output");
      std::vector<double>& input_errors = input_error[layer];
      input_errors.assign(slots.size(), 0.0);
      // The block's passes with its parameters whole (ZeRO-3 gathers them: ResidentOwner::run_probe).
      around(layer, [&] {
        Block block = model->block(layer);
        // The block input's gradient first, then each parameter's, with their weights.
        std::vector<at::Tensor> inputs;
        std::vector<std::string> names{""};
        std::vector<double> weights{probing.input_weight * replicated_weight};
        for (const auto& item : block->named_parameters()) {
          if (!item.value().requires_grad()) continue;
          inputs.push_back(item.value());
          names.push_back("h." + std::to_string(layer) + "." + item.key());
          const bool expert = model->parameter_specs().at(names.back()).split == Split::expert;
          weights.push_back(probing.norm.weight_of(names.back()) * (expert ? expert_weight : replicated_weight));
        }
        auto block_gradients = [&](int64_t slot) {
          codecs.probe(layer, slot);
          at::Tensor x = record.input.detach().requires_grad_(true);
          std::vector<at::Tensor> with_input = inputs;
          with_input.insert(with_input.begin(), x);
          random::load_states(record.random_states, cuda, "the adaptive codecs' probe");
          const at::Tensor y = run_block(block, x);
          if (slot < 0) {
            // Run alone, the block must compute what it computed in the model's forward (the same
            // masks above all), or its errors would measure something else.
            const double scale = record.output.abs().max().item<double>();
            const double off = (y.detach() - record.output).abs().max().item<double>();
            require(off <= 1e-4 * scale, "internal: block ", layer, " computed an output ", off,
                    " off its output in the model's forward (of largest magnitude ", scale,
                    ") when run alone by the adaptive codecs' probe");
          }
          std::vector<at::Tensor> g = gradients(y, with_input, record.output_grad);
          require(codecs.probed_slots() == static_cast<int64_t>(slots.size()), "internal: block ", layer, " saved ",
                  codecs.probed_slots(), " tensors when probed alone and ", slots.size(),
                  " in the model's forward (memory.activation_compression = adaptive needs the same each time)");
          if (probing.shares.any()) {
            std::vector<std::pair<std::string, at::Tensor>> shares;
            for (size_t i = 1; i < g.size(); ++i)
              if (g[i].defined() && probing.shares.holds(names[i])) shares.emplace_back(names[i], g[i]);
            probing.shares.sum(shares);
          }
          return g;
        };
        const std::vector<at::Tensor> reference = block_gradients(-1);
        for (size_t k = 0; k < slots.size(); ++k) {
          const std::vector<at::Tensor> g = block_gradients(static_cast<int64_t>(k));
          if (probing.sequence) {
            // The input's gradient is this rank's chunk of the sequence's: its squares are summed
            // over the group below; the parameters' gradients are shares of one sum.
            input_errors[k] = squared_distance(g, reference, weights, 0, 1, nullptr);
            errors[k] = squared_distance(g, reference, weights, 1, g.size(), probing.sequence);
          } else {
            errors[k] = squared_distance(g, reference, weights, 0, g.size(), nullptr);
          }
        }
      });
    }
  } catch (...) {
    restore();
    throw;
  }
  restore_step_state();
  // Model-parallel ranks probed together: the sequence's (their input gradients' squares summed,
  // the parameters' already whole), then the tp group's (summed as the clipping norm sums them).
  std::vector<comm::Group*> groups;
  if (probing.sequence) groups.push_back(probing.sequence);
  if (probing.tensor) groups.push_back(probing.tensor);
  const c10::Device device = params.front().device();
  if (!groups.empty()) {
    // The elements as one process counts them, group by group: a slot every rank of a group saved
    // alike (the same checksum on each: tp without Megatron-SP keeps the norms' tensors whole) once
    // for that group, any other over its ranks (a sequence's chunks, a rank's heads).
    std::vector<double> checksums;
    for (const auto& [layer, slots] : probe.slots)
      for (const SavedSlot& slot : slots) checksums.push_back(slot.checksum);
    const size_t n = checksums.size();
    for (size_t i = 0; i < n; ++i) checksums.push_back(-checksums[i]);
    for (comm::Group* g : groups) {
      const std::vector<double> extremes = reduced(*g, checksums, device, comm::ReduceOp::max);
      size_t i = 0;
      for (auto& [layer, slots] : probe.slots)
        for (SavedSlot& slot : slots) {
          if (extremes[i] != -extremes[i + n]) slot.elements *= g->size();  // not alike on every rank
          ++i;
        }
    }
    std::vector<double> sums = flatten(probe.int4_error);
    if (probing.sequence) {
      const std::vector<double> inputs = reduced(*probing.sequence, flatten(input_error), device);
      for (size_t i = 0; i < sums.size(); ++i) sums[i] += inputs[i];
    }
    if (probing.tensor) sums = reduced(*probing.tensor, sums, device);  // as the clipping norm sums its squares
    size_t at = 0;
    for (auto& [layer, errors] : probe.int4_error)
      for (double& e : errors) e = sums[at++];
  }
  if (probing.experts) {
    // The ep group ran one micro-batch on every rank: each slot's elements summed over the group
    // count ep copies of one process's, and the errors (weighed above) sum to one process's.
    std::vector<double> elements;
    for (const auto& [layer, slots] : probe.slots)
      for (const SavedSlot& slot : slots) elements.push_back(static_cast<double>(slot.elements));
    elements = reduced(*probing.experts, elements, device);
    const std::vector<double> sums = reduced(*probing.experts, flatten(probe.int4_error), device);
    size_t i = 0;
    for (auto& [layer, slots] : probe.slots) {
      std::vector<double>& errors = probe.int4_error.at(layer);
      for (size_t k = 0; k < slots.size(); ++k, ++i) {
        slots[k].elements = static_cast<int64_t>(std::llround(elements[i] / ep));
        errors[k] = sums[i];
      }
    }
  }
  if (probing.pipeline && probing.pipeline->size() > 1) gather_stages(*probing.pipeline, probe, device);
  probe.codecs = choose_slot_codecs(probe.slots, probe.int4_error, codecs.bits());
  codecs.apply(probe.codecs);
  probe.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return probe;
}

void census_backward(TransformerLM& model, const at::Tensor& loss) {
  const at::Tensor first = model->adaptive_activation_codecs()->census_input();
  require(first.defined() && first.requires_grad(),
          "internal: the adaptive codecs' census saw no block input on the gradient's path");
  gradients(loss, {first});
}

bool probes_before(const ActivationProbing& probing, int64_t steps_run) {
  return steps_run == 0 || (probing.every > 0 && steps_run % probing.every == 0);
}

std::optional<std::string> choose_activation_codecs(TransformerLM& model, const ActivationProbing& probing,
                                                    c10::Device device, std::optional<at::ScalarType> autocast,
                                                    const std::function<void()>& census) {
  AdaptiveCodecs& codecs = *model->adaptive_activation_codecs();
  comm::Group* replicas = probing.replicas;
  const bool root = replicas == nullptr || replicas->rank() == 0;
  std::optional<std::string> note;
  if (root) {
    const auto run_block = [&](Block& block, const at::Tensor& x) {
      AutocastGuard guard(device.type(), autocast.value_or(at::kFloat), autocast.has_value());
      return block->forward(x).x;
    };
    const ActivationProbe probe = probe_activation_codecs(model, codecs, census, run_block, probing);
    note = describe_activation_codecs(probe.slots, probe.codecs, codecs.bits(), probe.seconds);
  }
  if (replicas == nullptr || replicas->size() == 1) return note;
  // The table of this rank's blocks: each block's count of slots, then every slot's codec.
  const std::vector<int64_t>& layers = model->layers();
  at::Tensor counts = at::zeros({static_cast<int64_t>(layers.size())}, at::kLong);
  std::vector<int64_t> flat;
  if (root)
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto it = codecs.table().find(layers[i]);
      if (it == codecs.table().end()) continue;
      counts[static_cast<int64_t>(i)] = static_cast<int64_t>(it->second.size());
      for (ActivationCodec c : it->second) flat.push_back(static_cast<int64_t>(c));
    }
  counts = comm::to_device_queued(counts, device);
  replicas->broadcast(counts, 0);
  counts = counts.cpu();
  if (counts.sum().item<int64_t>() == 0) return note;  // no block saves a slot (nothing to broadcast)
  at::Tensor codes = root ? at::tensor(flat, at::kLong) : at::zeros({counts.sum().item<int64_t>()}, at::kLong);
  codes = comm::to_device_queued(codes, device);
  replicas->broadcast(codes, 0);
  if (root) return note;
  codes = codes.cpu();
  SlotCodecs table;
  int64_t at = 0;
  for (size_t i = 0; i < layers.size(); ++i)
    for (int64_t k = 0; k < counts[static_cast<int64_t>(i)].item<int64_t>(); ++k)
      table[layers[i]].push_back(static_cast<ActivationCodec>(codes[at++].item<int64_t>()));
  codecs.apply(std::move(table));
  return note;
}

std::string describe_activation_codecs(const BlockSlots& slots, const SlotCodecs& codecs, double bits, double seconds) {
  const SlotChoiceSummary s = summarize_slot_codecs(slots, codecs);
  char head[320];
  std::snprintf(head, sizeof(head),
                "activation codecs (memory.activation_compression = adaptive, memory.activation_bits = %.2f): %lld "
                "saved tensors of %zu blocks: %lld kept, %lld int8, %lld int4, %.2f bits an element; probed in %.2f s; "
                "each block's tensors in order (k kept, 8 int8, 4 int4):",
                bits, static_cast<long long>(s.slots), slots.size(), static_cast<long long>(s.kept),
                static_cast<long long>(s.int8), static_cast<long long>(s.int4), s.bits_per_element, seconds);
  std::string out = head;
  for (const auto& [layer, list] : codecs) {
    out += " " + std::to_string(layer) + ":";
    for (ActivationCodec c : list) out += c == ActivationCodec::none ? 'k' : c == ActivationCodec::int8 ? '8' : '4';
  }
  // What each of the first block's tensors is, by the operation that made it.
  if (!slots.empty()) {
    out += "; block " + std::to_string(slots.begin()->first) + "'s tensors made by:";
    for (const SavedSlot& s : slots.begin()->second) out += " " + (s.made_by.empty() ? std::string("input") : s.made_by);
  }
  return out;
}

}  // namespace tessera
