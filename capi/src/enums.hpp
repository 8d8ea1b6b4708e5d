// Conversions between C ABI enums and core enums whose orders differ, defined next to
// the entry points that use them first (plan.cpp, config.cpp, groups.cpp) and read again by
// vocabulary.cpp, which names the C values.
#pragma once

#include "braid/braid.h"
#include "core/plan/plan.hpp"
#include "core/runtime/grid.hpp"
#include "core/spec/cluster.hpp"
#include "core/spec/run.hpp"

namespace braid::capi {

// Takes the raw integer: a C caller may put any value in an enum field, and loading an
// out-of-range value as a C++ enum is undefined behaviour. BRAID_ERR_INVALID_ARGUMENT
// for a value that is not a braid_strategy. (plan.cpp)
braid_status strategy_from_c(int s, plan::Strategy* out);
braid_strategy strategy_to_c(plan::Strategy s);

// (config.cpp)
braid_precision precision_to_c(spec::Precision p);
braid_recompute recompute_to_c(spec::Recompute r);

// Error(Status::internal) for an axis braid_axis does not name (context parallelism).
// (groups.cpp)
braid_axis axis_to_c(runtime::Axis axis);

}  // namespace braid::capi
