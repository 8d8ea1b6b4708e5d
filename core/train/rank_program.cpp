#include "core/train/rank_program.hpp"

#include <algorithm>

#include "core/common/error.hpp"
#include "core/common/text.hpp"
#include "core/orchestrate/program.hpp"
#include "core/pipeline/from_plan.hpp"

namespace braid::train {

int RankProgram::rank_of(int s, int r, int t) const { return program.stages[static_cast<std::size_t>(s)].device(r, t); }

std::vector<spec::Schedule> executed_schedules(const cost::CostModel& cost, const plan::Plan& plan) {
  std::vector<spec::Schedule> out = orchestrate::schedules_for(cost, plan);
  std::erase(out, spec::Schedule::interleaved);
  return out;
}

spec::Schedule executed_schedule(const cost::CostModel& cost, const plan::Plan& plan, std::string_view name) {
  const std::vector<spec::Schedule> runs = executed_schedules(cost, plan);
  if (name.empty()) return runs.front();
  const spec::Schedule schedule = spec::schedule_named(name);  // invalid_argument for a name that is no schedule
  if (std::find(runs.begin(), runs.end(), schedule) != runs.end()) return schedule;
  if (schedule == spec::Schedule::interleaved)
    throw Error(Status::unsupported,
                "braid train runs one model chunk per pipeline stage, not 'interleaved' (plan "
                "and simulate price it); this plan runs " +
                    join_choices(spec::schedule_names(runs)));
  throw Error(Status::unsupported, pipeline::schedule_refusal(plan, runs, name));
}

RankProgram rank_program(const cost::CostModel& cost, const plan::Plan& plan, std::optional<spec::Schedule> schedule,
                         const runtime::Topology& topology, int rank) {
  RankProgram out;
  out.program = orchestrate::build_program(cost, plan, schedule);
  const auto& stages = out.program.stages;
  if (stages.size() != topology.stages.size())
    throw Error(Status::internal, "the program has " + std::to_string(stages.size()) + " stages, the groups " +
                                      std::to_string(topology.stages.size()));
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const auto& p = stages[s];
    const auto& g = topology.stages[s];
    if (p.first_device != g.first_device || p.replicas != g.replicas ||
        p.devices_per_replica != g.devices_per_replica || p.device_stride != g.device_stride)
      throw Error(Status::internal,
                  "the program's stage " + p.name + " and the groups' " + g.name + " lie on different devices");
  }
  out.stage_of_rank = topology.stage_of_rank;
  out.stage = topology.stage_of_rank.at(static_cast<std::size_t>(rank));
  const auto& st = stages[static_cast<std::size_t>(out.stage)];
  out.replica = st.replica_of(rank);
  out.tp_rank = rank - st.device(out.replica);
  return out;
}

}  // namespace braid::train
