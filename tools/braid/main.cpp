// braid: plan multimodal LLM training across many GPUs.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "core/common/error.hpp"
#include "core/common/text.hpp"
#include "tools/braid/commands.hpp"

namespace braid::cli {

int report_error(int status, const std::string& message) {
  std::fprintf(stderr, "braid: error: %s\n", message.c_str());
  return exit_status(status);
}

int exit_status(int status) {
  switch (static_cast<Status>(status)) {
    case Status::infeasible:
      return kExitInfeasible;
    case Status::internal:
    case Status::out_of_memory:
      return kExitInternal;
    default:
      return kExitBadInput;
  }
}

}  // namespace braid::cli

namespace {

const char* kUsage =
    "usage: braid <command> [options]\n"
    "\n"
    "braid plans and runs the training of multimodal LLMs (encoders + projector + LLM\n"
    "+ generator, or contrastive dual encoders) with a parallel layout per submodule.\n"
    "\n"
    "commands:\n"
    "  plan      choose a parallel plan for a run file and predict step time, MFU and memory\n"
    "  simulate  simulate a plan's pipeline programs: step time, idle time by cause, traces\n"
    "  groups    the process groups of a plan on N ranks: grids, tp/dp/pp groups, links\n"
    "  train     train the run's reference model on generated data (one process or mpiexec)\n"
    "  calibrate measure this machine (under mpiexec) into a cluster file for --cluster\n"
    "  info      version, ABI, build options, devices\n"
    "  data      show samples of the generated image-caption dataset (captions, thumbnails)\n"
    "\n"
    "Run 'braid <command> --help' for a command's options. Exit status: 0 success,\n"
    "2 bad input, 3 infeasible (nothing fits), 1 internal error.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace braid::cli;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitBadInput;
  }
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (command == "--version" || command == "version") {
    std::printf("braid %d.%d.%d (ABI %d)\n", BRAID_VERSION_MAJOR, BRAID_VERSION_MINOR, BRAID_VERSION_PATCH,
                BRAID_ABI_VERSION);
    return kExitOk;
  }
  try {
    if (command == "plan") return run_plan(args);
    if (command == "info") return run_info(args);
    if (command == "simulate") return run_simulate(args);
    if (command == "data") return run_data(args);
    if (command == "groups") return run_groups(args);
    if (command == "calibrate") return run_calibrate(args);
    if (command == "train") return run_train(args);
  } catch (const braid::Error& e) {
    return report_error(static_cast<int>(e.status()), e.what());
  } catch (const std::exception& e) {
    return report_error(static_cast<int>(braid::Status::internal), std::string("internal error: ") + e.what());
  }
  const std::string guess =
      braid::closest_match(command, {"plan", "info", "simulate", "data", "groups", "calibrate", "train"});
  std::fprintf(stderr, "braid: error: unknown command '%s'%s\n\n%s", command.c_str(),
               guess.empty() ? "" : (" (did you mean '" + guess + "'?)").c_str(), kUsage);
  return kExitBadInput;
}
