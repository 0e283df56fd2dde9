// Timelines drawn as SVG Gantt charts (gantt_svg.h).
#include "core/gantt_svg.h"

#include <algorithm>
#include <sstream>

namespace tessera {
namespace {

std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string gantt_svg(const GanttChart& chart) {
  constexpr double kLeft = 80, kTop = 40, kRow = 34, kBox = 26, kWidth = 1000, kLegendStep = 130;
  double end = chart.end;
  if (end <= 0)
    for (const GanttBox& b : chart.boxes) end = std::max(end, b.end);
  const double scale = end > 0 ? kWidth / end : 1;
  const double rows_bottom = kTop + kRow * static_cast<double>(chart.rows.size());
  const double legend_y = rows_bottom + 16, footer_y = legend_y + (chart.legend.empty() ? 0 : 24);
  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kLeft + kWidth + 20 << "\" height=\""
      << footer_y + 20 << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kLeft << "\" y=\"20\" font-size=\"14\">" << escaped(chart.title) << "</text>\n";
  for (size_t r = 0; r < chart.rows.size(); ++r) {
    const double y = kTop + kRow * static_cast<double>(r);
    out << "<text x=\"8\" y=\"" << y + kBox * 0.7 << "\">" << escaped(chart.rows[r]) << "</text>\n";
    if (chart.row_frames)
      out << "<rect x=\"" << kLeft << "\" y=\"" << y << "\" width=\"" << kWidth << "\" height=\"" << kBox
          << "\" fill=\"none\" stroke=\"#ddd\"/>\n";
  }
  for (const GanttBox& b : chart.boxes) {
    const double x = kLeft + b.start * scale, w = std::max(1.0, (b.end - b.start) * scale);
    const double y = kTop + kRow * static_cast<double>(b.row) + kBox * b.top;
    out << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << kBox * b.height
        << "\" fill=\"" << escaped(b.fill) << "\" stroke=\"white\" stroke-width=\"0.5\"><title>" << escaped(b.tooltip)
        << "</title></rect>\n";
    if (!b.label.empty() && w >= chart.min_label_px)
      out << "<text x=\"" << x + w / 2 << "\" y=\"" << y + kBox * b.height * 0.65 << "\" text-anchor=\"middle\">"
          << escaped(b.label) << "</text>\n";
  }
  double x = kLeft;
  for (const GanttLegendItem& item : chart.legend) {
    out << "<rect x=\"" << x << "\" y=\"" << legend_y - 10 << "\" width=\"12\" height=\"12\" fill=\""
        << escaped(item.fill) << "\"/><text x=\"" << x + 16 << "\" y=\"" << legend_y << "\">" << escaped(item.text)
        << "</text>\n";
    x += kLegendStep;
  }
  if (!chart.footer.empty())
    out << "<text x=\"" << kLeft << "\" y=\"" << footer_y << "\">" << escaped(chart.footer) << "</text>\n";
  out << "</svg>\n";
  return out.str();
}

}  // namespace tessera
