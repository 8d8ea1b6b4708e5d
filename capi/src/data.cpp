// braid_reorder_*: data reordering of one global batch for a host data loader.
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "capi/src/guard.hpp"
#include "capi/src/handles.hpp"
#include "core/data/batch_reorder.hpp"
#include "core/orchestrate/program.hpp"

namespace {

constexpr std::size_t kBatchVersions[] = {sizeof(braid_sample_batch)};
constexpr std::size_t kOptionsVersions[] = {sizeof(braid_reorder_options)};

static_assert(BRAID_REORDER_NONE == static_cast<int>(braid::data::Reordering::none));
static_assert(BRAID_REORDER_INTRA == static_cast<int>(braid::data::Reordering::intra));
static_assert(BRAID_REORDER_INTRA_INTER == static_cast<int>(braid::data::Reordering::intra_inter));

// Per-sample sizes from the caller's arrays; a NULL array leaves the nominal size.
std::vector<braid::data::SampleSizes> read_sizes(const braid_sample_batch& b, const braid::spec::DataSpec& data) {
  std::vector<braid::data::SampleSizes> sizes(b.samples, braid::data::nominal_sizes(data));
  auto fill = [&](const int32_t* from, int braid::data::SampleSizes::*field) {
    if (!from) return;
    for (std::size_t i = 0; i < b.samples; ++i) sizes[i].*field = from[i];
  };
  fill(b.image_resolution, &braid::data::SampleSizes::image_resolution);
  fill(b.text_tokens, &braid::data::SampleSizes::text_tokens);
  fill(b.audio_tokens, &braid::data::SampleSizes::audio_tokens);
  fill(b.generated_image_resolution, &braid::data::SampleSizes::generated_image_resolution);
  return sizes;
}

}  // namespace

