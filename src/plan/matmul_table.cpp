// Measured product rates by shape (matmul_table.h).
#include "plan/matmul_table.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace tessera::plan {
namespace {

// Where x falls on `axis` (ascending): the index below and the weight of the one above, clamped.
std::pair<size_t, double> locate(const std::vector<double>& axis, double x) {
  if (axis.size() == 1 || x <= axis.front()) return {0, 0.0};
  if (x >= axis.back()) return {axis.size() - 1, 0.0};
  const size_t above = static_cast<size_t>(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin());
  return {above - 1, (x - axis[above - 1]) / (axis[above] - axis[above - 1])};
}

}  // namespace

MatmulTable MatmulTable::parse(const std::string& text, const std::string& source) {
  std::map<std::tuple<double, double, double>, double> points;
  std::set<double> values[3];
  std::istringstream in(text);
  std::string line;
  bool header = false;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    if (!header) {
      require(line == "rows,cols,depth,tflops_bf16", source, ":", number,
              ": the header must be rows,cols,depth,tflops_bf16 (got '", line, "')");
      header = true;
      continue;
    }
    double field[4];
    std::istringstream cells(line);
    std::string cell;
    int n = 0;
    for (; n < 4 && std::getline(cells, cell, ','); ++n) {
      size_t used = 0;
      try {
        field[n] = std::stod(cell, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      require(used == cell.size() && !cell.empty(), source, ":", number, ": '", cell, "' is not a number");
    }
    require(n == 4 && !std::getline(cells, cell, ','), source, ":", number,
            ": a point is rows,cols,depth,tflops_bf16 (got '", line, "')");
    for (int d = 0; d < 4; ++d)
      require(field[d] > 0 && std::isfinite(field[d]), source, ":", number, ": every value must be above 0 (got '", line, "')");
    require(points.emplace(std::make_tuple(field[0], field[1], field[2]), field[3]).second, source, ":", number,
            ": the point ", field[0], " x ", field[1], " x ", field[2], " appears twice");
    for (int d = 0; d < 3; ++d) values[d].insert(field[d]);
  }
  require(!points.empty(), source, ": no points (rows,cols,depth,tflops_bf16 lines)");
  MatmulTable table;
  for (const double r : values[0])
    for (const double c : values[1])
      for (const double d : values[2]) {
        const auto it = points.find({r, c, d});
        require(it != points.end(), source, ": the grid has no point ", r, " x ", c, " x ", d,
                " (every combination of the rows, cols and depth values given must appear)");
        table.rates_.push_back(it->second);
      }
  for (int d = 0; d < 3; ++d)
    for (const double v : values[d]) table.axis_[d].push_back(std::log2(v));
  return table;
}

double MatmulTable::tflops(double rows, double cols, double depth) const {
  const auto [r, wr] = locate(axis_[0], std::log2(std::max(rows, 1.0)));
  const auto [c, wc] = locate(axis_[1], std::log2(std::max(cols, 1.0)));
  const auto [d, wd] = locate(axis_[2], std::log2(std::max(depth, 1.0)));
  const size_t nc = axis_[1].size(), nd = axis_[2].size();
  double rate = 0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) {
        const double weight = (i ? wr : 1 - wr) * (j ? wc : 1 - wc) * (k ? wd : 1 - wd);
        if (weight == 0) continue;
        rate += weight * rates_[((r + i) * nc + (c + j)) * nd + (d + k)];
      }
  return rate;
}

}  // namespace tessera::plan
