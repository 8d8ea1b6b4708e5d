#include "tools/braid/rank_error.hpp"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.hpp"
#include "tools/braid/commands.hpp"

namespace braid::cli {

namespace {

// The status and message of `error`: a braid::Error's own, anything else an internal error.
std::pair<int, std::string> described(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return {static_cast<int>(e.status()), e.what()};
  } catch (const std::exception& e) {
    return {static_cast<int>(Status::internal), std::string("internal error: ") + e.what()};
  }
}

}  // namespace

int fail_rank(runtime::World& world, const std::exception_ptr& error) {
  const auto [status, message] = described(error);
  const int code =
      report_error(status, (world.size() > 1 ? "rank " + std::to_string(world.rank()) + ": " : "") + message);
  if (world.size() > 1) world.abort(code);
  return code;
}

int agree_on_setup(runtime::World& world, const std::function<void()>& setup) {
  std::exception_ptr error;
  try {
    setup();
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  const auto [status, message] = error ? described(error) : std::pair<int, std::string>{0, ""};
  const int code = error ? exit_status(status) : kExitOk;
  if (world.size() < 2 || !world.has_communicator()) {
    if (error) report_error(status, message);
    return code;
  }
  const std::int32_t mine[2] = {error ? 1 : 0, code};
  std::vector<std::int32_t> every(2 * static_cast<std::size_t>(world.size()));
  world.communicator().allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(every)));
  int first = -1, failed = 0, worst = kExitOk;
  for (int r = 0; r < world.size(); ++r) {
    if (!every[2 * static_cast<std::size_t>(r)]) continue;
    if (first < 0) first = r;
    ++failed;
    worst = std::max<int>(worst, every[2 * static_cast<std::size_t>(r) + 1]);
  }
  if (first < 0) return kExitOk;
  if (world.rank() == first) {
    report_error(status, failed == world.size() ? message : "rank " + std::to_string(first) + ": " + message);
  }
  return worst;
}

}  // namespace braid::cli