extern "C" {

BRAID_API braid_status braid_reorder_create(const braid_plan* plan, const braid_sample_batch* batch,
                                            const braid_reorder_options* options, braid_reorder** out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(out, "out is NULL");
  *out = nullptr;
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  BRAID_REQUIRE(batch, "batch is NULL");
  braid_sample_batch b = BRAID_SAMPLE_BATCH_INIT;
  static_assert(braid::capi::valid_versions<braid_sample_batch>(kBatchVersions));
  if (const auto status = braid::capi::read_struct(__func__, "batch", "braid_sample_batch", "BRAID_SAMPLE_BATCH_INIT",
                                                   batch, kBatchVersions, &b);
      status != BRAID_OK)
    return status;
  braid_reorder_options opts = BRAID_REORDER_OPTIONS_INIT;
  if (options)
    BRAID_READ_OPTIONS(options, braid_reorder_options, kOptionsVersions, BRAID_REORDER_OPTIONS_VERSION,
                       BRAID_REORDER_OPTIONS_INIT, &opts);
  // Read the enum as an int: a C caller may store any value in it, and loading an out-of-range
  // enumerator through the enum type is undefined behaviour.
  static_assert(sizeof(braid_reordering) == sizeof(int), "C enums are int-sized");
  int reordering = 0;
  std::memcpy(&reordering, &opts.reordering, sizeof reordering);
  BRAID_REQUIRE(
      reordering >= BRAID_REORDER_NONE && reordering <= BRAID_REORDER_INTRA_INTER,
      "options->reordering is " + std::to_string(reordering) + "; use BRAID_REORDER_NONE, _INTRA or _INTRA_INTER");
  BRAID_REQUIRE(opts.max_evaluations >= 0, "options->max_evaluations must be 0 (default) or more");
  BRAID_REQUIRE(b.samples > 0, "batch->samples is 0");
  // Before anything is sized by it: samples x modules must not wrap.
  BRAID_REQUIRE(b.samples <= braid::data::kMaxHostSamples,
                "batch->samples is " + std::to_string(b.samples) + ", above the " +
                    std::to_string(braid::data::kMaxHostSamples) + " samples a batch may hold");

  const auto& run = plan->config->run;
  const auto& chosen = plan->result.best;
  braid::data::HostBatch host;
  host.samples = b.samples;
  if (b.module_costs) {
    host.placement_costs = std::span<const double>(b.module_costs, b.samples * chosen.modules.size());
  } else {
    host.sizes = read_sizes(b, run.data);
  }
  braid::data::OrderOptions search;
  if (opts.max_evaluations > 0) search.max_evaluations = opts.max_evaluations;
  const auto program = braid::orchestrate::build_program(*plan->config->cost, chosen, plan->schedule);
  auto r = std::make_unique<braid_reorder>();
  r->batch =
      braid::data::reorder_batch(run, chosen, program, host, static_cast<braid::data::Reordering>(reordering), search);
  *out = r.release();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_reorder_destroy(braid_reorder* reorder) {
  return braid::capi::destroy_handle(reorder, __func__, "braid_reorder");
}

BRAID_API braid_status braid_reorder_info_get(const braid_reorder* reorder, braid_reorder_info* info) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(reorder, braid_reorder);
  BRAID_REQUIRE_STRUCT(info, braid_reorder_info, sizeof(braid_reorder_info));
  braid_reorder_info v = BRAID_REORDER_INFO_INIT;
  const auto& L = reorder->batch.layout;
  v.samples = static_cast<size_t>(L.samples);
  v.cells = L.grid.cells;
  v.pipeline_groups = L.grid.groups;
  v.microbatches = L.slots;
  v.cell_microbatch = L.cell_slot;
  v.straggler_before = reorder->batch.straggler_before;
  v.straggler_after = reorder->batch.straggler_after;
  v.evaluations = reorder->batch.arrangement.evaluations;
  braid::capi::copy_out(v, info);
  return BRAID_OK;
  BRAID_API_END
}

#define BRAID_REQUIRE_SAMPLES(array, count)                                  \
  BRAID_REQUIRE(array, #array " is NULL");                                   \
  BRAID_REQUIRE((count) == reorder->batch.arrangement.cell.size(),           \
                #count " is " + std::to_string(count) + "; the batch has " + \
                    std::to_string(reorder->batch.arrangement.cell.size()) + " samples")

BRAID_API braid_status braid_reorder_ranks(const braid_reorder* reorder, size_t module, int32_t* ranks, size_t count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(reorder, braid_reorder);
  BRAID_REQUIRE_SAMPLES(ranks, count);
  BRAID_REQUIRE(module < reorder->batch.module_dp.size(),
                "module " + std::to_string(module) + " is out of range (the plan has " +
                    std::to_string(reorder->batch.module_dp.size()) + " modules)");
  const int dp = reorder->batch.module_dp[module];
  if (dp == 0) {
    throw braid::Error(braid::Status::unsupported,
                       "module " + std::to_string(module) +
                           " is not on the data-parallel grid (a colocated encoder runs as encoder tasks)");
  }
  const auto& cell = reorder->batch.arrangement.cell;
  for (std::size_t i = 0; i < count; ++i) ranks[i] = reorder->batch.layout.grid.rank_of(cell[i], dp);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_reorder_cells(const braid_reorder* reorder, int32_t* cells, size_t count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(reorder, braid_reorder);
  BRAID_REQUIRE_SAMPLES(cells, count);
  for (std::size_t i = 0; i < count; ++i) cells[i] = reorder->batch.arrangement.cell[i];
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_reorder_microbatches(const braid_reorder* reorder, int32_t* microbatches, size_t count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(reorder, braid_reorder);
  BRAID_REQUIRE_SAMPLES(microbatches, count);
  for (std::size_t i = 0; i < count; ++i) microbatches[i] = reorder->batch.arrangement.slot[i];
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_reorder_order(const braid_reorder* reorder, size_t group, int32_t* order, size_t count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(reorder, braid_reorder);
  BRAID_REQUIRE(order, "order is NULL");
  const auto& orders = reorder->batch.arrangement.orders;
  BRAID_REQUIRE(group < orders.size(), "group " + std::to_string(group) + " is out of range (" +
                                           std::to_string(orders.size()) + " pipeline groups)");
  BRAID_REQUIRE(count == orders[group].size(), "count is " + std::to_string(count) + "; a pipeline runs " +
                                                   std::to_string(orders[group].size()) + " microbatches");
  for (std::size_t k = 0; k < count; ++k) order[k] = orders[group][k];
  return BRAID_OK;
  BRAID_API_END
}

}  // extern "C"
