// braid_program_* and braid_simulat*: the pipeline program of a plan, its
// instructions, and its simulated step (results, Chrome trace, text Gantt).
#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "capi/src/guard.hpp"
#include "capi/src/handles.hpp"
#include "core/bubble/emit.hpp"
#include "core/bubble/encoder_tasks.hpp"
#include "core/orchestrate/program.hpp"
#include "core/pipeline/program.hpp"
#include "core/sim/trace.hpp"

namespace {

using braid::pipeline::Op;
using braid::sim::Cause;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr std::size_t kSimulationOptionsVersions[] = {sizeof(braid_simulation_options)};
constexpr int32_t kMaxGanttWidth = 10000;

// The C enums mirror the core's: checked here so that a reordering fails to build.
static_assert(BRAID_OP_LOAD_MICROBATCH == static_cast<int>(Op::load_microbatch));
static_assert(BRAID_OP_FORWARD == static_cast<int>(Op::forward));
static_assert(BRAID_OP_BACKWARD == static_cast<int>(Op::backward));
static_assert(BRAID_OP_SEND_ACTIVATION == static_cast<int>(Op::send_activation));
static_assert(BRAID_OP_RECV_ACTIVATION == static_cast<int>(Op::recv_activation));
static_assert(BRAID_OP_SEND_GRAD == static_cast<int>(Op::send_grad));
static_assert(BRAID_OP_RECV_GRAD == static_cast<int>(Op::recv_grad));
static_assert(BRAID_OP_BATCH_SYNC == static_cast<int>(Op::batch_sync));
static_assert(BRAID_OP_REDUCE_GRADS == static_cast<int>(Op::reduce_grads));
static_assert(BRAID_OP_OPTIMIZER_STEP == static_cast<int>(Op::optimizer_step));
static_assert(BRAID_OP_ENCODER_TASK == static_cast<int>(Op::encoder_task));
static_assert(BRAID_OP_ENCODER_TASK + 1 == braid::pipeline::kOpCount);
static_assert(BRAID_FLAG_NO_STORE == braid::pipeline::kNoStore);
static_assert(BRAID_FLAG_RECOMPUTE == braid::pipeline::kRecompute);
static_assert(BRAID_FLAG_BACKWARD_TASK == braid::pipeline::kBackwardTask);
static_assert(BRAID_BUBBLE_DP_START == static_cast<int>(Cause::dp_start));
static_assert(BRAID_BUBBLE_DP_END == static_cast<int>(Cause::dp_end));
static_assert(BRAID_BUBBLE_DP_SHARD == static_cast<int>(Cause::dp_shard));
static_assert(BRAID_BUBBLE_PP_WARMUP == static_cast<int>(Cause::pp_warmup));
static_assert(BRAID_BUBBLE_PP_COOLDOWN == static_cast<int>(Cause::pp_cooldown));
static_assert(BRAID_BUBBLE_PP_OTHER == static_cast<int>(Cause::pp_other));
static_assert(BRAID_BUBBLE_TP == static_cast<int>(Cause::tp));
static_assert(BRAID_BUBBLE_BATCH_SYNC == static_cast<int>(Cause::batch_sync));
static_assert(BRAID_BUBBLE_IMBALANCE == static_cast<int>(Cause::imbalance));
static_assert(BRAID_FLAG_SYNC_ONLY == braid::pipeline::kSyncOnly);
static_assert(BRAID_FLAG_IN_TP_BUBBLE == braid::pipeline::kInTpBubble);
static_assert(BRAID_FLAG_IN_DP_WAIT == braid::pipeline::kInDpWait);
static_assert(BRAID_FLAG_ALL == (BRAID_FLAG_NO_STORE | BRAID_FLAG_RECOMPUTE | BRAID_FLAG_BACKWARD_TASK |
                                 BRAID_FLAG_SYNC_ONLY | BRAID_FLAG_IN_TP_BUBBLE | BRAID_FLAG_IN_DP_WAIT));
// The numbering of a colocated stage's encoder units and ordering messages (core/bubble).
static_assert(BRAID_ENCODER_UNIT_EMBEDDING == braid::bubble::kEmbeddingUnit);
static_assert(BRAID_ENCODER_UNIT_FIRST_KERNEL == braid::bubble::kFirstKernelUnit);
static_assert(BRAID_ENCODER_LAYER_KERNELS == braid::bubble::kLayerUnits);
static_assert(BRAID_ENCODER_UNIT_HEAD == braid::bubble::kHeadUnit);
static_assert(BRAID_ENCODER_UNIT_TRANSFER == braid::bubble::kTransferUnit);
static_assert(BRAID_ENCODER_UNIT_SHARD == braid::bubble::kShardUnit);
static_assert(BRAID_ENCODER_UNITS == braid::bubble::kEncoderUnits);
static_assert(1 + BRAID_ENCODER_UNITS == braid::bubble::encoder_unit(1, 0));
static_assert(BRAID_ENCODER_MESSAGE_BASE == braid::bubble::kEncoderTag);
static_assert(BRAID_ENCODER_MESSAGE_BASE + (2 << 16) + 5 == braid::bubble::encoder_tag(2, 5));
static_assert(BRAID_BUBBLE_COUNT == braid::sim::kCauseCount);

braid_opcode opcode_to_c(Op op) {
  switch (op) {
    case Op::load_microbatch:
      return BRAID_OP_LOAD_MICROBATCH;
    case Op::forward:
      return BRAID_OP_FORWARD;
    case Op::backward:
      return BRAID_OP_BACKWARD;
    case Op::send_activation:
      return BRAID_OP_SEND_ACTIVATION;
    case Op::recv_activation:
      return BRAID_OP_RECV_ACTIVATION;
    case Op::send_grad:
      return BRAID_OP_SEND_GRAD;
    case Op::recv_grad:
      return BRAID_OP_RECV_GRAD;
    case Op::batch_sync:
      return BRAID_OP_BATCH_SYNC;
    case Op::reduce_grads:
      return BRAID_OP_REDUCE_GRADS;
    case Op::optimizer_step:
      return BRAID_OP_OPTIMIZER_STEP;
    case Op::encoder_task:
      return BRAID_OP_ENCODER_TASK;
  }
  throw braid::Error(braid::Status::internal,
                     "instruction with unknown opcode " + std::to_string(static_cast<int>(op)));
}

void copy_bubbles(const std::array<double, braid::sim::kCauseCount>& from, double (&to)[BRAID_BUBBLE_COUNT]) {
  for (std::size_t c = 0; c < from.size(); ++c) to[c] = from[c];
}

std::string stage_range(std::size_t index, std::size_t stages) {
  return "index " + std::to_string(index) + " is out of range (the program has " + std::to_string(stages) +
         (stages == 1 ? " stage)" : " stages)");
}

std::string instruction_range(std::size_t index, std::size_t stage, std::size_t count) {
  return "index " + std::to_string(index) + " is out of range (stage " + std::to_string(stage) + " has " +
         std::to_string(count) + (count == 1 ? " instruction)" : " instructions)");
}

braid_instruction instruction_to_c(const braid::pipeline::Instruction& i) {
  braid_instruction v = BRAID_INSTRUCTION_INIT;
  v.opcode = opcode_to_c(i.op);
  v.microbatch = i.microbatch;
  v.chunk = i.chunk;
  v.peer = i.peer;
  v.group = i.group;
  v.unit = i.unit;
  v.flags = i.flags;
  return v;
}

}  // namespace

