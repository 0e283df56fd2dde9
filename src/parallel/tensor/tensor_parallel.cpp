// Tensor parallelism's checks, sharding a TransformerLM and gathering it back (tensor_parallel.h).
#include "parallel/tensor/tensor_parallel.h"

#include <vector>

#include <torch/utils.h>

#include "core/error.h"
#include "model/linear.h"
#include "parallel/tensor/tp_comm.h"
#include "parallel/tensor/vocab_parallel.h"

namespace tessera {
namespace {

ShardedRegion region(comm::Group& tp, bool megatron_sp) {
  ShardedRegion r;
  if (megatron_sp) {
    r.enter = [&tp](const at::Tensor& x) { return gather_from_sequence(x, tp); };
    r.exit = [&tp](const at::Tensor& y) { return reduce_scatter_to_sequence(y, tp); };
    r.column = [&tp](const at::Tensor& x, at::TensorList weights, at::TensorList biases) {
      return sequence_gathered_linear(x, weights, biases, tp);
    };
  } else {
    r.enter = [&tp](const at::Tensor& x) { return copy_to_tp(x, tp); };
    r.exit = [&tp](const at::Tensor& y) { return reduce_from_tp(y, tp); };
  }
  return r;
}

TransformerLMImpl::ShardHooks shard_hooks(TransformerLM& model, comm::Group& tp, bool megatron_sp) {
  Embedding wte = model->wte;
  TransformerLMImpl::ShardHooks hooks;
  if (wte) hooks.embed = [wte, &tp](const at::Tensor& idx) { return vocab_parallel_embedding(idx, wte->weight, tp); };
  if (megatron_sp)
    hooks.enter_blocks = [&tp](const at::Tensor& x) {
      require(x.size(1) % tp.size() == 0, "sequence length ", x.size(1), " (train.seq_len) is not a multiple of ",
              "parallel.tp = ", tp.size(), ": Megatron sequence parallelism gives each tensor-parallel rank ",
              "seq_len / tp tokens of every sequence");
      return scatter_to_sequence(x, tp);
    };
  TransformerLMImpl* const lm = model.get();
  hooks.logits = [lm, &tp, megatron_sp](const at::Tensor& h) {
    return megatron_sp ? sequence_gathered_linear(h, {lm->head_weight()}, {}, tp)
                       : linear(copy_to_tp(h, tp), lm->head_weight(), at::Tensor());
  };
  hooks.cross_entropy = [&tp](const at::Tensor& logits, const at::Tensor& targets) {
    return vocab_parallel_cross_entropy(logits, targets, tp);
  };
  return hooks;
}

}  // namespace

void check_tensor_parallel(const ModelOptions& m, const ParallelOptions& p, const ParallelDims& d, int64_t seq_len,
                           const std::string& optimizer) {
  const int64_t N = d.tp();
  require(N > 1 || !p.megatron_sp, "parallel.megatron_sp = true with parallel.tp = 1: Megatron sequence "
          "parallelism splits the sequence inside a tensor-parallel group; set parallel.tp > 1 or megatron_sp = false");
  if (N == 1) return;
  require(d.sp() == 1 || !p.megatron_sp, "parallel.megatron_sp with parallel.sp = ", d.sp(),
          ": Megatron sequence parallelism splits the sequence inside the tp group, parallel.sp across groups; "
          "use one of them");
  require(m.ffn == "dense" || !p.megatron_sp, "parallel.megatron_sp = true with model.ffn = moe: each tensor-parallel "
          "rank would route only its sequence chunk; set megatron_sp = false (MoE layers then run whole on every "
          "tp rank, their experts split by parallel.ep)");
  require(m.n_head % N == 0, "model.n_head = ", m.n_head, " is not a multiple of parallel.tp = ", N,
          " (each tensor-parallel rank computes n_head / tp whole heads)");
  require(m.kv_heads() % N == 0 || N % m.kv_heads() == 0, "model.n_kv_head = ", m.kv_heads(),
          " is neither a multiple nor a divisor of parallel.tp = ", N, " (each tensor-parallel rank computes ",
          "n_kv_head / tp whole key/value heads, or, with fewer of them than ranks, the one its query heads share)");
  require(m.hidden() % N == 0, "the MLP's hidden width ", m.hidden(), " (model.ffn_hidden, or mlp_ratio x n_embd) is ",
          "not a multiple of parallel.tp = ", N);
  require(m.padded_vocab() % N == 0, "model.vocab_size = ", m.vocab_size, " padded to a multiple of model.vocab_multiple = ",
          m.vocab_multiple, " is ", m.padded_vocab(), ", not a multiple of parallel.tp = ", N,
          " (each tensor-parallel rank holds 1/tp of the embedding's rows; raise model.vocab_multiple)");
  require(!p.megatron_sp || seq_len % N == 0, "train.seq_len = ", seq_len,
          " is not a multiple of parallel.tp = ", N, " (parallel.megatron_sp gives each rank seq_len / tp tokens)");
  require(optimizer != "adafactor", "parallel.tp = ", N, " with optim.name = adafactor: Adafactor factors "
          "its second moment over whole rows and columns, which tensor parallelism splits; use optim.name = adamw");
}

TensorParallelLayout tensor_parallel_layout(const ParameterSpec& spec, int64_t ranks) {
  switch (spec.split) {
    case Split::column: {
      const int64_t chunks = tensor_parallel_chunks(spec, ranks);
      require(ranks % chunks == 0, "internal: ", spec.heads, " heads over parallel.tp = ", ranks);
      return {0, spec.parts, ranks / chunks};
    }
    case Split::vocab: return {0, 1};
    case Split::row: return {1, 1};
    case Split::replicated:
    case Split::expert: return {};
  }
  return {};
}

at::Tensor shard_tensor(const at::Tensor& full, const TensorParallelLayout& layout, int64_t rank, int64_t ranks) {
  const int64_t count = layout.chunks(ranks);
  if (layout.dim < 0 || count == 1) return full;
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& block : full.chunk(layout.parts, layout.dim)) {
    require(block.size(layout.dim) % count == 0, "tensor parallelism: a ", full.sizes(),
            " tensor cannot be split in ", count, " chunks (parallel.tp = ", ranks, ") along dimension ", layout.dim);
    pieces.push_back(block.chunk(count, layout.dim)[layout.chunk(rank)]);
  }
  return at::cat(pieces, layout.dim).contiguous();
}

