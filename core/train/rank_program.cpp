#include "core/train/rank_program.hpp"

#include "core/common/error.hpp"
#include "core/orchestrate/program.hpp"

namespace braid::train {

int RankProgram::rank_of(int s, int r, int t) const { return program.stages[static_cast<std::size_t>(s)].device(r, t); }

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
