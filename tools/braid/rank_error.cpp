#include "tools/braid/rank_error.hpp"

#include <string>

#include "core/common/error.hpp"
#include "tools/braid/commands.hpp"

namespace braid::cli {

int fail_rank(runtime::World& world, const std::exception_ptr& error) {
  int code = kExitInternal;
  const std::string where = world.size() > 1 ? "rank " + std::to_string(world.rank()) + ": " : "";
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    code = report_error(static_cast<int>(e.status()), where + e.what());
  } catch (const std::exception& e) {
    code = report_error(static_cast<int>(Status::internal), where + "internal error: " + e.what());
  }
  if (world.size() > 1) world.abort(code);
  return code;
}

}  // namespace braid::cli
