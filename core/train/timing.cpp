#include "core/train/timing.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/common/error.hpp"
#include "core/common/text.hpp"
#include "core/sim/trace.hpp"

namespace braid::train {

using pipeline::Op;

void MeasuredSteps::add(const StepResult& r) {
  ++steps;
  seconds += r.seconds;
  data_seconds += r.data_seconds;
  for (std::size_t c = 0; c < idle.size(); ++c) idle[c] += r.idle[c];
  for (std::size_t k = 0; k < compute.size(); ++k) compute[k] += r.compute[k];
  if (std::binary_search(replayed.begin(), replayed.end(), steps - 1))
    sides.push_back({r.microbatch_samples, r.encoder_microbatch_samples, r.rendered_sides, r.described});
}

std::vector<std::int64_t> replayed_steps(std::int64_t steps) {
  const std::int64_t n = std::min(std::max<std::int64_t>(steps, 0), kReplayedSteps);
  std::vector<std::int64_t> out;
  for (std::int64_t k = 0; k < n; ++k) out.push_back(k * steps / n);
  return out;
}

namespace {

// Appends a value, a sample (its side, then its caption's length) or a list of them (its
// count, then each) to `flat`, and reads it back.
void put(int v, std::vector<std::int32_t>& flat) { flat.push_back(v); }
void put(const cost::TrainedSample& s, std::vector<std::int32_t>& flat) {
  flat.insert(flat.end(), {s.side, s.caption});
}
template <class T>
void put(const std::vector<T>& items, std::vector<std::int32_t>& flat) {
  flat.push_back(static_cast<std::int32_t>(items.size()));
  for (const auto& item : items) put(item, flat);
}
void take(const std::int32_t*& at, int& v) { v = *at++; }
void take(const std::int32_t*& at, cost::TrainedSample& s) {
  s.side = *at++;
  s.caption = *at++;
}
template <class T>
void take(const std::int32_t*& at, std::vector<T>& items) {
  items.resize(static_cast<std::size_t>(*at++));
  for (auto& item : items) take(at, item);
}

// Every rank's images of the steps it kept: per step, per rank.
std::vector<StepSides> gather_sides(const MeasuredSteps& mine, runtime::Communicator& world) {
  std::vector<std::int32_t> flat;
  for (const RankSides& step : mine.sides) {
    put(step.microbatches, flat);
    put(step.encoder_microbatches, flat);
    put(step.rendered, flat);
    flat.push_back(static_cast<std::int32_t>(step.described));
  }
  std::int64_t width[1] = {static_cast<std::int64_t>(flat.size())};
  world.allreduce(std::span<std::int64_t>(width), runtime::ReduceOp::max);
  flat.resize(static_cast<std::size_t>(width[0]));
  std::vector<std::int32_t> all(flat.size() * static_cast<std::size_t>(world.size()));
  world.allgather(std::as_bytes(std::span<const std::int32_t>(flat)), std::as_writable_bytes(std::span(all)));
  std::vector<StepSides> out(mine.sides.size(), StepSides(static_cast<std::size_t>(world.size())));
  for (std::size_t rank = 0; rank < static_cast<std::size_t>(world.size()); ++rank) {
    const std::int32_t* at = all.data() + rank * flat.size();
    for (auto& step : out) {
      take(at, step[rank].microbatches);
      take(at, step[rank].encoder_microbatches);
      take(at, step[rank].rendered);
      step[rank].described = *at++;
    }
  }
  return out;
}

// Every replica's instructions in the trace: the compute is summed over all of them.
constexpr sim::Options kEveryReplica{.trace = true, .trace_replicas = -1};

// The simulated compute by kind per device and step, as the measured side counts it (over
// every rank of the world): a replica's events count once per device of its TP group.
std::array<double, pipeline::kComputeKinds> compute_per_device(const pipeline::Program& program, const sim::Result& r) {
  std::array<double, pipeline::kComputeKinds> out{};
  for (const sim::TraceEvent& e : r.trace) {
    const auto& st = program.stages[static_cast<std::size_t>(e.stage)];
    const pipeline::WorkKind kind = pipeline::work_kind(st.instructions[static_cast<std::size_t>(e.instruction)]);
    if (e.lane == 0 && kind != pipeline::WorkKind::communication)
      out[static_cast<std::size_t>(kind)] += (e.duration - e.waited) * st.devices_per_replica / std::max(r.devices, 1);
  }
  return out;
}

// The seconds per device and step its ranks make samples in the step's time (data_s).
double data_per_device(const pipeline::Program& program) {
  double sum = 0;
  for (const auto& st : program.stages)
    for (double d : st.data_s) sum += d * st.devices_per_replica;
  return sum / std::max(program.devices, 1);
}

}  // namespace

StepComparison compare_with_simulation(const MeasuredSteps& mine, const pipeline::Program& program,
                                       runtime::Communicator& world, TrainedLoad* load) {
  StepComparison c;
  c.schedule = program.schedule;
  c.steps = mine.steps;
  const double per = mine.steps > 0 ? 1.0 / static_cast<double>(mine.steps) : 0;
  // The slowest rank's step and the most waits of any rank, in one collective.
  double most[2] = {mine.seconds * per, mine.host_waits < 0 ? -1.0 : static_cast<double>(mine.host_waits) * per};
  world.allreduce(std::span<double>(most), runtime::ReduceOp::max);
  c.measured_step_s = most[0];
  c.host_waits_per_step = most[1];
  // Per rank and step, summed over ranks: idle by cause, taking samples, compute by kind.
  constexpr std::size_t kData = sim::kCauseCount, kCompute = kData + 1;
  std::array<double, kCompute + pipeline::kComputeKinds> sums{};
  for (std::size_t k = 0; k < mine.idle.size(); ++k) sums[k] = mine.idle[k] * per;
  sums[kData] = mine.data_seconds * per;
  for (std::size_t k = 0; k < mine.compute.size(); ++k) sums[kCompute + k] = mine.compute[k] * per;
  world.allreduce(std::span<double>(sums));
  for (std::size_t k = 0; k < mine.idle.size(); ++k) c.measured_idle_s[k] = sums[k] / world.size();
  c.measured_data_s = sums[kData] / world.size();
  for (std::size_t k = 0; k < mine.compute.size(); ++k) c.measured_compute_s[k] = sums[kCompute + k] / world.size();
  const sim::Result r = sim::simulate(program, kEveryReplica);
  c.priced_step_s = c.simulated_step_s = r.step_time_s;
  c.simulated_idle_s = r.bubbles;
  c.simulated_compute_s = compute_per_device(program, r);
  if (!load || mine.steps == 0) return c;

  // Replayed on rank 0, the others told: whether it was, the step, the samples made in it,
  // the idle time by cause and the compute by kind, the mean of the steps.
  const std::vector<StepSides> sides = gather_sides(mine, world);
  constexpr std::size_t kSamples = 2, kIdle = 3, kKinds = kIdle + sim::kCauseCount;
  std::array<double, kKinds + pipeline::kComputeKinds> mean{};  // [0]: 1 when replayed; [1]: the step
  if (world.rank() == 0) {
    try {
      pipeline::Program scaled = program;
      const double share = 1.0 / static_cast<double>(sides.size());
      for (const auto& step : sides) {
        load->apply(step, scaled);
        const sim::Result replay = sim::simulate(scaled, kEveryReplica);
        mean[1] += replay.step_time_s * share;
        mean[kSamples] += data_per_device(scaled) * share;
        for (std::size_t k = 0; k < replay.bubbles.size(); ++k) mean[kIdle + k] += replay.bubbles[k] * share;
        const auto compute = compute_per_device(scaled, replay);
        for (std::size_t k = 0; k < compute.size(); ++k) mean[kKinds + k] += compute[k] * share;
      }
      mean[0] = sides.empty() ? 0 : 1;
    } catch (const std::exception& e) {  // the run trained: its summary stays, as priced
      mean = {};
      c.replay_problem = e.what();
    }
  }
  world.broadcast(std::as_writable_bytes(std::span<double>(mean)), 0);
  if (mean[0] != 1) return c;
  c.simulated_step_s = mean[1];
  c.simulated_data_s = mean[kSamples];
  std::copy(mean.begin() + kIdle, mean.begin() + kKinds, c.simulated_idle_s.begin());
  std::copy(mean.begin() + kKinds, mean.end(), c.simulated_compute_s.begin());
  c.replayed_steps = static_cast<std::int64_t>(sides.size());
  return c;
}

namespace {

std::string idle_list(const std::array<double, sim::kCauseCount>& idle) {
  std::string out;
  for (int k = 0; k < sim::kCauseCount; ++k)
    if (idle[static_cast<std::size_t>(k)] >= 5e-7)
      append_item(
          out,
          std::string(sim::cause_name(static_cast<sim::Cause>(k))) + " " + seconds(idle[static_cast<std::size_t>(k)]),
          ", ");
  return out.empty() ? "none" : out;
}

std::string compute_list(const std::array<double, pipeline::kComputeKinds>& compute) {
  std::string out;
  for (int k = 0; k < pipeline::kComputeKinds; ++k)
    append_item(out,
                std::string(pipeline::work_kind_name(static_cast<pipeline::WorkKind>(k))) + " " +
                    seconds(compute[static_cast<std::size_t>(k)]),
                ", ");
  return out;
}

nlohmann::ordered_json compute_json(const std::array<double, pipeline::kComputeKinds>& compute) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (int k = 0; k < pipeline::kComputeKinds; ++k)
    j[pipeline::work_kind_name(static_cast<pipeline::WorkKind>(k))] = compute[static_cast<std::size_t>(k)];
  return j;
}

}  // namespace