namespace braid::capi {

std::unique_ptr<braid_program> make_program(pipeline::Program program, const plan::Plan& plan) {
  auto out = std::make_unique<braid_program>();
  out->program = std::move(program);
  for (const auto& s : out->program.stages) {
    const auto peers = pipeline::message_peers(s);  // every stage it exchanges messages with
    out->prev.emplace_back(peers.prev.begin(), peers.prev.end());
    out->next.emplace_back(peers.next.begin(), peers.next.end());
    out->module.push_back(plan::placement_index(plan, s.module));
    out->parts.push_back(orchestrate::plan_parts(plan, s));
  }
  return out;
}

}  // namespace braid::capi

extern "C" {

/* ---- programs ---------------------------------------------------------------------- */

BRAID_API braid_status braid_program_create(const braid_plan* plan, const char* schedule, braid_program** out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(out, "out is NULL");
  *out = nullptr;
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  const auto& cost = *plan->config->cost;
  const auto& chosen = plan->result.best;
  // No name: the schedule the plan options named, else the plan's default.
  const auto named =
      schedule && *schedule ? braid::orchestrate::parse_schedule_for(cost, chosen, schedule) : plan->schedule;
  auto program = braid::capi::make_program(braid::orchestrate::build_program(cost, chosen, named), chosen);
  *out = program.release();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_program_destroy(braid_program* program) {
  return braid::capi::destroy_handle(program, __func__, "braid_program");
}

BRAID_API braid_status braid_program_schedule(const braid_program* program, const char** schedule) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(program, braid_program);
  BRAID_REQUIRE(schedule, "schedule is NULL");
  *schedule = braid::spec::schedule_name(program->program.schedule);  // static storage
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_program_stage_count(const braid_program* program, size_t* count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(program, braid_program);
  BRAID_REQUIRE(count, "count is NULL");
  *count = program->program.stages.size();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_program_stage(const braid_program* program, size_t stage, braid_stage_info* info) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(program, braid_program);
  // Version 1 ends before gradient_scale and part_count.
  BRAID_REQUIRE_STRUCT(info, braid_stage_info, offsetof(braid_stage_info, gradient_scale));
  const auto& stages = program->program.stages;
  BRAID_REQUIRE(stage < stages.size(), stage_range(stage, stages.size()));
  const auto& s = stages[stage];
  const auto& prev = program->prev[stage];
  const auto& next = program->next[stage];
  braid_stage_info v = BRAID_STAGE_INFO_INIT;
  v.name = s.name.c_str();
  v.module = program->module[stage];
  v.replicas = s.replicas;
  v.devices_per_replica = s.devices_per_replica;
  v.first_device = s.first_device;
  v.device_stride = s.device_stride;
  v.depth = s.depth;
  v.instruction_count = s.instructions.size();
  v.prev_count = prev.size();
  v.prev = prev.empty() ? nullptr : prev.data();
  v.next_count = next.size();
  v.next = next.empty() ? nullptr : next.data();
  v.gradient_scale = braid::pipeline::gradient_scale(program->program, stage);
  v.part_count = program->parts[stage].size();
  braid::capi::copy_out(v, info);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_program_instruction(const braid_program* program, size_t stage, size_t index,
                                                 braid_instruction* instruction) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(program, braid_program);
  BRAID_REQUIRE_STRUCT(instruction, braid_instruction, sizeof(braid_instruction));
  const auto& stages = program->program.stages;
  BRAID_REQUIRE(stage < stages.size(), "stage " + stage_range(stage, stages.size()));
  const auto& list = stages[stage].instructions;
  BRAID_REQUIRE(index < list.size(), instruction_range(index, stage, list.size()));
  braid::capi::copy_out(instruction_to_c(list[index]), instruction);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_program_stage_part(const braid_program* program, size_t stage, size_t index,
                                                braid_stage_part* part) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(program, braid_program);
  BRAID_REQUIRE_STRUCT(part, braid_stage_part, sizeof(braid_stage_part));
  const auto& stages = program->program.stages;
  BRAID_REQUIRE(stage < stages.size(), "stage " + stage_range(stage, stages.size()));
  const auto& parts = program->parts[stage];
  BRAID_REQUIRE(index < parts.size(), "index " + std::to_string(index) + " is out of range (stage " +
                                          std::to_string(stage) + " has " + std::to_string(parts.size()) +
                                          (parts.size() == 1 ? " part)" : " parts)"));
  const auto& p = parts[index];
  braid_stage_part v = BRAID_STAGE_PART_INIT;
  v.module = p.module;
  v.module_stage = p.module_stage;
  v.first_layer = p.first_layer;
  v.layer_count = p.layer_count;
  braid::capi::copy_out(v, part);
  return BRAID_OK;
  BRAID_API_END
}

/* ---- per-rank programs ------------------------------------------------------------------ */

BRAID_API braid_status braid_program_microbatches(const braid_program* program, int32_t* count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(program, braid_program);
  BRAID_REQUIRE(count, "count is NULL");
  *count = program->program.microbatches;
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_program_rank(const braid_program* program, int32_t rank, braid_program_rank_info* info) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(program, braid_program);
  BRAID_REQUIRE_STRUCT(info, braid_program_rank_info, sizeof(braid_program_rank_info));
  const auto place = program->program.place_of(rank);
  braid_program_rank_info v = BRAID_PROGRAM_RANK_INFO_INIT;
  v.stage = place.stage;
  v.replica = place.replica;
  v.tp_rank = place.tp_rank;
  v.instruction_count = program->program.stages[static_cast<std::size_t>(place.stage)].instructions.size();
  braid::capi::copy_out(v, info);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_program_rank_instruction(const braid_program* program, int32_t rank, size_t index,
                                                      braid_instruction* instruction) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(program, braid_program);
  BRAID_REQUIRE_STRUCT(instruction, braid_instruction, sizeof(braid_instruction));
  const auto stage = static_cast<std::size_t>(program->program.place_of(rank).stage);
  const auto& list = program->program.stages[stage].instructions;
  BRAID_REQUIRE(index < list.size(),
                instruction_range(index, stage, list.size()) + " (the stage of rank " + std::to_string(rank) + ")");
  braid::capi::copy_out(instruction_to_c(list[index]), instruction);
  return BRAID_OK;
  BRAID_API_END
}

/* ---- simulation ---------------------------------------------------------------------- */

BRAID_API braid_status braid_simulate(const braid_program* program, const braid_simulation_options* options,
                                      braid_simulation** out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(out, "out is NULL");
  *out = nullptr;
  BRAID_REQUIRE_HANDLE(program, braid_program);
  braid_simulation_options opts = BRAID_SIMULATION_OPTIONS_INIT;
  if (options)
    BRAID_READ_OPTIONS(options, braid_simulation_options, kSimulationOptionsVersions, BRAID_SIMULATION_OPTIONS_VERSION,
                       BRAID_SIMULATION_OPTIONS_INIT, &opts);
  BRAID_REQUIRE(opts.record_trace == 0 || opts.record_trace == 1,
                "options->record_trace is " + std::to_string(opts.record_trace) + "; set it to 0 or 1");
  // A trace of no replica would draw every stage idle: with record_trace, at least one.
  BRAID_REQUIRE(opts.trace_replicas >= (opts.record_trace ? 1 : 0) || opts.trace_replicas == -1,
                "options->trace_replicas is " + std::to_string(opts.trace_replicas) +
                    "; set it to -1 (all replicas) or a count" + (opts.record_trace ? " of at least 1" : ""));
  braid::sim::Options sim_opts;
  sim_opts.trace = opts.record_trace == 1;
  sim_opts.trace_replicas = opts.trace_replicas;
  auto simulation = std::make_unique<braid_simulation>();
  simulation->program = program;
  simulation->traced = sim_opts.trace;
  simulation->result = braid::sim::simulate(program->program, sim_opts);
  *out = simulation.release();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_simulation_destroy(braid_simulation* simulation) {
  return braid::capi::destroy_handle(simulation, __func__, "braid_simulation");
}

BRAID_API braid_status braid_simulation_result_get(const braid_simulation* simulation,
                                                   braid_simulation_result* result) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(simulation, braid_simulation);
  BRAID_REQUIRE_STRUCT(result, braid_simulation_result, sizeof(braid_simulation_result));
  const auto& r = simulation->result;
  braid_simulation_result v = BRAID_SIMULATION_RESULT_INIT;
  v.step_time_s = r.step_time_s;
  v.bubble_fraction = r.bubble_fraction;
  copy_bubbles(r.bubbles, v.bubbles_s);
  v.peak_memory_gib = r.peak_memory_gib;
  v.mfu = r.mfu;
  v.devices = r.devices;
  v.ranks = r.ranks;
  v.events = r.events;
  braid::capi::copy_out(v, result);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_simulation_stage(const braid_simulation* simulation, size_t stage,
                                              braid_stage_result* result) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(simulation, braid_simulation);
  BRAID_REQUIRE_STRUCT(result, braid_stage_result, sizeof(braid_stage_result));
  const auto& stages = simulation->result.stages;
  BRAID_REQUIRE(stage < stages.size(), stage_range(stage, stages.size()));
  const auto& s = stages[stage];
  braid_stage_result v = BRAID_STAGE_RESULT_INIT;
  v.busy_s = s.busy_s;
  v.idle_s = s.idle_s;
  copy_bubbles(s.bubbles, v.bubbles_s);
  v.peak_memory_gib = s.peak_memory_bytes / kGiB;
  v.finish_s = s.finish_s;
  braid::capi::copy_out(v, result);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_simulation_write_trace(const braid_simulation* simulation, const char* path) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(simulation, braid_simulation);
  BRAID_REQUIRE(path, "path is NULL");
  BRAID_REQUIRE(*path, "path is empty");
  BRAID_REQUIRE(simulation->traced,
                "the simulation kept no trace; simulate with options.record_trace = 1 to write one");
  braid::sim::write_chrome_trace(path, simulation->program->program, simulation->result);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_simulation_gantt(const braid_simulation* simulation, int32_t width, const char** text) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(simulation, braid_simulation);
  BRAID_REQUIRE(text, "text is NULL");
  *text = nullptr;
  BRAID_REQUIRE(width >= 0 && width <= kMaxGanttWidth, "width is " + std::to_string(width) +
                                                           "; set it to 0 (automatic) or 1 to " +
                                                           std::to_string(kMaxGanttWidth) + " columns");
  BRAID_REQUIRE(simulation->traced,
                "the simulation kept no trace; simulate with options.record_trace = 1 to draw a Gantt chart");
  auto* s = const_cast<braid_simulation*>(simulation);  // the rendering is a cache owned by the handle
  std::lock_guard<std::mutex> lock(s->gantt_mutex);
  auto it = s->gantts.find(width);
  if (it == s->gantts.end())
    it = s->gantts.emplace(width, braid::sim::gantt(s->program->program, s->result, width)).first;
  *text = it->second.c_str();
  return BRAID_OK;
  BRAID_API_END
}

}  // extern "C"
