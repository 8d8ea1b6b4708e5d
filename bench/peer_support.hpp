// What the side-by-side benchmarks share with their Python peers: finding an interpreter with
// torch, a scratch directory for the exchanged files, and the relative gap of two figures.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace braid::bench {

// `s` quoted for /bin/sh.
inline std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The first interpreter that imports torch (and numpy, for the files), or nothing:
// $BRAID_PYTHON when set, else the build's Python 3 (`configured`), python3, /usr/bin/python3.
inline std::optional<std::string> find_torch_python(const std::string& configured) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("BRAID_PYTHON"); env && *env) {
    candidates.push_back(env);
  } else {
    if (!configured.empty()) candidates.push_back(configured);
    candidates.push_back("python3");
    candidates.push_back("/usr/bin/python3");
  }
  for (const auto& python : candidates)
    if (std::system((quoted(python) + " -c 'import torch, numpy' >/dev/null 2>&1").c_str()) == 0) return python;
  return std::nullopt;
}

// A fresh directory under the system's temporary one, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    path = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

}  // namespace braid::bench
