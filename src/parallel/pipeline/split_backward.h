// SplitBackward: a pipeline stage's backward cut into the zero-bubble schedules' two halves (Qi et
// al., "Zero Bubble Pipeline Parallelism"): I, the gradient of the stage's input, which the
// previous stage waits for, and W, the parameters' gradients, which nothing waits for and which
// the schedule places in a bubble. Each half runs only its own products, so I + W does the work of
// one whole backward (its time a few percent more on a CPU: docs/pipeline.md, "the split's own
// cost").
//
// How. A parameterised op joins the graph at a node that also lies on the path from the roots to
// the input: a linear layer's AddmmBackward (its input x and its weight), a layer norm's, the
// head's matmul with the tied embedding. These nodes are the intermediates: the nodes of the
// input's closure (every node from which the input is reached) that lead to a parameter by a path
// outside the closure. Before I, a pre-hook goes on each intermediate; I differentiates the roots
// with respect to the input alone (autograd masks every product the input does not need, so a
// linear computes x's gradient only) and the hooks keep the gradient arriving at each
// intermediate: its output gradient. After I each intermediate's edges into the closure are cut,
// and the input path's other nodes release what they saved (the nodes themselves may stay alive,
// held through a product's saved input, which keeps its grad_fn; measured, without the release a
// micro-batch awaiting W held all its forward saved), and W runs the engine from the
// intermediates with the kept gradients to the parameters only: the same nodes again, now with
// only their weight products unmasked (x^T dy for a linear), and the parameters' AccumulateGrad
// nodes, so the hooks registered on them (data parallelism's bucket and reduce-scatter hooks, a
// tensor-parallel sum) fire as in any backward. The values are those of one whole backward: the
// same nodes, formulas and saved tensors.
//
// Two more intermediates have no pre-hook: the input's own node when the input is not a leaf
// (stage 0's embedding output: I stops there, and I's result is its gradient), and a root's node
// outside the closure (its given gradient).
//
// Not split: a parameter reached only inside a custom function (a reentrant checkpointed block
// recomputes and accumulates its parameters' gradients inside I's backward; the caller tells the
// gradient owner so), and a parameter no path from the roots reaches (it gets no gradient).
//
// Invariants: the graph from the roots is not run by anything else between input_gradient() and
// weight_gradients(); weight_gradients() runs at most once (it frees the graph); the parameters
// given are leaves requiring grad.
#pragma once

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>

namespace tessera::pipeline {

class SplitBackward {
 public:
  // I: the gradient of `input` (a leaf requiring grad, or a non-leaf such as an embedding's output)
  // from `roots` with gradients `grads`, keeping what W needs of the graph for `params`.
  SplitBackward(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads, const at::Tensor& input,
                const std::vector<at::Tensor>& params);
  SplitBackward(SplitBackward&&) = default;
  SplitBackward& operator=(SplitBackward&&) = default;
  ~SplitBackward();

  const at::Tensor& input_gradient() const { return input_grad_; }
  // W: accumulates the parameters' gradients into their .grad (through their AccumulateGrad nodes)
  // and frees the graph. Nothing to do where no parameter is reached from an intermediate.
  void weight_gradients();

 private:
  at::Tensor input_grad_;
  torch::autograd::edge_list roots_;        // (intermediate, output slot) with a kept gradient
  std::vector<at::Tensor> root_grads_;      // per root
  torch::autograd::edge_list parameters_;   // the AccumulateGrad edges of the parameters reached
  std::vector<std::shared_ptr<torch::autograd::Node>> keep_;  // the intermediates, alive until W
};

}  // namespace tessera::pipeline
