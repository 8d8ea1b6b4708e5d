// braid_vocabulary_*: the names of the C enums and schedule lists, as the core spells them.
#include <cstring>
#include <string>
#include <vector>

#include "capi/src/enums.hpp"
#include "capi/src/guard.hpp"
#include "core/bubble/scheduler.hpp"
#include "core/data/arrangement.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/plan.hpp"
#include "core/runtime/grid.hpp"
#include "core/sim/simulator.hpp"
#include "core/spec/cluster.hpp"
#include "core/spec/run.hpp"
#include "core/spec/schedule.hpp"

namespace {

static_assert(BRAID_ATTENTION_FLASH == static_cast<int>(braid::spec::Attention::flash));
static_assert(BRAID_ATTENTION_STANDARD == static_cast<int>(braid::spec::Attention::standard));

// Names indexed by C value, from a C -> core converter over the core values 0..count-1
// (the C and core enums have the same members in another order).
template <class Core, class ToC>
std::vector<const char*> by_c_value(int count, ToC to_c, const char* (*name)(Core)) {
  std::vector<const char*> out(static_cast<std::size_t>(count), nullptr);
  for (int v = 0; v < count; ++v) {
    const auto core = static_cast<Core>(v);
    out.at(static_cast<std::size_t>(to_c(core))) = name(core);
  }
  for (const char* n : out)
    if (!n) throw braid::Error(braid::Status::internal, "a C enum value has no core counterpart");
  return out;
}

// The core axes braid_axis names, by C value (context parallelism is not in the C ABI).
std::vector<const char*> axis_names() {
  std::vector<const char*> out;
  for (int v = 0; v < braid::runtime::kAxisCount; ++v) {
    const auto axis = static_cast<braid::runtime::Axis>(v);
    braid_axis c = BRAID_AXIS_TP;
    try {
      c = braid::capi::axis_to_c(axis);
    } catch (const braid::Error&) {
      continue;
    }
    const auto at = static_cast<std::size_t>(c);
    if (out.size() <= at) out.resize(at + 1, nullptr);
    out[at] = braid::runtime::axis_name(axis);
  }
  for (const char* n : out)
    if (!n) throw braid::Error(braid::Status::internal, "a braid_axis value has no core axis");
  return out;
}

const char* vocabulary_name(int vocabulary) {
  switch (vocabulary) {
    case BRAID_VOCABULARY_STRATEGY:
      return "strategy";
    case BRAID_VOCABULARY_SCHEDULE:
      return "schedule";
    case BRAID_VOCABULARY_OPCODE:
      return "opcode";
    case BRAID_VOCABULARY_BUBBLE_CAUSE:
      return "bubble_cause";
    case BRAID_VOCABULARY_REORDERING:
      return "reordering";
    case BRAID_VOCABULARY_AXIS:
      return "axis";
    case BRAID_VOCABULARY_BUBBLE_SCHEDULE:
      return "bubble_schedule";
    case BRAID_VOCABULARY_PRECISION:
      return "precision";
    case BRAID_VOCABULARY_RECOMPUTE:
      return "recompute";
    case BRAID_VOCABULARY_ATTENTION:
      return "attention";
  }
  return nullptr;
}

// The names of `vocabulary` (a known one) in C value order. Each points to static storage.
// The opcode, bubble cause and reordering C enums follow the core's order (static_asserts
// in pipeline.cpp and data.cpp), as does attention (above); strategies, precisions,
// recomputation and axes go through the C converters.
std::vector<const char*> names(int vocabulary) {
  std::vector<const char*> out;
  switch (vocabulary) {
    case BRAID_VOCABULARY_STRATEGY:
      for (int v = 0;; ++v) {
        braid::plan::Strategy s;
        if (braid::capi::strategy_from_c(v, &s) != BRAID_OK) break;
        out.push_back(braid::plan::strategy_name(s));
      }
      break;
    case BRAID_VOCABULARY_SCHEDULE:
      for (auto s : braid::spec::all_schedules()) out.push_back(braid::spec::schedule_name(s));
      break;
    case BRAID_VOCABULARY_OPCODE:
      for (int v = 0; v < braid::pipeline::kOpCount; ++v)
        out.push_back(braid::pipeline::op_name(static_cast<braid::pipeline::Op>(v)));
      break;
    case BRAID_VOCABULARY_BUBBLE_CAUSE:
      for (int v = 0; v < braid::sim::kCauseCount; ++v)
        out.push_back(braid::sim::cause_name(static_cast<braid::sim::Cause>(v)));
      break;
    case BRAID_VOCABULARY_REORDERING:
      for (int v = BRAID_REORDER_NONE; v <= BRAID_REORDER_INTRA_INTER; ++v)
        out.push_back(braid::data::reordering_name(static_cast<braid::data::Reordering>(v)));
      break;
    case BRAID_VOCABULARY_AXIS:
      return axis_names();
    case BRAID_VOCABULARY_BUBBLE_SCHEDULE:
      for (auto s : braid::bubble::colocated_schedules()) out.push_back(braid::spec::schedule_name(s));
      break;
    case BRAID_VOCABULARY_PRECISION:
      return by_c_value(BRAID_PRECISION_FP32 + 1, braid::capi::precision_to_c, braid::spec::precision_name);
    case BRAID_VOCABULARY_RECOMPUTE:
      return by_c_value(BRAID_RECOMPUTE_FULL + 1, braid::capi::recompute_to_c, braid::spec::recompute_name);
    case BRAID_VOCABULARY_ATTENTION:
      for (int v = BRAID_ATTENTION_FLASH; v <= BRAID_ATTENTION_STANDARD; ++v)
        out.push_back(braid::spec::attention_name(static_cast<braid::spec::Attention>(v)));
      break;
  }
  return out;
}

// Reads the enum as an int: a C caller may pass any value, and loading an out-of-range
// enumerator through the enum type is undefined behaviour.
int raw(braid_vocabulary vocabulary) {
  static_assert(sizeof(braid_vocabulary) == sizeof(int), "C enums are int-sized");
  int v = 0;
  std::memcpy(&v, &vocabulary, sizeof v);
  return v;
}

constexpr int kVocabularyCount = BRAID_VOCABULARY_ATTENTION + 1;

std::string unknown_vocabulary(int v) {
  return "vocabulary " + std::to_string(v) + " is not a braid_vocabulary (there are " +
         std::to_string(kVocabularyCount) + ", 0 to " + std::to_string(kVocabularyCount - 1) + ")";
}

}  // namespace

extern "C" {

BRAID_API braid_status braid_vocabulary_size(braid_vocabulary vocabulary, size_t* size) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(size, "size is NULL");
  const int v = raw(vocabulary);
  BRAID_REQUIRE(vocabulary_name(v), unknown_vocabulary(v));
  *size = names(v).size();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_vocabulary_name(braid_vocabulary vocabulary, size_t value, const char** name) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(name, "name is NULL");
  const int v = raw(vocabulary);
  BRAID_REQUIRE(vocabulary_name(v), unknown_vocabulary(v));
  const auto all = names(v);
  BRAID_REQUIRE(value < all.size(), "value " + std::to_string(value) + " is out of range: vocabulary " +
                                        vocabulary_name(v) + " has " + std::to_string(all.size()) + " names");
  *name = all[value];
  return BRAID_OK;
  BRAID_API_END
}

}  // extern "C"
