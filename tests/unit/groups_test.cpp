// Rank grids against brute-force enumeration, and process groups built from the
// bundled runs' plans against the pipeline programs of the same plans.
#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/bubble/encoder_tasks.hpp"
#include "core/common/text.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/orchestrate/program.hpp"
#include "core/runtime/groups.hpp"
#include "core/runtime/groups_io.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using runtime::Axis;
using runtime::Coords;
using runtime::Grid;
using runtime::GridSizes;

std::size_t at(Axis a) { return static_cast<std::size_t>(a); }

// ---- grids ---------------------------------------------------------------------------

struct Brute {
  Coords c;
  int rank;
};

// Every coordinate tuple with its rank, computed the long way: rank = offset +
// sum over the order of coordinate x product of the sizes of the faster axes.
std::vector<Brute> enumerate(const GridSizes& sizes, const std::vector<Axis>& order, int offset) {
  std::vector<Brute> out;
  for (int tp = 0; tp < sizes.tp; ++tp)
    for (int cp = 0; cp < sizes.cp; ++cp)
      for (int dp = 0; dp < sizes.dp; ++dp)
        for (int pp = 0; pp < sizes.pp; ++pp) {
          Coords c{};
          c[at(Axis::tp)] = tp;
          c[at(Axis::cp)] = cp;
          c[at(Axis::dp)] = dp;
          c[at(Axis::pp)] = pp;
          int rank = offset, scale = 1;
          for (Axis a : order) {
            rank += c[at(a)] * scale;
            scale *= sizes.of(a);
          }
          out.push_back({c, rank});
        }
  return out;
}

std::string order_string(const std::vector<Axis>& order) {
  std::string s;
  for (Axis a : order) append_item(s, runtime::axis_name(a), "-");
  return s;
}

