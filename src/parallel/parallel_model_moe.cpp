// A parallel model's MoE routing statistics, summed over every rank, and the aux-loss-free
// balancing that feeds them back to the routers of the layers this rank holds (parallelize.h).
#include "parallel/parallelize.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace tessera {

void ParallelModel::reset_moe_statistics() {
  for (int64_t layer : model_->layers())
    if (MoE moe = model_->block(layer)->moe) moe->reset_statistics();
}

std::vector<MoELayerStatistics> ParallelModel::moe_statistics() {
  const ModelOptions& o = model_->options();
  std::vector<int64_t> layers;  // the whole model's MoE layers
  for (int64_t l = 0; l < o.n_layer; ++l)
    if (o.is_moe_block(l)) layers.push_back(l);
  if (layers.empty()) return {};
  // One row per layer: load [E], kept [E], tokens, forwards, balance loss, z-loss (sums).
  const int64_t E = o.moe_experts;
  at::Tensor table = at::zeros({static_cast<int64_t>(layers.size()), 2 * E + 4}, at::kDouble);
  const std::vector<int64_t>& held = model_->layers();
  for (size_t i = 0; i < layers.size() && tp_rank_ == 0; ++i) {
    if (std::find(held.begin(), held.end(), layers[i]) == held.end()) continue;
    const MoEStatistics& s = model_->block(layers[i])->moe->statistics();
    if (s.forwards == 0) continue;
    at::Tensor row = table[static_cast<int64_t>(i)];
    row.narrow(0, 0, E).copy_(s.assigned);
    row.narrow(0, E, E).copy_(s.kept);
    row[2 * E] = static_cast<double>(s.tokens);
    row[2 * E + 1] = static_cast<double>(s.forwards);
    row[2 * E + 2] = s.balance_loss.item<double>();
    row[2 * E + 3] = s.z_loss.item<double>();
  }
  if (mesh_ && mesh_->world_size() > 1) {
    at::Tensor summed = table.to(mesh_->world().device());
    mesh_->world().all_reduce(summed);
    table = summed.cpu();
  }
  std::vector<MoELayerStatistics> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    const at::Tensor row = table[static_cast<int64_t>(i)].contiguous();
    const double* v = row.data_ptr<double>();
    MoELayerStatistics s;
    s.layer = layers[i];
    s.load.assign(v, v + E);
    s.kept.assign(v + E, v + 2 * E);
    s.tokens = v[2 * E];
    s.forwards = v[2 * E + 1];
    s.balance_loss = s.forwards > 0 ? v[2 * E + 2] / s.forwards : 0.0;
    s.z_loss = s.forwards > 0 ? v[2 * E + 3] / s.forwards : 0.0;
    s.top_k = o.moe_top_k;
    out.push_back(std::move(s));
  }
  return out;
}

void ParallelModel::balance_experts(const std::vector<MoELayerStatistics>& step) {
  const double rate = model_->options().moe_bias_update_rate;
  if (rate == 0) return;
  const std::vector<int64_t>& held = model_->layers();
  for (const MoELayerStatistics& s : step)
    if (std::find(held.begin(), held.end(), s.layer) != held.end())
      model_->block(s.layer)->moe->update_selection_bias(s.load, rate);
}

}  // namespace tessera
