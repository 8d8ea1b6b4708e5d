// What one rank executes in a step: the plan's program (orchestrate::build_program, which for
// a colocated plan is the bubble scheduler's), and this rank's place in it, found from the
// plan's process groups: its stage, its DP replica of that stage and its tensor-parallel
// rank. The program is the one `braid simulate` prices and the C ABI hands to host engines.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/plan.hpp"
#include "core/runtime/groups.hpp"

namespace braid::train {

struct RankProgram {
  pipeline::Program program;       // every stage's instructions
  int stage = 0;                   // this rank's stage
  int replica = 0;                 // its DP replica of the stage
  int tp_rank = 0;                 // its place in the replica's tensor-parallel group
  std::vector<int> stage_of_rank;  // every rank's stage

  bool online() const { return program.schedule == spec::Schedule::optimus_online; }  // fill waits online
  const pipeline::StageProgram& stage_program() const { return program.stages[static_cast<std::size_t>(stage)]; }
  const std::vector<pipeline::Instruction>& instructions() const { return stage_program().instructions; }
  // The rank running (stage, replica, tp rank) of this program.
  int rank_of(int stage, int replica, int tp_rank) const;
};

// The schedules braid train executes for `plan`, its default first: those the plan allows
// (orchestrate::schedules_for) but interleaved 1F1B, which plan and simulate price and the
// reference trainer, one model chunk per stage, does not run.
std::vector<spec::Schedule> executed_schedules(const cost::CostModel& cost, const plan::Plan& plan);
// `name` ("" for the default) as one of executed_schedules; throws Error(Status::unsupported)
// naming those it runs otherwise.
spec::Schedule executed_schedule(const cost::CostModel& cost, const plan::Plan& plan, std::string_view name);

// `schedule` nullopt runs the plan's default. Throws Error(Status::unsupported) listing the
// schedules the plan runs when it runs no `schedule`, Error(Status::internal) when the
// program's stages and the groups' disagree.
RankProgram rank_program(const cost::CostModel& cost, const plan::Plan& plan, std::optional<spec::Schedule> schedule,
                         const runtime::Topology& topology, int rank);

}  // namespace braid::train
