// For the fuzz targets that read files (tokenizer, token_files, config, checkpoint_dir): one input
// becomes one or several files.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace tessera::fuzz {

// A fresh directory of this process under /tmp, named after `target`, made once.
inline const std::string& scratch_dir(const std::string& target) {
  static const std::string dir = "/tmp/tessera-fuzz-" + target + "-" + std::to_string(getpid());
  static const bool made = system(("mkdir -p " + dir).c_str()) == 0;
  if (!made) __builtin_trap();
  return dir;
}

// Writes `text` to `path`, replacing the file.
inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Writes the parts of `input` separated by lines "%%" to dir/names[0], dir/names[1], ... in turn;
// the files of the parts the input lacks are removed.
inline void write_parts(const std::string& dir, const std::string& input, const std::vector<std::string>& names) {
  size_t start = 0;
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    if (start > input.size()) {
      std::remove(path.c_str());
      continue;
    }
    const size_t end = input.find("\n%%\n", start);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << input.substr(start, end == std::string::npos ? std::string::npos : end - start);
    start = end == std::string::npos ? input.size() + 1 : end + 4;
  }
}

}  // namespace tessera::fuzz
