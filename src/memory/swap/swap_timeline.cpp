// Swap timelines drawn as SVG (swap_timeline.h).
#include "memory/swap/swap_timeline.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace tessera::swap {
namespace {

const char* colour(Op op) {
  switch (op) {
    case Op::Load: return "#7fb3d5";
    case Op::ComputeF: return "#82c785";
    case Op::ComputeB: return "#2e8b57";
    case Op::StoreGrad: return "#f5b041";
    case Op::Optim: return "#c39bd3";
    case Op::Evict: return "#cccccc";
  }
  return "#000000";
}

}  // namespace

std::string swap_timeline_svg(const std::vector<TimedAction>& timeline, const std::string& title) {
  double end = 0;
  for (const TimedAction& t : timeline) end = std::max(end, t.end);
  const double width = 1200, left = 80, row = 34, top = 40;
  const double scale = end > 0 ? (width - left - 20) / end : 0;
  const Stream rows[] = {Stream::compute, Stream::load, Stream::store, Stream::host};
  std::string svg;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                "<text x=\"10\" y=\"22\" font-size=\"14\">%s</text>\n",
                width, top + 4 * row + 40, title.c_str());
  svg += buf;
  for (int r = 0; r < 4; ++r) {
    std::snprintf(buf, sizeof buf, "<text x=\"10\" y=\"%.0f\">%s</text>\n", top + r * row + 20, stream_name(rows[r]));
    svg += buf;
  }
  for (const TimedAction& t : timeline) {
    if (t.action.op == Op::Evict) continue;  // instantaneous, on no stream
    const int r = static_cast<int>(std::find(std::begin(rows), std::end(rows), stream_of(t.action.op)) - rows);
    const double x = left + t.start * scale, w = std::max(1.0, (t.end - t.start) * scale);
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" fill=\"%s\" stroke=\"white\" "
                  "stroke-width=\"0.5\"><title>%s: %.2f-%.2f ms</title></rect>\n",
                  x, top + r * row, w, row - 6, colour(t.action.op), t.action.str().c_str(), 1000 * t.start,
                  1000 * t.end);
    svg += buf;
    if (w > 18) {
      const std::string label = t.action.sub == kEnds ? "e" : std::to_string(t.action.sub);
      std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"10\">%s</text>\n", x + 2,
                    top + r * row + 17, label.c_str());
      svg += buf;
    }
  }
  const double legend_y = top + 4 * row + 20;
  double x = left;
  for (Op op : {Op::Load, Op::ComputeF, Op::ComputeB, Op::StoreGrad, Op::Optim}) {
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                  x, legend_y - 10, colour(op), x + 16, legend_y, op_name(op));
    svg += buf;
    x += 120;
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\">0 .. %.1f ms</text>\n</svg>\n", x + 20, legend_y,
                1000 * end);
  svg += buf;
  return svg;
}

double exposed_load(const std::vector<TimedAction>& timeline) {
  std::map<int64_t, double> load_end;  // the latest LOAD of each sub-model started so far
  double compute_free = 0, exposed = 0;
  for (const TimedAction& t : timeline) {
    if (t.action.op == Op::Load) load_end[t.action.sub] = t.end;
    if (t.action.op != Op::ComputeF && t.action.op != Op::ComputeB) continue;
    const double ready = std::max(load_end[t.action.sub], load_end[kEnds]);
    exposed += std::max(0.0, std::min(t.start, ready) - compute_free);
    compute_free = t.end;
  }
  return exposed;
}

}  // namespace tessera::swap
