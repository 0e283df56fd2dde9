#include "plan/cluster.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/fs.h"
#include "core/resource_dir.h"

namespace tessera::plan {
namespace fs = std::filesystem;

namespace {

constexpr const char* kClusterDirEnv = "TESSERA_CLUSTER_DIR";

// Keys a file may leave out (their defaults mean "none" or "unknown"); every other key is required.
const std::set<std::string> kOptional = {"cluster.description", "cluster.nodes", "cluster.shared_slowdown",
                                         "cluster.shared_slowdown_memory",
                                         "device.kind", "device.kernel_overhead_us", "device.matmul_overhead_us", "device.socket_gbs",
                                         "device.attention_tflops_bf16", "device.attention_tflops_fp32", "device.matmul_table",
                                         "device.activation_codec_int8_gbs", "device.activation_codec_int4_gbs",
                                         "device.activation_codec_fp8_gbs",
                                         "device.activation_codec_bf16_gbs", "intra_node.latency_us",
                                         "intra_node.call_overhead_us", "inter_node.call_overhead_us",
                                         "inter_node.latency_us", "host.memory_gib", "host.device_link_gbs",
                                         "host.optimizer_gbs", "peers.bandwidth_gbs", "peers.latency_us",
                                         "peers.round_overhead_ms", "peers.cpu_ns_per_byte"};

}  // namespace

Cluster::Tier Cluster::tier(const std::vector<int64_t>& members) const {
  std::map<int64_t, int64_t> per_node;
  for (int64_t rank : members) ++per_node[node_of(rank)];
  Tier t;
  if (per_node.size() <= 1) {
    t.bandwidth_bytes_per_s = intra_node.bandwidth_gbs * 1e9;
    t.latency_s = intra_node.latency_us * 1e-6;
    t.call_overhead_s = intra_node.call_overhead_us * 1e-6;
    return t;
  }
  int64_t local = 0;
  for (const auto& [node, count] : per_node) local = std::max(local, count);
  t.crosses_nodes = true;
  t.bandwidth_bytes_per_s = std::min(intra_node.bandwidth_gbs, inter_node.bandwidth_gbs * static_cast<double>(local)) * 1e9;
  t.latency_s = inter_node.latency_us * 1e-6;
  t.call_overhead_s = inter_node.call_overhead_us * 1e-6;
  return t;
}

Cluster parse_cluster(const std::string& text, const std::string& source) {
  const toml::table root = parse_toml(text, source);
  Cluster c;
  c.source = source;
  std::set<std::string> sections;
  c.for_each_section([&](const char* name, auto& options) {
    sections.insert(name);
    const toml::node* node = root.get(name);
    if (node && !node->is_table()) fail(source, ": '", name, "' must be a [", name, "] section");
    const toml::table* table = node ? node->as_table() : nullptr;
    std::set<std::string> keys;
    auto collect = [&](const char* key, auto&&...) { keys.insert(key); };
    options.visit(collect);
    if (table)
      for (const auto& [key, value] : *table) {
        const std::string unknown(key.str());
        if (keys.count(unknown)) continue;
        const std::string hint = closest_key(unknown, keys);
        fail(source, ": unknown key '", name, ".", unknown, "'",
             hint.empty() ? std::string() : " (did you mean '" + std::string(name) + "." + hint + "'?)",
             "; docs/plan.md lists every key of a cluster file");
      }
    TomlSectionReader reader(table, name, source);
    options.visit(reader);
    for (const std::string& key : keys) {
      const std::string full = std::string(name) + "." + key;
      require(reader.assigned().count(key) || kOptional.count(full), source, ": ", full,
              " is missing (every number of a cluster file is given, with its source; docs/plan.md)");
    }
    check_ranges(options, name, source);
  });
  for (const auto& [key, node] : root) {
    const std::string name(key.str());
    if (sections.count(name)) continue;
    const std::string hint = closest_key(name, sections);
    fail(source, ": unknown section '[", name, "]'", hint.empty() ? "" : " (did you mean '[" + hint + "]'?)");
  }
  require(c.device.kind == "cuda" || c.device.kind == "cpu", source, ": device.kind must be cuda or cpu (got '",
          c.device.kind, "')");
  require(c.device.matmul_tflops_bf16 <= c.device.peak_tflops_bf16 && c.device.matmul_tflops_fp32 <= c.device.peak_tflops_fp32,
          source, ": device.matmul_tflops_* (achievable) must not exceed device.peak_tflops_* (peak)");
  if (!c.device.matmul_table.empty()) {
    const fs::path table = fs::path(source).parent_path() / c.device.matmul_table;
    require(fs::is_regular_file(table), source, ": device.matmul_table = '", c.device.matmul_table, "': no such file (",
            table.string(), ")");
    c.device.matmul_rates = MatmulTable::parse(read_file(table.string()), table.string());
  }
  return c;
}

std::vector<std::string> cluster_presets() { return resource_toml_names(kClusterDirEnv, "clusters"); }

Cluster load_cluster(const std::string& name) {
  std::string path = name;
  if (!fs::is_regular_file(path)) {
    const std::string dir = resource_dir(kClusterDirEnv, "clusters");
    const bool bare = name.find('/') == std::string::npos && name.find(".toml") == std::string::npos;
    if (!bare || dir.empty() || !fs::is_regular_file(fs::path(dir) / (name + ".toml"))) {
      std::string known;
      for (const std::string& preset : cluster_presets()) known += (known.empty() ? "" : ", ") + preset;
      fail(name, ": no such cluster file or preset", dir.empty() ? std::string(" (no clusters/ directory found; set ") +
                                                                        kClusterDirEnv + ")"
                                                                  : " in " + dir + " (presets: " + known + ")");
    }
    path = (fs::path(dir) / (name + ".toml")).string();
  }
  require_regular_file(path);
  return parse_cluster(read_file(path), path);
}

}  // namespace tessera::plan