TEST(Grid, MatchesBruteForceEnumeration) {
  const std::vector<GridSizes> shapes = {{1, 1, 1, 1}, {2, 1, 3, 2}, {4, 1, 2, 3}, {2, 2, 2, 2}, {3, 1, 1, 4}};
  std::vector<Axis> order = {Axis::tp, Axis::cp, Axis::dp, Axis::pp};  // ascending: next_permutation visits all 24
  int orders = 0;
  do {
    ++orders;
    for (const auto& sizes : shapes) {
      for (int offset : {0, 7}) {
        const int n = sizes.tp * sizes.cp * sizes.dp * sizes.pp;
        const Grid g("m", sizes, order_string(order), offset, n);
        SCOPED_TRACE(g.order() + " offset " + std::to_string(offset) + " ranks " + std::to_string(n));
        const auto all = enumerate(sizes, order, offset);
        std::set<int> seen;
        for (const auto& b : all) {
          EXPECT_EQ(g.rank_at(b.c), b.rank);
          EXPECT_EQ(g.coords(b.rank), b.c);
          seen.insert(b.rank);
        }
        EXPECT_EQ(seen.size(), static_cast<std::size_t>(n));
        EXPECT_EQ(*seen.begin(), offset);
        EXPECT_EQ(*seen.rbegin(), offset + n - 1);
        // Every mask: a group is the ranks that agree off the mask, ascending (grid order).
        for (int bits = 0; bits < 16; ++bits) {
          std::vector<Axis> mask;
          for (Axis a : {Axis::tp, Axis::cp, Axis::dp, Axis::pp})
            if (bits & (1 << static_cast<int>(a))) mask.push_back(a);
          auto same_group = [&](const Coords& x, const Coords& y) {
            for (Axis a : {Axis::tp, Axis::cp, Axis::dp, Axis::pp})
              if (std::find(mask.begin(), mask.end(), a) == mask.end() && x[at(a)] != y[at(a)]) return false;
            return true;
          };
          const auto groups = g.groups(mask);
          std::map<int, int> times;
          for (const auto& group : groups)
            for (int r : group) ++times[r];
          EXPECT_EQ(times.size(), static_cast<std::size_t>(n));
          for (const auto& [r, k] : times) EXPECT_EQ(k, 1) << "rank " << r << " mask " << bits;
          for (const auto& b : all) {
            std::vector<int> expected;
            for (const auto& o : all)
              if (same_group(b.c, o.c)) expected.push_back(o.rank);
            std::sort(expected.begin(), expected.end());
            EXPECT_EQ(g.group_of(b.rank, mask), expected) << "rank " << b.rank << " mask " << bits;
            EXPECT_EQ(groups[static_cast<std::size_t>(g.group_index(b.rank, mask))], expected);
          }
        }
      }
    }
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(orders, 24);
}

TEST(Grid, MegatronOrderAndNames) {
  // tp 2 x dp 4 x pp 2, order tp-dp-pp: tp ranks consecutive, then replicas, then stages.
  const Grid g("vision_encoder", GridSizes{2, 1, 4, 2}, "tp-dp-pp", 16, 16);
  EXPECT_EQ(g.group_of(16 + 7, {Axis::tp}), (std::vector<int>{22, 23}));
  EXPECT_EQ(g.group_of(16 + 7, {Axis::dp}), (std::vector<int>{17, 19, 21, 23}));
  EXPECT_EQ(g.group_of(16 + 7, {Axis::pp}), (std::vector<int>{23, 31}));
  EXPECT_EQ(g.group_name(16 + 7, {Axis::dp}), "vision_encoder.dp[pp=0,tp=1]");
  EXPECT_EQ(g.group_name(16 + 7, {Axis::tp}), "vision_encoder.tp[pp=0,dp=3]");
  EXPECT_EQ(g.group_name(16 + 9, {Axis::tp, Axis::dp}), "vision_encoder.tp-dp[pp=1]");
  EXPECT_EQ(g.order(), "tp-dp-pp");
  // Axes of size 1 may go unnamed, as in Megatron's RankGenerator; they vary slowest.
  const Grid flat("llm", GridSizes{4, 1, 2, 1}, "tp-dp", 0, 8);
  EXPECT_EQ(flat.group_of(5, {Axis::dp}), (std::vector<int>{1, 5}));
  EXPECT_EQ(flat.group_name(5, {Axis::dp}), "llm.dp[tp=1]");
}

TEST(Grid, RejectsBadShapes) {
  using test::expect_error;
  expect_error(
      [] {
        Grid("vit", GridSizes{0, 1, 2, 1}, "tp-dp-pp", 0, 0);
      },
      Status::bad_config, {"vit: ", "tp must be at least 1 (got 0)"});
  expect_error(
      [] {
        Grid("vit", GridSizes{2, 1, 2, 1}, "tp-xp-pp", 0, 4);
      },
      Status::bad_config, {"vit: ", "'tp-xp-pp'", "'xp'", "tp, cp, dp and pp"});
  expect_error(
      [] {
        Grid("vit", GridSizes{2, 1, 2, 1}, "tp-dp-tp", 0, 4);
      },
      Status::bad_config, {"'tp-dp-tp'", "tp twice"});
  expect_error(
      [] {
        Grid("vit", GridSizes{2, 1, 2, 1}, "tp-pp", 0, 4);
      },
      Status::bad_config, {"'tp-pp'", "leaves out dp", "size 2"});
  expect_error(
      [] {
        Grid("vit", GridSizes{2, 1, 16, 1}, "tp-dp-pp", 0, 64);
      },
      Status::bad_config, {"vit: tp 2 x dp 16 x pp 1 makes 32 ranks, not the 64 it spans"});
  expect_error(
      [] {
        Grid("vit", GridSizes{1, 1, 1, 1}, "tp-dp-pp", -1, 1);
      },
      Status::bad_config, {"first rank must be at least 0 (got -1)"});
  expect_error([] { Grid("vit", GridSizes{65536, 1, 65536, 1}, "tp-dp-pp", 0, 1); }, Status::bad_config, {"beyond"});
  const Grid g("vit", GridSizes{2, 1, 2, 1}, "tp-dp-pp", 4, 4);
  expect_error([&] { g.coords(3); }, Status::invalid_argument, {"vit: rank 3 is outside its ranks 4..7"});
  expect_error([&] { g.rank_at(Coords{2, 0, 0, 0}); }, Status::invalid_argument, {"tp coordinate 2", "0..1"});
}

// ---- topologies from plans -------------------------------------------------------------

struct Case {
  std::unique_ptr<spec::RunSpec> run;  // the cost model keeps a pointer to it: a stable address
  std::unique_ptr<cost::CostModel> cost;
  plan::Plan plan;
};

Case planned(const std::string& run_file, plan::Strategy strategy, plan::Constraints constraints = {}) {
  Case c;
  c.run = std::make_unique<spec::RunSpec>(test::load(run_file));
  c.cost = std::make_unique<cost::CostModel>(*c.run);
  c.plan = orchestrate::make_plan(*c.cost, plan::PlanRequest{strategy, constraints, {}}).best;
  return c;
}

const runtime::ModuleGrid& grid_named(const runtime::Topology& t, const std::string& name) {
  const int m = t.module_index(name);
  EXPECT_GE(m, 0) << name;
  return t.modules.at(static_cast<std::size_t>(m));
}

// Properties every topology has, checked against the plan and its pipeline program.
runtime::Topology check(const Case& c, std::optional<spec::Schedule> schedule = std::nullopt) {
  const plan::Plan& plan = c.plan;
  const runtime::Topology t = runtime::build_groups(c.run->model, plan, plan.devices);
  const int n = t.world_size;
  EXPECT_EQ(n, plan.devices);

  // The grids sit where the plan puts each module.
  EXPECT_EQ(t.modules.size(), plan.modules.size());
  for (std::size_t i = 0; i < plan.modules.size(); ++i) {
    const auto& p = plan.modules[i];
    const auto& g = t.modules[i].grid;
    EXPECT_EQ(t.modules[i].name, p.name);
    EXPECT_EQ(g.offset(), p.first_device) << p.name;
    EXPECT_EQ(g.size(), p.devices) << p.name;
    EXPECT_EQ(g.size_of(Axis::tp), p.tp) << p.name;
    EXPECT_EQ(g.size_of(Axis::pp), p.pp) << p.name;
    EXPECT_EQ(g.size_of(Axis::dp), p.dp) << p.name;
  }

  // Every rank of a module is in exactly one group per axis; no other rank is in any.
  for (const auto& m : t.modules) {
    for (Axis axis : runtime::kGroupAxes) {
      std::vector<int> times(static_cast<std::size_t>(n), 0);
      std::size_t groups = 0;
      for (const auto& g : m.groups) {
        if (g.axis != axis) continue;
        ++groups;
        EXPECT_EQ(g.ranks.size(), static_cast<std::size_t>(m.grid.size_of(axis))) << g.name;
        EXPECT_EQ(g.name.rfind(m.name + "." + runtime::axis_name(axis) + "[", 0), 0u) << g.name;
        for (int r : g.ranks) ++times[static_cast<std::size_t>(r)];
      }
      EXPECT_EQ(groups * static_cast<std::size_t>(m.grid.size_of(axis)), static_cast<std::size_t>(m.grid.size()));
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(times[static_cast<std::size_t>(r)], m.grid.contains(r) ? 1 : 0)
            << m.name << "." << runtime::axis_name(axis) << " rank " << r;
        if (m.grid.contains(r)) {
          const auto& own = m.group_of(r, axis).ranks;
          EXPECT_NE(std::find(own.begin(), own.end(), r), own.end());
        }
      }
    }
  }

  // Holdings: exactly the modules whose grid holds the rank, at its coordinates.
  for (int r = 0; r < n; ++r) {
    std::size_t expected = 0;
    for (const auto& m : t.modules) expected += m.grid.contains(r) ? 1 : 0;
    const auto& holds = t.holdings[static_cast<std::size_t>(r)];
    EXPECT_EQ(holds.size(), expected) << "rank " << r;
    EXPECT_GE(holds.size(), 1u) << "rank " << r;
    for (const auto& h : holds) {
      const auto& m = t.modules[static_cast<std::size_t>(h.module)];
      EXPECT_EQ(m.replica_ranks(h.stage, h.dp).at(static_cast<std::size_t>(h.tp)), r) << m.name;
    }
  }

  // The program of the same plan runs its stages on the same devices.
  const pipeline::Program program = orchestrate::build_program(*c.cost, plan, schedule);
  EXPECT_EQ(t.stages.size(), program.stages.size());
  for (std::size_t s = 0; s < std::min(t.stages.size(), program.stages.size()); ++s) {
    const auto& ours = t.stages[s];
    const auto& theirs = program.stages[s];
    EXPECT_EQ(ours.name, theirs.name);
    EXPECT_EQ(ours.replicas, theirs.replicas) << ours.name;
    EXPECT_EQ(ours.devices_per_replica, theirs.devices_per_replica) << ours.name;
    EXPECT_EQ(ours.first_device, theirs.first_device) << ours.name;
    EXPECT_EQ(ours.device_stride, theirs.device_stride) << ours.name;
    for (int rep = 0; rep < ours.replicas; ++rep)
      for (int r : ours.replica_ranks(rep)) EXPECT_EQ(t.stage_of_rank[static_cast<std::size_t>(r)], int(s));
  }
  int placed = 0;
  for (const auto& st : program.stages) placed += st.replicas * st.devices_per_replica;
  EXPECT_EQ(placed, n);  // every rank runs one program stage

  // A rank's module stages map to its program stage: the same stage of the same module
  // (disaggregated), the global stage first_stage + stage (monolithic and the llm grid
  // of colocated plans), with the replica and tp rank the program gives it.
  for (int r = 0; r < n; ++r) {
    const int s = t.stage_of_rank[static_cast<std::size_t>(r)];
    const auto& st = program.stages[static_cast<std::size_t>(s)];
    const int replica = (r - st.first_device) / st.device_stride;
    const int tp_rank = r - st.first_device - replica * st.device_stride;
    for (const auto& h : t.holdings[static_cast<std::size_t>(r)]) {
      const auto& p = plan.modules[static_cast<std::size_t>(h.module)];
      if (plan.layout == plan::Layout::colocated && p.role == spec::Role::encoder) continue;  // below
      if (plan.layout == plan::Layout::chain && p.role == spec::Role::projector) {
        // A projector rides on its encoder's last stage.
        const std::string& encoder = c.run->model.modules[static_cast<std::size_t>(p.module)].inputs.front();
        const int last = grid_named(t, encoder).grid.size_of(Axis::pp) - 1;
        EXPECT_EQ(st.name, encoder + " stage " + std::to_string(last)) << "rank " << r;
      } else if (plan.layout == plan::Layout::monolithic || plan.layout == plan::Layout::colocated) {
        EXPECT_EQ(s, p.first_stage + h.stage) << p.name << " rank " << r;
      } else {
        EXPECT_EQ(st.name, p.name + " stage " + std::to_string(h.stage)) << "rank " << r;
      }
      EXPECT_EQ(h.dp, replica) << p.name << " rank " << r;
      EXPECT_EQ(h.tp, tp_rank) << p.name << " rank " << r;
    }
  }

  // Links follow the fan-in / fan-out rule of braid/pipeline.h, on the modules' replicas.
  for (const auto& l : t.links) {
    const auto& from = t.modules[static_cast<std::size_t>(l.from)];
    const auto& to = t.modules[static_cast<std::size_t>(l.to)];
    const int A = from.grid.size_of(Axis::dp), B = to.grid.size_of(Axis::dp);
    EXPECT_EQ(l.from_stage, from.grid.size_of(Axis::pp) - 1);
    EXPECT_EQ(l.to_stage, 0);
    EXPECT_EQ(l.pairs.size(), static_cast<std::size_t>(std::max(A, B)));
    std::map<int, std::vector<int>> targets;
    bool local = true;
    for (const auto& pair : l.pairs) {
      targets[pair.from_replica].push_back(pair.to_replica);
      EXPECT_EQ(pair.from_ranks, from.replica_ranks(l.from_stage, pair.from_replica));
      EXPECT_EQ(pair.to_ranks, to.replica_ranks(0, pair.to_replica));
      local = local && pair.from_ranks == pair.to_ranks;
      // Across program stages, the program links the two stages.
      const int ps = t.stage_of_rank[static_cast<std::size_t>(pair.from_ranks.front())];
      const int pt = t.stage_of_rank[static_cast<std::size_t>(pair.to_ranks.front())];
      if (ps != pt && plan.layout != plan::Layout::colocated) {
        const auto& next = program.stages[static_cast<std::size_t>(ps)].next;
        EXPECT_NE(std::find(next.begin(), next.end(), pt), next.end()) << from.name << " -> " << to.name;
      }
    }
    EXPECT_EQ(l.local, local);
    EXPECT_EQ(targets.size(), static_cast<std::size_t>(A));
    for (const auto& [r, list] : targets) {
      std::vector<int> expected;
      if (A >= B) {
        expected.push_back(r / (A / B));
      } else {
        for (int k = 0; k < B / A; ++k) expected.push_back(r * (B / A) + k);
      }
      EXPECT_EQ(list, expected) << from.name << " replica " << r;
    }
  }
  // One link per placed producer -> consumer edge of the model.
  std::size_t edges = 0;
  for (const auto& m : c.run->model.modules) {
    if (t.module_index(m.name) < 0) continue;
    for (const auto& in : m.inputs) edges += t.module_index(in) >= 0 ? 1 : 0;
  }
  EXPECT_EQ(t.links.size(), edges);
  return t;
}

