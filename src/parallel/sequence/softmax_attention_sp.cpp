// Installing Ulysses or ring attention into a GPT model (softmax_attention_sp.h).
#include "parallel/sequence/softmax_attention_sp.h"

#include "core/error.h"
#include "model/attention.h"
#include "parallel/sequence/ring_attention.h"
#include "parallel/sequence/ulysses.h"

namespace tessera {

SoftmaxSpMethod softmax_sp_method(const std::string& sp_method) {
  if (sp_method == "ulysses") return SoftmaxSpMethod::ulysses;
  if (sp_method == "ring") return SoftmaxSpMethod::ring;
  fail("parallel.sp_method = \"", sp_method, "\" is not a softmax-attention method (ulysses or ring)");
}

void apply_sequence_parallel_attention(TransformerLM& model, comm::Group& sp, const std::string& method) {
  const SoftmaxSpMethod parsed = softmax_sp_method(method);
  CausalSelfAttentionImpl::Kernel kernel;
  if (parsed == SoftmaxSpMethod::ulysses)
    kernel = [&sp](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) { return ulysses_attention(q, k, v, sp); };
  else
    kernel = [&sp](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) { return ring_attention(q, k, v, sp); };
  for (int64_t l : model->layers()) model->block(l)->softmax_attn->set_kernel(kernel);
}

}  // namespace tessera
