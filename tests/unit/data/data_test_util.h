// Helpers of the data tests: temporary files and checks that an error names what it should.
// POSIX calls, not std::filesystem: libtorch.so exports an incompatible build of some
// std::filesystem functions (remove_all crashes when called from tessera code).
#pragma once

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>

#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"

namespace tessera::test {

// A fresh, empty directory under the gtest temp dir.
inline std::string fresh_dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/tessera_data_" + name;
  ::nftw(dir.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return std::remove(path); }, 16,
         FTW_DEPTH | FTW_PHYS);
  if (::mkdir(dir.c_str(), 0755) != 0) ADD_FAILURE() << "cannot create " << dir;
  return dir;
}

inline bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Names of the entries of a directory, "." and ".." left out.
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* entry = ::readdir(d))
      if (std::string(entry->d_name) != "." && std::string(entry->d_name) != "..") names.push_back(entry->d_name);
    ::closedir(d);
  }
  return names;
}

// Passes when f throws tessera::Error whose message contains every one of `parts`.
inline ::testing::AssertionResult throws_naming(const std::function<void()>& f,
                                                std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    std::string message = e.what();
    for (const std::string& part : parts)
      if (message.find(part) == std::string::npos)
        return ::testing::AssertionFailure() << "message '" << message << "' lacks '" << part << "'";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no tessera::Error thrown";
}

}  // namespace tessera::test
