// The one flag of the benchmarks that take no other: `--quick`, what their ctest entry
// runs. Anything else prints the usage and exits 2.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace braid::bench {

inline bool quick_flag(int argc, char** argv, const char* name) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--quick") {
      std::fprintf(stderr, "usage: %s [--quick]\n", name);
      std::exit(2);
    }
    quick = true;
  }
  return quick;
}

}  // namespace braid::bench
