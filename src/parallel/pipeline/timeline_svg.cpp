// Pipeline timeline pictures (timeline_svg.h).
#include "parallel/pipeline/timeline_svg.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/gantt_svg.h"

namespace tessera::pipeline {
namespace {

// hsl() colour of a micro-batch: hue by micro-batch, lightness by kind; greys for a GATHER and
// the optimizer step.
std::string fill_of(const Action& a, int64_t micro_batches) {
  if (a.op == Op::Gather) return "#999";
  if (a.op == Op::Optim) return "#444";
  const int hue = static_cast<int>((a.micro * 360) / std::max<int64_t>(micro_batches, 1)) % 360;
  const int light = a.op == Op::F ? 62 : a.op == Op::W ? 82 : 40;
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "hsl(%d,70%%,%d%%)", hue, light);
  return buffer;
}

}  // namespace

std::string timeline_svg(const Schedule& s, const Simulation& sim, const std::string& title) {
  GanttChart chart;
  chart.title = title;
  chart.end = sim.step_time;
  chart.row_frames = true;
  chart.min_label_px = 22;
  chart.footer = "boxes: <stage><F|B|I|W><micro-batch>; colour = micro-batch; F bright, B/I dark, W pale; "
                 "grey = ZeRO-3 GATHER, dark grey = OPTIM; white = idle (bubble)";
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    chart.rows.push_back("rank " + std::to_string(r));
    for (const TimedAction& t : sim.timeline[r]) {
      GanttBox box;
      box.row = r;
      box.start = t.start;
      box.end = t.end;
      if (t.action.is_transfer()) {
        if (t.end <= t.start) continue;
        box.fill = "#bbb";
        box.tooltip = t.action.str() + (t.action.op == Op::SendF || t.action.op == Op::SendB ? " (posting)" : " (waiting)");
        box.top = 0.4;
        box.height = 0.2;
      } else {
        std::ostringstream tooltip;
        tooltip << t.action.str() << " " << t.start << "-" << t.end;
        box.fill = fill_of(t.action, s.micro_batches);
        box.tooltip = tooltip.str();
        box.label = t.action.str();
      }
      chart.boxes.push_back(std::move(box));
    }
  }
  return gantt_svg(chart);
}

std::string timeline_chrome_trace(const std::vector<std::vector<TimedAction>>& timeline, double seconds_per_unit) {
  std::ostringstream out;
  out << "{\"traceEvents\": [";
  bool first = true;
  for (size_t r = 0; r < timeline.size(); ++r) {
    out << (first ? "" : ",") << "\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << r
        << ", \"args\": {\"name\": \"pipeline rank " << r << "\"}}";
    first = false;
    for (const TimedAction& t : timeline[r])
      out << ",\n{\"name\": \"" << t.action.str() << "\", \"cat\": \"" << (t.action.is_compute() ? "compute" : t.action.is_transfer() ? "wait" : "parameters")
          << "\", \"ph\": \"X\", \"pid\": " << r << ", \"tid\": 0, \"ts\": " << t.start * seconds_per_unit * 1e6
          << ", \"dur\": " << (t.end - t.start) * seconds_per_unit * 1e6 << "}";
  }
  out << "\n]}\n";
  return out.str();
}

}  // namespace tessera::pipeline
