// Where a folder of data files that travels with the binary (configs/, clusters/) is found.
#pragma once

#include <string>
#include <vector>

namespace tessera {

// In order: the directory in environment variable `env` when set, then relative to this binary:
// <bin>/<folder>, <bin>/../<folder> (a build directory inside the source tree) and
// <bin>/../share/tessera/<folder> (an install prefix). No compile-time path: a binary moved or
// installed elsewhere finds the files that travel with it.
std::vector<std::string> resource_search_path(const char* env, const std::string& folder);
// The first directory of resource_search_path that exists ("" when none does).
std::string resource_dir(const char* env, const std::string& folder);
// The names (without ".toml") of the TOML files in that directory, sorted; empty without one.
std::vector<std::string> resource_toml_names(const char* env, const std::string& folder);

}  // namespace tessera