TEST(Groups, MegatronPipelineDemo) {
  const Case c = planned("pipeline-demo.yaml", plan::Strategy::megatron, {2, 4, 0});
  const auto t = check(c);
  ASSERT_EQ(t.modules.size(), 1u);
  const auto& gpt = t.modules[0];
  EXPECT_EQ(gpt.group_of(5, Axis::pp).ranks, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(gpt.group_of(5, Axis::tp).ranks, (std::vector<int>{4, 5}));
  EXPECT_EQ(gpt.group_of(5, Axis::dp).ranks, (std::vector<int>{5}));
  EXPECT_TRUE(t.links.empty());
  EXPECT_TRUE(t.batch_syncs.empty());
}

TEST(Groups, MegatronLlavaSharesTheFirstStage) {
  const Case c = planned("llava-13b-256gpu.yaml", plan::Strategy::megatron, {8, 4, 0});
  const auto t = check(c);
  // vision, projector and the llm's first stage on ranks 0..63; hand-overs stay on the device.
  EXPECT_EQ(t.holdings[63].size(), 3u);
  EXPECT_EQ(t.holdings[64].size(), 1u);
  ASSERT_EQ(t.links.size(), 2u);
  for (const auto& l : t.links) EXPECT_TRUE(l.local);
}

TEST(Groups, MegatronClipBatchSyncsOnTheLastStage) {
  const Case c = planned("clip-vit-l14-64gpu.yaml", plan::Strategy::megatron, {2, 2, 0});
  const auto t = check(c);
  ASSERT_EQ(t.batch_syncs.size(), 1u);
  const auto& bs = t.batch_syncs[0];
  EXPECT_EQ(bs.name, "contrastive_loss.batch_sync");
  // Both towers end on global stage 1: ranks 32..63, each tower's 16 replicas.
  std::vector<int> last_stage(32);
  for (int i = 0; i < 32; ++i) last_stage[static_cast<std::size_t>(i)] = 32 + i;
  EXPECT_EQ(bs.ranks, last_stage);
  ASSERT_EQ(bs.members.size(), 32u);
  EXPECT_EQ(bs.members[0].module, t.module_index("image_encoder"));
  EXPECT_EQ(bs.members[16].module, t.module_index("text_encoder"));
  EXPECT_EQ(bs.members[17].replica, 1);
  EXPECT_EQ(bs.members[17].ranks, (std::vector<int>{34, 35}));
}

TEST(Groups, DistmmClipBranches) {
  const Case c = planned("clip-vit-l14-64gpu.yaml", plan::Strategy::distmm);
  ASSERT_EQ(c.plan.layout, plan::Layout::branches);
  const auto t = check(c);
  EXPECT_TRUE(t.links.empty());
  ASSERT_EQ(t.batch_syncs.size(), 1u);
  const auto& bs = t.batch_syncs[0];
  // Every replica of both towers' last stages, by tower then replica: here every rank.
  std::size_t replicas = 0;
  std::set<int> expected;
  for (const char* tower : {"image_encoder", "text_encoder"}) {
    const auto& g = grid_named(t, tower);
    const int last = g.grid.size_of(Axis::pp) - 1;
    for (int r = 0; r < g.grid.size_of(Axis::dp); ++r) {
      const auto& m = bs.members.at(replicas++);
      EXPECT_EQ(m.module, t.module_index(tower));
      EXPECT_EQ(m.stage, last);
      EXPECT_EQ(m.replica, r);
      EXPECT_EQ(m.ranks, g.replica_ranks(last, r));
      expected.insert(m.ranks.begin(), m.ranks.end());
    }
  }
  EXPECT_EQ(bs.members.size(), replicas);
  EXPECT_EQ(std::set<int>(bs.ranks.begin(), bs.ranks.end()), expected);
  EXPECT_EQ(bs.ranks.size(), expected.size());
}

TEST(Groups, DisttrainMllmChain) {
  const Case c = planned("mllm-72b-1024gpu.yaml", plan::Strategy::disttrain);
  ASSERT_EQ(c.plan.layout, plan::Layout::chain);
  const auto t = check(c);
  ASSERT_EQ(t.links.size(), 3u);  // vision -> projector -> llm -> generator, in that order
  EXPECT_EQ(t.links[0].from, t.module_index("vision"));
  EXPECT_TRUE(t.links[0].local);  // the projector rides on the encoder's last stage
  EXPECT_EQ(t.links[1].to, t.module_index("llm"));
  EXPECT_FALSE(t.links[1].local);
  EXPECT_EQ(t.links[2].from, t.module_index("llm"));
  EXPECT_EQ(t.links[2].to, t.module_index("generator"));
  EXPECT_EQ(t.links[2].from_stage, grid_named(t, "llm").grid.size_of(Axis::pp) - 1);
  EXPECT_FALSE(t.links[2].local);
}

TEST(Groups, DisttrainLlavaFansIn) {
  const Case c = planned("llava-13b-256gpu.yaml", plan::Strategy::disttrain);
  const auto t = check(c);
  const auto& llm_link = t.links.at(1);
  EXPECT_EQ(llm_link.to, t.module_index("llm"));
  const int A = t.modules[static_cast<std::size_t>(llm_link.from)].grid.size_of(Axis::dp);
  const int B = grid_named(t, "llm").grid.size_of(Axis::dp);
  EXPECT_GT(A, B) << "the bundled plan no longer fans in; pick another";
}

TEST(Groups, FanOutFromAnEncoderWithFewerReplicas) {
  Case c = planned("llava-13b-256gpu.yaml", plan::Strategy::disttrain);
  // Encoder dp 4 x tp 8 (32 devices) feeding the llm's dp 8: each replica feeds two.
  for (auto& m : c.plan.modules) {
    if (m.role == spec::Role::encoder || m.role == spec::Role::projector) {
      m.tp = 8;
      m.dp = m.devices / 8;
    }
  }
  const auto t = runtime::build_groups(c.run->model, c.plan, c.plan.devices);
  const auto& l = t.links.at(1);
  const int B = grid_named(t, "llm").grid.size_of(Axis::dp);
  ASSERT_EQ(B, 8);
  ASSERT_EQ(l.pairs.size(), 8u);
  for (std::size_t i = 0; i < l.pairs.size(); ++i) {
    EXPECT_EQ(l.pairs[i].from_replica, static_cast<int>(i / 2));
    EXPECT_EQ(l.pairs[i].to_replica, static_cast<int>(i));
  }
}

TEST(Groups, OptimusColocatedGridsOverlap) {
  const Case c = planned("mllm-72b-1024gpu.yaml", plan::Strategy::optimus);
  ASSERT_EQ(c.plan.layout, plan::Layout::colocated);
  const auto t = check(c, spec::Schedule::optimus_fine);
  const auto& vision = grid_named(t, "vision");
  const auto& llm = grid_named(t, "llm");
  EXPECT_EQ(vision.grid.size(), t.world_size);
  EXPECT_EQ(llm.grid.size(), t.world_size);
  ASSERT_LT(vision.grid.size_of(Axis::tp), llm.grid.size_of(Axis::tp)) << "the bundled plan changed; pick another";
  for (int r = 0; r < t.world_size; ++r) {
    const auto& holds = t.holdings[static_cast<std::size_t>(r)];
    EXPECT_TRUE(std::any_of(holds.begin(), holds.end(), [&](auto& h) { return h.module == t.module_index("vision"); }));
    EXPECT_TRUE(std::any_of(holds.begin(), holds.end(), [&](auto& h) { return h.module == t.module_index("llm"); }));
    // An encoder tp group lies inside the llm tp group of the same rank.
    const auto& inner = vision.group_of(r, Axis::tp).ranks;
    const auto& outer = llm.group_of(r, Axis::tp).ranks;
    EXPECT_TRUE(std::includes(outer.begin(), outer.end(), inner.begin(), inner.end())) << "rank " << r;
  }
  // The encoder's replicas on every llm stage fan in to the llm grid's first stage.
  const auto& feed = t.links.at(0);
  EXPECT_EQ(feed.from, t.module_index("vision"));
  EXPECT_FALSE(feed.local);
}

TEST(Groups, OptimusEncoderStagesMatchTheBubbleScheduler) {
  Case c = planned("llava-13b-256gpu.yaml", plan::Strategy::optimus, {4, 4, 0});
  for (auto& m : c.plan.modules) {
    if (m.role != spec::Role::encoder) continue;
    m.tp = 2;
    m.pp = 2;
    m.dp = m.devices / 4;
    m.layers_per_stage = {12, 12};
  }
  const auto t = check(c, spec::Schedule::encoder_first);
  const bubble::Colocated col = bubble::decompose(*c.cost, c.plan);
  const int e = t.module_index("vision");
  for (int r = 0; r < t.world_size; ++r) {
    const int s = t.stage_of_rank[static_cast<std::size_t>(r)];
    const auto& host = col.hosts.at(static_cast<std::size_t>(s)).at(0);
    for (const auto& h : t.holdings[static_cast<std::size_t>(r)]) {
      if (h.module == e) {
        EXPECT_EQ(h.stage, host.encoder_stage) << "rank " << r;
      }
    }
  }
}

TEST(Groups, ThousandsOfRanks) {
  const Case c = planned("vit22b-gpt175b-3072gpu.yaml", plan::Strategy::megatron);
  const auto t = check(c);
  EXPECT_EQ(t.world_size, 3072);
  const auto doc = nlohmann::json::parse(runtime::to_json(t));
  EXPECT_EQ(doc["ranks"].size(), 3072u);
  std::size_t groups = 0;
  for (const auto& m : t.modules) groups += m.groups.size();
  EXPECT_EQ(doc["groups"].size(), groups);
  const std::string text = runtime::to_text(t);
  EXPECT_NE(text.find("... (3064 more)"), std::string::npos) << text.substr(0, 2000);
  EXPECT_LT(text.size(), 20000u);  // a summary, not a dump
}

TEST(Groups, JsonIsComplete) {
  const Case c = planned("llava-13b-256gpu.yaml", plan::Strategy::disttrain);
  const auto t = runtime::build_groups(c.run->model, c.plan, c.plan.devices);
  const auto doc = nlohmann::json::parse(runtime::to_json(t));
  EXPECT_EQ(doc["world_size"], 256);
  EXPECT_EQ(doc["strategy"], "disttrain");
  EXPECT_EQ(doc["layout"], "chain");
  ASSERT_EQ(doc["links"].size(), t.links.size());
  EXPECT_EQ(doc["links"][1]["pairs"].size(), t.links[1].pairs.size());
  EXPECT_EQ(doc["links"][1]["pairs"][3]["to_ranks"].get<std::vector<int>>(), t.links[1].pairs[3].to_ranks);
  EXPECT_EQ(doc["ranks"][230]["holds"].size(), 2u);  // vision and its projector
  EXPECT_EQ(doc["stages"].size(), t.stages.size());
  for (const auto& g : doc["groups"]) {
    const auto& m = grid_named(t, g["module"].get<std::string>());
    const int r = g["ranks"][0].get<int>();
    const auto axis = runtime::parse_axis(g["axis"].get<std::string>());
    ASSERT_TRUE(axis);
    EXPECT_EQ(g["name"], m.group_of(r, *axis).name);
    EXPECT_EQ(g["ranks"].get<std::vector<int>>(), m.group_of(r, *axis).ranks);
  }
}

TEST(Groups, FormatRanks) {
  EXPECT_EQ(runtime::format_ranks({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(runtime::format_ranks({0, 8, 16, 24, 32}), "0,8,...,32");
  EXPECT_EQ(runtime::format_ranks({0, 1, 2, 3, 8, 12}), "0-3,8,12");
  EXPECT_EQ(runtime::format_ranks({1, 3, 5, 7}), "1,3,5,7");
  EXPECT_EQ(runtime::format_ranks({5}), "5");
  EXPECT_EQ(runtime::format_ranks({}), "");
}

TEST(Groups, Errors) {
  using test::expect_error;
  const Case c = planned("clip-vit-l14-64gpu.yaml", plan::Strategy::distmm);
  const auto& model = c.run->model;
  // The cases below edit this plan: image tower tp 1 on devices 0..55, text tower on 56..63.
  ASSERT_EQ(c.plan.modules.at(0).name, "image_encoder");
  ASSERT_EQ(c.plan.modules[0].tp, 1);
  ASSERT_EQ(c.plan.modules[0].devices, 56);
  ASSERT_EQ(c.plan.modules.at(1).first_device, 56);
  expect_error([&] { runtime::build_groups(model, c.plan, 32); }, Status::invalid_argument,
               {"the plan runs on 64 devices", "the world has 32 ranks"});

  plan::Plan gap = c.plan;  // the image tower shrinks: ranks it gave up hold nothing
  for (auto& m : gap.modules) {
    if (m.name == "image_encoder") m.dp = m.devices = m.devices - 4;
  }
  expect_error([&] { runtime::build_groups(model, gap, 64); }, Status::bad_config,
               {"ranks 52..55 hold no module", "64 devices"});

  plan::Plan outside = c.plan;
  for (auto& m : outside.modules) {
    if (m.name == "text_encoder") m.first_device += 4;
  }
  expect_error([&] { runtime::build_groups(model, outside, 64); }, Status::bad_config,
               {"text_encoder: devices 60..67 lie outside the world's ranks 0..63"});

  plan::Plan overlap = c.plan;
  for (auto& m : overlap.modules) {
    if (m.name == "text_encoder") m.first_device -= 4;
  }
  expect_error([&] { runtime::build_groups(model, overlap, 64); }, Status::bad_config,
               {"rank 52 runs two pipeline stages", "image_encoder stage 0", "text_encoder stage 0"});

  plan::Plan shape = c.plan;
  shape.modules[0].tp = 3;
  expect_error([&] { runtime::build_groups(model, shape, 64); }, Status::bad_config,
               {shape.modules[0].name + ": tp 3 x dp", "ranks, not the"});

  const spec::RunSpec llava = test::load("llava-13b-256gpu.yaml");
  expect_error([&] { runtime::build_groups(llava.model, c.plan, 64); }, Status::bad_config,
               {"'image_encoder'", "another model"});

  Case chain = planned("llava-13b-256gpu.yaml", plan::Strategy::disttrain);
  for (auto& m : chain.plan.modules) {
    if (m.role == spec::Role::encoder || m.role == spec::Role::projector) {
      m.tp = 1;
      m.dp = m.devices;
    } else if (m.role == spec::Role::llm) {
      m.tp = 1;
      m.pp = 8;
      m.dp = m.devices / 8;
    }
  }
  expect_error([&] { runtime::build_groups(chain.run->model, chain.plan, 256); }, Status::bad_config,
               {"projector (dp 32) feeds llm (dp 28)", "neither DP width divides the other"});

  Case mono = planned("llava-13b-256gpu.yaml", plan::Strategy::megatron, {8, 4, 0});
  mono.plan.modules[0].tp = 4;
  mono.plan.modules[0].dp = 16;
  expect_error([&] { runtime::build_groups(mono.run->model, mono.plan, 256); }, Status::bad_config,
               {"one tp and dp", "tp 4, dp 16", "tp 8, dp 8"});
}

}  // namespace
}  // namespace braid
