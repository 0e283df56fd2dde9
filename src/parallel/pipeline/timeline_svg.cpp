// Pipeline timeline pictures (timeline_svg.h).
#include "parallel/pipeline/timeline_svg.h"

#include <cstdio>
#include <sstream>

namespace tessera::pipeline {
namespace {

std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

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
  constexpr double kLeft = 70, kTop = 40, kRow = 34, kBox = 26, kWidth = 1000;
  const double scale = sim.step_time > 0 ? kWidth / sim.step_time : 1;
  const double height = kTop + kRow * static_cast<double>(sim.timeline.size()) + 40;
  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kLeft + kWidth + 20 << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kLeft << "\" y=\"20\" font-size=\"14\">" << escaped(title) << "</text>\n";
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    const double y = kTop + kRow * static_cast<double>(r);
    out << "<text x=\"8\" y=\"" << y + kBox * 0.7 << "\">rank " << r << "</text>\n"
        << "<rect x=\"" << kLeft << "\" y=\"" << y << "\" width=\"" << kWidth << "\" height=\"" << kBox
        << "\" fill=\"none\" stroke=\"#ddd\"/>\n";
    for (const TimedAction& t : sim.timeline[r]) {
      const double x = kLeft + t.start * scale, w = (t.end - t.start) * scale;
      if (t.action.is_transfer()) {
        if (w > 0)
          out << "<rect x=\"" << x << "\" y=\"" << y + kBox * 0.4 << "\" width=\"" << w << "\" height=\"" << kBox * 0.2
              << "\" fill=\"#bbb\"><title>" << t.action.str()
              << (t.action.op == Op::SendF || t.action.op == Op::SendB ? " (posting)" : " (waiting)") << "</title></rect>\n";
        continue;
      }
      out << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << kBox << "\" fill=\""
          << fill_of(t.action, s.micro_batches) << "\" stroke=\"white\"><title>" << t.action.str() << " "
          << t.start << "-" << t.end << "</title></rect>\n";
      if (w >= 22)
        out << "<text x=\"" << x + w / 2 << "\" y=\"" << y + kBox * 0.65 << "\" text-anchor=\"middle\">"
            << t.action.str() << "</text>\n";
    }
  }
  out << "<text x=\"" << kLeft << "\" y=\"" << height - 14
      << "\">boxes: &lt;stage&gt;&lt;F|B|I|W&gt;&lt;micro-batch&gt;; colour = micro-batch; F bright, B/I dark, W pale; "
         "grey = ZeRO-3 GATHER, dark grey = OPTIM; white = idle (bubble)</text>\n</svg>\n";
  return out.str();
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
