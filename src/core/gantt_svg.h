// A timeline as a picture: one row per worker or stream, one box per action from its start to its
// end (a Gantt chart), as a self-contained SVG. The pipeline's schedules
// (parallel/pipeline/timeline_svg.h) and the swap engine's streams (memory/swap/swap_timeline.h)
// are drawn with it. Every text is escaped; none is truncated. Time runs left to right from 0 to
// the chart's end over a fixed width; idle time is left white.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tessera {

struct GanttBox {
  size_t row = 0;
  double start = 0, end = 0;  // in the chart's time unit; drawn at least 1 pixel wide
  std::string fill;           // an SVG colour
  std::string tooltip;        // shown on hover
  std::string label;          // written inside when the box is at least GanttChart::min_label_px wide
  double top = 0, height = 1; // the part of the row's height it covers (a thin wait: 0.4 and 0.2)
};

struct GanttLegendItem {
  std::string fill, text;
};

struct GanttChart {
  std::string title;
  std::vector<std::string> rows;  // row names, top to bottom
  std::vector<GanttBox> boxes;
  double end = 0;                 // the time at the right edge (0: the latest box's end)
  bool row_frames = false;        // a light frame around each row
  std::vector<GanttLegendItem> legend;
  std::string footer;             // a line under the rows (after the legend)
  double min_label_px = 20;
};

std::string gantt_svg(const GanttChart& chart);

}  // namespace tessera
