// Subcommands of the braid CLI. Each returns the process exit status:
// 0 success, 1 internal error, 2 bad input, 3 infeasible.
#pragma once

#include <string>
#include <vector>

namespace braid::cli {

int run_plan(const std::vector<std::string>& args);
int run_info(const std::vector<std::string>& args);
int run_simulate(const std::vector<std::string>& args);
int run_data(const std::vector<std::string>& args);
int run_groups(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
int run_calibrate(const std::vector<std::string>& args);

// Exit status for a braid::Error status, and the one place errors are printed.
int report_error(int status, const std::string& message);
// The exit status report_error returns for `status`, printing nothing.
int exit_status(int status);

constexpr int kExitOk = 0;
constexpr int kExitInternal = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitInfeasible = 3;

}  // namespace braid::cli