namespace {

// A part [parts * n, rest...] along dim as [parts, n, rest...] (dim moved first), and back.
at::Tensor blocks_of(const at::Tensor& part, const TensorParallelLayout& layout) {
  at::Tensor moved = part.detach().movedim(layout.dim, 0);
  std::vector<int64_t> shape = moved.sizes().vec();
  shape[0] /= layout.parts;
  shape.insert(shape.begin(), layout.parts);
  return moved.reshape(shape).contiguous();
}

// [chunks, parts, n, rest...] -> [parts, chunks, n, rest...] -> [parts chunks n, rest...], the
// dimension back in place.
at::Tensor whole_from_chunks(const at::Tensor& chunks, const at::Tensor& part, const TensorParallelLayout& layout) {
  std::vector<int64_t> full = part.movedim(layout.dim, 0).sizes().vec();
  full[0] *= chunks.size(0);
  return chunks.transpose(0, 1).reshape(full).movedim(0, layout.dim).contiguous();
}

}  // namespace

at::Tensor gather_tensor(const at::Tensor& part, const TensorParallelLayout& layout, comm::Group& tp) {
  const int64_t N = tp.size();
  if (layout.dim < 0 || N == 1) return part.detach().contiguous();
  const at::Tensor input = blocks_of(part, layout);
  std::vector<int64_t> shape = input.sizes().vec();
  shape.insert(shape.begin(), N);
  at::Tensor output = at::empty(shape, input.options());
  tp.all_gather(output.view(-1), input.view(-1));
  // Gathered [N, parts, n, rest...]; with replicas, the first rank of each chunk's.
  if (layout.replicas > 1) output = output.slice(0, 0, N, layout.replicas);
  return whole_from_chunks(output, part, layout);
}

std::vector<int64_t> kv_replica_ranks(const TransformerLM& model, const comm::Group& tp) {
  int64_t replicas = 1;
  for (const auto& [name, spec] : model->parameter_specs())
    replicas = std::max(replicas, tensor_parallel_layout(spec, tp.size()).replicas);
  if (replicas == 1) return {};
  const int64_t first = tp.rank() / replicas * replicas;
  return {tp.ranks().begin() + first, tp.ranks().begin() + first + replicas};
}

void parallelize_tensor(TransformerLM& model, comm::Group& tp, bool megatron_sp) {
  const int64_t N = tp.size(), r = tp.rank();
  if (N == 1) return;
  const ModelOptions& o = model->options();
  require(!model->wte || model->wte->weight.size(0) == o.padded_vocab(),
          "internal: parallelize_tensor on a model that is already tensor-parallel");
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      at::Tensor& param = item.value();
      const ParameterSpec& spec = model->parameter_specs().at(item.key());
      const TensorParallelLayout layout = tensor_parallel_layout(spec, N);
      if (layout.dim >= 0) param.set_data(shard_tensor(param.detach(), layout, r, N).clone());
      param.mutable_grad() = at::Tensor();
    }
  }
  const int64_t heads = o.n_head / N;
  for (int64_t l : model->layers()) {
    Block block = model->block(l);
    if (block->softmax_attn) block->softmax_attn->set_region(region(tp, megatron_sp));
    if (block->linear_attn) {
      block->linear_attn->set_region(region(tp, megatron_sp));
      block->linear_attn->select_heads(r * heads, heads);
    }
    if (block->mlp) block->mlp->set_region(region(tp, megatron_sp));
  }
  model->set_shard_hooks(shard_hooks(model, tp, megatron_sp));
}

}  // namespace tessera