std::string format_comparison(const StepComparison& c) {
  // The replay on the steps' own images (trained_load.hpp), when there was one.
  const std::string replay =
      c.replayed_steps > 0 ? "simulated step replayed on the images of " + std::to_string(c.replayed_steps) +
                                 " of those steps, microbatch by microbatch; " + seconds(c.priced_step_s) +
                                 " with every microbatch at their mean\n"
      : c.replay_problem.empty() ? std::string()
                                 : "not replayed on the trained images: " + c.replay_problem + "\n";
  return "measured step " + seconds(c.measured_step_s) + " (mean of " + std::to_string(c.steps) +
         " steps, slowest rank), simulated " + seconds(c.simulated_step_s) + " for the same program (" +
         spec::schedule_name(c.schedule) + "): measured/simulated " + fixed(c.ratio(), 2) + "\n" +
         (c.as_trained.empty() ? std::string()
                               : "priced as the trainer runs: " + join_choices(c.as_trained, ", ") + "\n") +
         replay + "idle per rank and step, measured   " + idle_list(c.measured_idle_s) + "\n" +
         "idle per rank and step, simulated  " + idle_list(c.simulated_idle_s) + "\n" +
         "compute per rank and step, measured   " + compute_list(c.measured_compute_s) + "\n" +
         "compute per rank and step, simulated  " + compute_list(c.simulated_compute_s) + "\n" +
         "taking samples per rank and step, measured " + seconds(c.measured_data_s) + ", simulated " +
         seconds(c.simulated_data_s) + "\n" +
         (c.host_waits_per_step < 0
              ? std::string()
              : "host waits for the device per step " + fixed(c.host_waits_per_step, 1) + " (the most of any rank)\n") +
         (c.probe_before > 0 && c.probe_after > 0
              ? "host speed probe (the cluster file's GEMM case), now/calibrated: " + fixed(c.probe_before, 2) +
                    " before the steps, " + fixed(c.probe_after, 2) + " after (1.00: the host as calibrated)\n"
              : std::string());
}

