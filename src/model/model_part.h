// ModelPart: a part of the model as the code around it sees it: the embedding, block `layer`, or
// the head (final norm, logits, loss). Residency plans (memory/residency/residency_plan.h) and the
// model's end wrappers (transformer.h) name parts with it.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

struct ModelPart {
  enum class Kind { embedding, block, head };
  Kind kind = Kind::block;
  int64_t layer = 0;  // blocks only

  static ModelPart embedding() { return {Kind::embedding, 0}; }
  static ModelPart block(int64_t layer) { return {Kind::block, layer}; }
  static ModelPart head() { return {Kind::head, 0}; }

  bool operator<(const ModelPart& o) const { return kind != o.kind ? kind < o.kind : layer < o.layer; }
  bool operator==(const ModelPart& o) const { return kind == o.kind && layer == o.layer; }
  // "embedding", "block 3", "head"
  std::string name() const {
    return kind == Kind::embedding ? "embedding" : kind == Kind::head ? "head" : "block " + std::to_string(layer);
  }
};

}  // namespace tessera
