// Swap timelines drawn as SVG (swap_timeline.h).
#include "memory/swap/swap_timeline.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "core/gantt_svg.h"

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
  const Stream rows[] = {Stream::compute, Stream::load, Stream::store, Stream::host};
  GanttChart chart;
  chart.title = title;
  chart.min_label_px = 18;
  for (Stream stream : rows) chart.rows.push_back(stream_name(stream));
  double end = 0;
  for (const TimedAction& t : timeline) {
    end = std::max(end, t.end);
    if (t.action.op == Op::Evict) continue;  // instantaneous, on no stream
    const size_t r = static_cast<size_t>(std::find(std::begin(rows), std::end(rows), stream_of(t.action.op)) - rows);
    char tooltip[64];
    std::snprintf(tooltip, sizeof tooltip, ": %.2f-%.2f ms", 1000 * t.start, 1000 * t.end);
    GanttBox box;
    box.row = r;
    box.start = t.start;
    box.end = t.end;
    box.fill = colour(t.action.op);
    box.tooltip = t.action.str() + tooltip;
    box.label = t.action.sub == kEnds ? "e" : std::to_string(t.action.sub);
    chart.boxes.push_back(std::move(box));
  }
  for (Op op : {Op::Load, Op::ComputeF, Op::ComputeB, Op::StoreGrad, Op::Optim})
    chart.legend.push_back({colour(op), op_name(op)});
  char footer[48];
  std::snprintf(footer, sizeof footer, "0 .. %.1f ms", 1000 * end);
  chart.footer = footer;
  return gantt_svg(chart);
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