std::string comparison_json(const StepComparison& c, std::int64_t step) {
  nlohmann::ordered_json measured = nlohmann::ordered_json::object(), simulated = nlohmann::ordered_json::object();
  for (int k = 0; k < sim::kCauseCount; ++k) {
    measured[sim::cause_name(static_cast<sim::Cause>(k))] = c.measured_idle_s[static_cast<std::size_t>(k)];
    simulated[sim::cause_name(static_cast<sim::Cause>(k))] = c.simulated_idle_s[static_cast<std::size_t>(k)];
  }
  nlohmann::ordered_json j{{"step", step},
                           {"summary", true},
                           {"schedule", spec::schedule_name(c.schedule)},
                           {"steps", c.steps},
                           {"measured_step_s", c.measured_step_s},
                           {"simulated_step_s", c.simulated_step_s},
                           {"priced_step_s", c.priced_step_s},
                           {"replayed_steps", c.replayed_steps},
                           {"measured_over_simulated", c.ratio()},
                           {"measured_data_s", c.measured_data_s},
                           {"simulated_data_s", c.simulated_data_s},
                           {"measured_idle_s", measured},
                           {"simulated_idle_s", simulated},
                           {"measured_compute_s", compute_json(c.measured_compute_s)},
                           {"simulated_compute_s", compute_json(c.simulated_compute_s)}};
  if (!c.as_trained.empty()) j["as_trained"] = c.as_trained;
  if (c.host_waits_per_step >= 0) j["host_waits_per_step"] = c.host_waits_per_step;
  if (c.probe_before > 0 && c.probe_after > 0) {
    j["probe_before"] = c.probe_before;
    j["probe_after"] = c.probe_after;
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void write_measured_trace(const std::string& path, const RankProgram& program, const std::vector<Executed>& executed,
                          runtime::Communicator& world) {
  // Every rank's records (index, start, end) as doubles, padded to the longest.
  std::int64_t count[1] = {static_cast<std::int64_t>(executed.size())};
  world.allreduce(std::span<std::int64_t>(count), runtime::ReduceOp::max);
  const std::size_t width = 3 * static_cast<std::size_t>(count[0]) + 1;
  std::vector<double> mine(width, 0.0);
  mine[0] = static_cast<double>(executed.size());
  for (std::size_t k = 0; k < executed.size(); ++k) {
    mine[1 + 3 * k] = executed[k].index;
    mine[2 + 3 * k] = executed[k].start;
    mine[3 + 3 * k] = executed[k].end;
  }
  std::vector<double> all(width * static_cast<std::size_t>(world.size()));
  world.allgather(std::as_bytes(std::span<const double>(mine)), std::as_writable_bytes(std::span<double>(all)));
  if (world.rank() != 0) return;

  sim::Result r;
  r.ranks = world.size();
  r.devices = world.size();
  double t0 = std::numeric_limits<double>::max(), t1 = 0;
  for (int rank = 0; rank < world.size(); ++rank) {
    const double* rec = all.data() + static_cast<std::size_t>(rank) * width;
    for (std::size_t k = 0; k < static_cast<std::size_t>(rec[0]); ++k) {
      t0 = std::min(t0, rec[2 + 3 * k]);
      t1 = std::max(t1, rec[3 + 3 * k]);
    }
  }
  for (int rank = 0; rank < world.size(); ++rank) {
    const int stage = program.stage_of_rank[static_cast<std::size_t>(rank)];
    const auto& st = program.program.stages[static_cast<std::size_t>(stage)];
    r.rank_stage.push_back(stage);
    r.rank_replica.push_back(st.replica_of(rank));
    const double* rec = all.data() + static_cast<std::size_t>(rank) * width;
    for (std::size_t k = 0; k < static_cast<std::size_t>(rec[0]); ++k) {
      sim::TraceEvent e;
      e.rank = rank;
      e.stage = stage;
      e.instruction = static_cast<int>(rec[1 + 3 * k]);
      const Op op = st.instructions[static_cast<std::size_t>(e.instruction)].op;
      e.lane = (op == Op::send_activation || op == Op::send_grad) ? 1
               : (op == Op::recv_activation || op == Op::recv_grad || op == Op::reduce_grads || op == Op::batch_sync)
                   ? 2
                   : 0;
      e.start = rec[2 + 3 * k] - t0;
      e.duration = rec[3 + 3 * k] - rec[2 + 3 * k];
      r.trace.push_back(e);
    }
  }
  r.step_time_s = t1 > t0 ? t1 - t0 : 0;
  // As the simulator counts it: the share of the ranks' step outside their compute lane (here
  // an op's time includes its tensor-parallel collectives).
  double busy = 0;
  for (const sim::TraceEvent& e : r.trace)
    if (e.lane == 0) busy += e.duration;
  if (r.step_time_s > 0) r.bubble_fraction = std::clamp(1 - busy / (r.step_time_s * r.ranks), 0.0, 1.0);
  sim::write_chrome_trace(path, program.program, r, "braid train");
}

}  // namespace braid::train
