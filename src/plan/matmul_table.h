// A device's measured matrix-product rates by shape (cluster file key device.matmul_table,
// docs/plan.md): a CSV of `rows,cols,depth,tflops_bf16` for products [rows, depth] x [depth, cols],
// '#' lines naming where the numbers come from. The points form a full grid (every combination of
// the rows, cols and depth values given appears once); a product between them is priced at the
// rate interpolated linearly in log2 of each dimension, one outside them at the nearest edge's rate
// (products taller, wider or deeper than the grid run at its edge's efficiency, not better).
//
// Refused naming the file and line: a malformed line, a rate not above 0, a repeated point, and a
// grid with a missing point (named).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::plan {

class MatmulTable {
 public:
  MatmulTable() = default;
  // Reads `path` (`source` names it in refusals).
  static MatmulTable parse(const std::string& text, const std::string& source);
  bool empty() const { return rates_.empty(); }
  // TFLOP/s of a [rows, depth] x [depth, cols] product.
  double tflops(double rows, double cols, double depth) const;

 private:
  std::vector<double> axis_[3];  // log2 of the distinct rows, cols and depth values, ascending
  std::vector<double> rates_;    // [rows][cols][depth]
};

}  // namespace tessera::plan
