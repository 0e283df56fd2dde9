// A stage's backward as I and W (split_backward.h).
#include "parallel/pipeline/split_backward.h"

#include <algorithm>
#include <deque>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/error.h"

namespace tessera::pipeline {
namespace {

using torch::autograd::Edge;
using torch::autograd::FunctionPreHook;
using torch::autograd::Node;
using torch::autograd::variable_list;

// Keeps the gradients arriving at its node during I.
struct KeepGradients : FunctionPreHook {
  explicit KeepGradients(variable_list* into) : into(into) {}
  variable_list operator()(const variable_list& grads) override {
    *into = grads;
    return grads;
  }
  variable_list* into;
};

// Removes the hooks it was given when it goes out of scope (I done, or failed).
struct HooksPlaced {
  std::vector<std::pair<Node*, FunctionPreHook*>> hooks;
  ~HooksPlaced() {
    for (auto [node, hook] : hooks) {
      auto& v = node->pre_hooks();
      v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& h) { return h.get() == hook; }), v.end());
    }
  }
};

}  // namespace

SplitBackward::SplitBackward(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
                             const at::Tensor& input, const std::vector<at::Tensor>& params) {
  namespace ag = torch::autograd;
  // The graph from the roots, each node with the nodes pointing to it.
  std::unordered_map<Node*, std::vector<Node*>> consumers;
  std::unordered_set<Node*> root_nodes;
  std::deque<Node*> queue;
  for (const at::Tensor& r : roots)
    if (Node* n = r.grad_fn().get()) {
      root_nodes.insert(n);
      if (consumers.try_emplace(n).second) queue.push_back(n);
    }
  while (!queue.empty()) {
    Node* n = queue.front();
    queue.pop_front();
    for (const Edge& e : n->next_edges()) {
      if (!e.is_valid()) continue;
      auto [it, fresh] = consumers.try_emplace(e.function.get());
      it->second.push_back(n);
      if (fresh) queue.push_back(e.function.get());
    }
  }

  // The input's closure: every node from which the input's node is reached.
  const Edge input_edge = ag::impl::gradient_edge(input);
  Node* const in = input_edge.function.get();
  std::unordered_set<Node*> closure;
  if (consumers.count(in)) {
    closure.insert(in);
    queue.push_back(in);
  }
  while (!queue.empty()) {
    Node* n = queue.front();
    queue.pop_front();
    for (Node* c : consumers.at(n))
      if (closure.insert(c).second) queue.push_back(c);
  }

  // The parameters reached, and from them, up the graph outside the closure, the intermediates:
  // the closure's nodes where a parameter's path joins it, and roots outside it.
  std::unordered_set<Node*> seen, is_intermediate;
  std::vector<Node*> intermediates;
  for (const at::Tensor& p : params) {
    const std::shared_ptr<Node> acc = ag::impl::try_get_grad_accumulator(p);
    if (!acc || !consumers.count(acc.get())) continue;
    parameters_.emplace_back(acc, 0);
    if (seen.insert(acc.get()).second) queue.push_back(acc.get());
  }
  auto add = [&](Node* n) {
    if (is_intermediate.insert(n).second) intermediates.push_back(n);
  };
  while (!queue.empty()) {
    Node* n = queue.front();
    queue.pop_front();
    if (root_nodes.count(n)) add(n);  // a root outside the closure: its gradient is given
    for (Node* c : consumers.at(n)) {
      if (closure.count(c)) add(c);
      else if (seen.insert(c).second) queue.push_back(c);
    }
  }

  // I, with a hook keeping the gradient each intermediate it runs receives.
  std::unordered_map<Node*, variable_list> kept;
  {
    HooksPlaced placed;
    for (Node* n : intermediates) {
      if (n == in || !closure.count(n)) continue;  // not run by I: the gradient is I's result, or given
      auto hook = std::make_unique<KeepGradients>(&kept[n]);
      placed.hooks.emplace_back(n, hook.get());
      n->add_pre_hook(std::move(hook));
    }
    const variable_list got = ag::grad(roots, {input}, grads, /*retain_graph=*/true, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    input_grad_ = got[0];
  }

  // W's roots: each intermediate's kept gradients. Cutting one intermediate's edges can drop the
  // last reference to another (a custom function that saved its input without its graph, such as
  // model/linear.cpp's, holds the input's node by that edge alone): all are held until the end.
  std::vector<std::shared_ptr<Node>> held;
  for (Node* n : intermediates) held.push_back(n->shared_from_this());
  for (Node* n : intermediates) {
    variable_list g;
    if (n == in) {
      require(n->num_inputs() == 1, "internal: SplitBackward's input comes from a node of ", n->num_inputs(),
              " outputs (", n->name(), "), whose other outputs' gradients I does not see");
      g = {input_grad_};
    } else if (!closure.count(n)) {
      g.resize(n->num_inputs());
      for (size_t i = 0; i < roots.size(); ++i)
        if (roots[i].grad_fn().get() == n) {
          at::Tensor& slot = g[roots[i].output_nr()];
          slot = slot.defined() ? slot + grads[i] : grads[i];
        }
    } else {
      g = std::move(kept[n]);
    }
    bool any = false;
    for (size_t k = 0; k < g.size(); ++k)
      if (g[k].defined()) {
        roots_.emplace_back(n->shared_from_this(), static_cast<uint32_t>(k));
        root_grads_.push_back(g[k]);
        any = true;
      }
    if (!any) continue;
    keep_.push_back(n->shared_from_this());
    // Cut the intermediate from the input's path: W runs its weight products only, and the path's
    // nodes (and what they saved) are freed once the caller drops the roots. The topological
    // number stays an upper bound, which the engine's pruning allows.
    for (Edge& e : n->next_edges())
      if (e.is_valid() && closure.count(e.function.get())) e = Edge();
    // Its tensor hooks ran on these gradients in I; W must not run them again.
    n->tensor_pre_hooks().clear();
    n->retains_grad_hooks().clear();
  }
  // The input path's other nodes never run again (W starts at the intermediates, whose edges into
  // the path are cut), but a product's saved input keeps its producer, and so the whole path, alive
  // (a SavedVariable of a non-output holds the tensor with its grad_fn): release what they saved
  // (the attention core's q, k, v and output, the activations' inputs, ...) now, not at W.
  for (Node* n : closure)
    if (!is_intermediate.count(n)) n->release_variables();
  if (!input_grad_.defined()) input_grad_ = at::zeros_like(input);
}

SplitBackward::~SplitBackward() = default;

void SplitBackward::weight_gradients() {
  if (roots_.empty() || parameters_.empty()) return;
  torch::autograd::Engine::get_default_engine().execute(roots_, root_grads_, /*keep_graph=*/false,
                                                        /*create_graph=*/false, /*accumulate_grad=*/true,
                                                        parameters_);
  roots_.clear();
  root_grads_.clear();
  keep_.clear();
}

}  // namespace tessera::pipeline
