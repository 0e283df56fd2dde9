// Region: which elements of a whole tensor a piece of it holds, in a checkpoint file or in a rank's
// memory. One description covers every way tessera cuts a tensor:
//
//   split   along dimension `dim`, seen as `blocks` equal blocks (c_attn: q, k, v) each cut into
//           `count` equal chunks, chunk `index` of every block: tensor parallelism's part of rank
//           `index` of `count` (parallel/tensor/tensor_parallel.h, TensorParallelLayout); dim -1:
//           not split, the part is the whole tensor;
//   range   elements [begin, end) of the split part, flattened in row-major order: a ZeRO rank's
//           slice of its part, or an even slice of a whole tensor.
//
// A region's values are its elements in row-major order of the part, from `begin` to `end`. In
// the whole tensor's flattened elements they are a sorted list of runs (for_each_run): one run for
// a range of an unsplit tensor, one per (outer index, block) for a split. copy_overlap moves the
// elements two regions of one tensor share from one's values to the other's, so pieces saved under
// one layout assemble into the pieces another layout reads (tp 2 -> tp 4, ZeRO -> tp, ...) without
// the whole tensor in memory.
//
// Records. A checkpoint file stores a piece's region as a string in its metadata: "begin s0 s1 ..."
// for a range of an unsplit tensor (the format every earlier checkpoint has) and
// "split dim blocks index count begin end s0 s1 ..." for the others. parse() checks every field and
// names `where`.
//
// Invariants: 0 <= begin <= end <= part_numel(); a split divides shape[dim] by blocks * count.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera {

struct Region {
  std::vector<int64_t> shape;  // the whole tensor's ({} for a scalar)
  int64_t begin = 0, end = 0;  // the part's flattened elements held
  int64_t dim = -1, blocks = 1, index = 0, count = 1;

  // Every element of a tensor of `shape`.
  static Region whole(std::vector<int64_t> shape);
  // Elements [begin, end) of a tensor of `shape`, flattened.
  static Region range(std::vector<int64_t> shape, int64_t begin, int64_t end);
  // Chunk `index` of `count` along `dim` of each of `blocks` blocks, all of it.
  static Region split(std::vector<int64_t> shape, int64_t dim, int64_t blocks, int64_t index, int64_t count);

  bool is_split() const { return dim >= 0 && count > 1; }
  // Every element of the tensor, unsplit.
  bool is_whole() const { return !is_split() && begin == 0 && end == whole_numel(); }
  int64_t whole_numel() const;
  int64_t part_numel() const;
  std::vector<int64_t> part_shape() const;  // the split part's shape
  int64_t numel() const { return end - begin; }
  // The elements [begin, end) of this region's values, as a region of the same tensor.
  Region sub(int64_t from, int64_t to) const;

  // fn(offset in the whole flattened tensor, position in this region's values, length), in
  // increasing order of both.
  void for_each_run(const std::function<void(int64_t offset, int64_t position, int64_t length)>& fn) const;

  std::string record() const;
  // `numel`: the stored values' element count (a range record gives only its begin).
  static Region parse(const std::string& record, int64_t numel, const std::string& where);
  // Throws tessera::Error naming `where` when the fields break the invariants.
  void check(const std::string& where) const;
  bool operator==(const Region& o) const {
    return shape == o.shape && begin == o.begin && end == o.end && dim == o.dim && blocks == o.blocks &&
           index == o.index && count == o.count;
  }
};

// Whether `pieces` (regions of one tensor: the same shape) hold every element exactly once.
bool tiles(const std::vector<Region>& pieces);

// Whether regions `a` and `b` of one tensor share an element.
bool overlaps(const Region& a, const Region& b);

// Copies the elements `from` and `to` (regions of the same whole tensor) have in common from
// `from_values` into `to_values` (both read flattened, `to_values` contiguous) and returns how many.
int64_t copy_overlap(const Region& from, const at::Tensor& from_values, const Region& to, at::Tensor& to_values);

}  // namespace tessera
