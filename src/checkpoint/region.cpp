// Region: runs, records and the overlap copy (region.h).
#include "checkpoint/region.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace tessera {
namespace {

// The product of `dims` (1 for none), refused naming `where` when it overflows or a dim is negative.
int64_t product(const int64_t* first, const int64_t* last, const std::string& where) {
  int64_t n = 1;
  for (const int64_t* d = first; d != last; ++d) {
    require(*d >= 0, where, ": negative dimension ", *d);
    require(!__builtin_mul_overflow(n, *d, &n), where, ": the shape's element count overflows");
  }
  return n;
}

struct Run {
  int64_t offset, position, length;
};

std::vector<Run> runs_of(const Region& r) {
  std::vector<Run> out;
  r.for_each_run([&](int64_t offset, int64_t position, int64_t length) { out.push_back({offset, position, length}); });
  return out;
}

}  // namespace

Region Region::whole(std::vector<int64_t> shape) {
  Region r;
  r.shape = std::move(shape);
  r.end = r.whole_numel();
  return r;
}

Region Region::range(std::vector<int64_t> shape, int64_t begin, int64_t end) {
  Region r;
  r.shape = std::move(shape);
  r.begin = begin;
  r.end = end;
  return r;
}

Region Region::split(std::vector<int64_t> shape, int64_t dim, int64_t blocks, int64_t index, int64_t count) {
  Region r;
  r.shape = std::move(shape);
  if (dim >= 0 && count > 1) {
    r.dim = dim;
    r.blocks = blocks;
    r.index = index;
    r.count = count;
  }
  r.end = r.part_numel();
  return r;
}

int64_t Region::whole_numel() const { return product(shape.data(), shape.data() + shape.size(), "a tensor region"); }

int64_t Region::part_numel() const { return is_split() ? whole_numel() / count : whole_numel(); }

std::vector<int64_t> Region::part_shape() const {
  std::vector<int64_t> out = shape;
  if (is_split()) out[static_cast<size_t>(dim)] /= count;
  return out;
}

Region Region::sub(int64_t from, int64_t to) const {
  Region r = *this;
  r.begin = begin + from;
  r.end = begin + to;
  return r;
}

void Region::for_each_run(const std::function<void(int64_t, int64_t, int64_t)>& fn) const {
  if (end <= begin) return;
  if (!is_split()) return fn(begin, 0, end - begin);
  const auto d = static_cast<size_t>(dim);
  const int64_t inner = product(shape.data() + d + 1, shape.data() + shape.size(), "a tensor region");
  const int64_t run = shape[d] / (blocks * count) * inner;  // one chunk of one block at one outer index
  for (int64_t k = begin / run; k * run < end; ++k) {
    const int64_t outer = k / blocks, block = k % blocks;
    const int64_t offset = outer * shape[d] * inner + (block * count + index) * run;
    const int64_t lo = std::max(begin, k * run), hi = std::min(end, (k + 1) * run);
    fn(offset + lo - k * run, lo - begin, hi - lo);
  }
}

std::string Region::record() const {
  std::ostringstream out;
  if (is_split()) out << "split " << dim << ' ' << blocks << ' ' << index << ' ' << count << ' ' << begin << ' ' << end;
  else out << begin;
  for (int64_t s : shape) out << ' ' << s;
  return out.str();
}

Region Region::parse(const std::string& record, int64_t numel, const std::string& where) {
  std::istringstream in(record);
  Region r;
  std::string first;
  in >> first;
  const bool split = first == "split";
  auto number = [&](int64_t& v) {
    require(static_cast<bool>(in >> v), where, ": malformed region record '", record, "'");
  };
  if (split) {
    for (int64_t* v : {&r.dim, &r.blocks, &r.index, &r.count, &r.begin, &r.end}) number(*v);
  } else {
    std::istringstream begin(first);
    require(static_cast<bool>(begin >> r.begin) && begin.eof(), where, ": malformed region record '", record, "'");
    require(!__builtin_add_overflow(r.begin, numel, &r.end), where, ": region record '", record, "' overflows");
  }
  for (std::string s; in >> s;) {
    std::istringstream dim(s);
    int64_t d = 0;
    require(static_cast<bool>(dim >> d) && dim.eof(), where, ": malformed region record '", record, "'");
    r.shape.push_back(d);
  }
  require(r.dim == -1 || r.count > 1, where, ": region record '", record, "' splits into one chunk");
  r.check(where);
  require(r.numel() == numel, where, ": region record '", record, "' holds ", r.numel(), " elements, the tensor ",
          numel);
  return r;
}

void Region::check(const std::string& where) const {
  const int64_t n = product(shape.data(), shape.data() + shape.size(), where);
  if (is_split()) {
    require(dim < static_cast<int64_t>(shape.size()) && blocks >= 1 && index >= 0 && index < count, where,
            ": region '", record(), "' names no chunk of its shape");
    int64_t chunks = 0;
    require(!__builtin_mul_overflow(blocks, count, &chunks) && shape[static_cast<size_t>(dim)] % chunks == 0, where,
            ": region '", record(), "' does not divide dimension ", dim, " into ", blocks, " x ", count, " chunks");
  }
  require(begin >= 0 && begin <= end && end <= (is_split() ? n / count : n), where, ": region '", record(),
          "' lies outside its tensor");
}

bool tiles(const std::vector<Region>& pieces) {
  if (pieces.empty()) return false;
  std::vector<Run> runs;
  for (const Region& r : pieces) {
    if (r.shape != pieces.front().shape) return false;
    for (const Run& run : runs_of(r)) runs.push_back(run);
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.offset < b.offset; });
  int64_t cursor = 0;
  for (const Run& run : runs) {
    if (run.offset != cursor) return false;
    cursor += run.length;
  }
  return cursor == pieces.front().whole_numel();
}

namespace {

// fn(position in a's values, position in b's values, length) for each stretch of elements a and b
// share, in increasing order.
void for_each_overlap(const Region& a, const Region& b, const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const std::vector<Run> x = runs_of(a), y = runs_of(b);
  for (size_t i = 0, j = 0; i < x.size() && j < y.size();) {
    const int64_t lo = std::max(x[i].offset, y[j].offset);
    const int64_t x_end = x[i].offset + x[i].length, y_end = y[j].offset + y[j].length, hi = std::min(x_end, y_end);
    if (hi > lo) fn(x[i].position + lo - x[i].offset, y[j].position + lo - y[j].offset, hi - lo);
    if (x_end <= y_end) ++i;
    else ++j;
  }
}

}  // namespace

bool overlaps(const Region& a, const Region& b) {
  bool any = false;
  for_each_overlap(a, b, [&](int64_t, int64_t, int64_t) { any = true; });
  return any;
}

int64_t copy_overlap(const Region& from, const at::Tensor& from_values, const Region& to, at::Tensor& to_values) {
  const at::Tensor src = from_values.reshape({-1}), dst = to_values.view({-1});
  int64_t copied = 0;
  for_each_overlap(from, to, [&](int64_t src_at, int64_t dst_at, int64_t n) {
    dst.narrow(0, dst_at, n).copy_(src.narrow(0, src_at, n));
    copied += n;
  });
  return copied;
}

}  // namespace tessera
