// The command line of the C++ benchmarks: --help (the usage, exit 0), the one flag of those
// that take no other (`--quick`, what their ctest entry runs; anything else prints the usage
// and exits 2), and a main that reports errors instead of aborting.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace braid::bench {

// --help or -h anywhere: `usage` on standard output and exit 0 (asked for, not an error).
inline void exit_on_help(int argc, char** argv, const std::string& usage) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage.c_str());
      std::exit(0);
    }
  }
}

inline bool quick_flag(int argc, char** argv, const char* name) {
  exit_on_help(argc, argv, std::string("usage: ") + name + " [--quick]\n");
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

// A benchmark's main: `run`, with an error (a run file that cannot be read or planned) printed
// as "name: message" and exit 1, not an abort.
inline int run_reporting(const char* name, int argc, char** argv, int (*run)(int, char**)) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace braid::bench
