#include "core/sim/trace.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/common/error.hpp"
#include "core/common/file.hpp"

namespace braid::sim {

using pipeline::Instruction;
using pipeline::Op;

namespace {

const char* lane_name(int lane) { return lane == 0 ? "compute" : lane == 1 ? "send" : "collectives"; }

std::string event_name(const pipeline::Program& p, const TraceEvent& e) {
  const auto& st = p.stages[static_cast<std::size_t>(e.stage)];
  const Instruction& i = st.instructions[static_cast<std::size_t>(e.instruction)];
  std::string mb = i.microbatch >= 0 ? " mb " + std::to_string(i.microbatch) : "";
  std::string chunk = p.virtual_stages > 1 ? " chunk " + std::to_string(i.chunk) : "";
  switch (i.op) {
    case Op::forward:
    case Op::backward:
    case Op::encoder_task: {
      const auto& u = st.units[static_cast<std::size_t>(i.unit)];
      std::string what = i.op == Op::forward    ? ((i.flags & pipeline::kRecompute) ? "recompute" : "forward")
                         : i.op == Op::backward ? "backward"
                         : (i.flags & pipeline::kBackwardTask) ? "encoder backward"
                                                               : "encoder forward";
      return u.label + ": " + what + mb + chunk;
    }
    case Op::send_activation:
    case Op::send_grad:
      return std::string(i.op == Op::send_activation ? "activation" : "gradient") + mb + chunk + " to " +
             p.stages[static_cast<std::size_t>(i.peer)].name;
    case Op::batch_sync:
      return "BatchSync group " + std::to_string(i.group);
    default:
      return pipeline::op_name(i.op);
  }
}

}  // namespace

std::string chrome_trace(const pipeline::Program& p, const Result& r, const std::string& generator) {
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  std::vector<bool> named(static_cast<std::size_t>(r.ranks), false);
  for (const auto& e : r.trace) {
    if (!named[static_cast<std::size_t>(e.rank)]) {
      named[static_cast<std::size_t>(e.rank)] = true;
      const auto& st = p.stages[static_cast<std::size_t>(e.stage)];
      const int replica = r.rank_replica[static_cast<std::size_t>(e.rank)];
      const int first = st.device(replica);
      std::string devices = st.devices_per_replica > 1 ? "devices " + std::to_string(first) + "-" +
                                                             std::to_string(first + st.devices_per_replica - 1)
                                                       : "device " + std::to_string(first);
      events.push_back({{"name", "process_name"},
                        {"ph", "M"},
                        {"pid", e.rank},
                        {"args",
                         {{"name", st.name + ", replica " + std::to_string(replica) + " (" + devices + ")"},
                          {"stage", e.stage},
                          {"replica", replica}}}});
      events.push_back(
          {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", e.rank}, {"args", {{"sort_index", e.rank}}}});
      for (int lane = 0; lane < 3; ++lane) {
        events.push_back({{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", e.rank},
                          {"tid", lane},
                          {"args", {{"name", lane_name(lane)}}}});
      }
    }
    const Instruction& i =
        p.stages[static_cast<std::size_t>(e.stage)].instructions[static_cast<std::size_t>(e.instruction)];
    nlohmann::ordered_json args{{"op", pipeline::op_name(i.op)}, {"index", e.instruction}};
    if (i.microbatch >= 0) args["microbatch"] = i.microbatch;
    if (i.flags & pipeline::kSyncOnly) args["ordering_only"] = true;
    if (p.virtual_stages > 1) args["chunk"] = i.chunk;
    events.push_back({{"name", event_name(p, e)},
                      {"cat", lane_name(e.lane)},
                      {"ph", "X"},
                      {"ts", e.start * 1e6},
                      {"dur", e.duration * 1e6},
                      {"pid", e.rank},
                      {"tid", e.lane},
                      {"args", args}});
  }
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const auto& st : p.stages) stages.push_back({{"name", st.name}, {"instructions", st.instructions.size()}});
  nlohmann::ordered_json doc{{"traceEvents", events},
                             {"displayTimeUnit", "ms"},
                             {"otherData",
                              {{"generator", generator},
                               {"schedule", spec::schedule_name(p.schedule)},
                               {"step_time_s", r.step_time_s},
                               {"bubble_fraction", r.bubble_fraction},
                               {"stages", stages}}}};
  return doc.dump() + "\n";
}

void write_chrome_trace(const std::string& path, const pipeline::Program& p, const Result& r,
                        const std::string& generator) {
  write_file_atomically(path, chrome_trace(p, r, generator), "trace");
}

std::string gantt(const pipeline::Program& p, const Result& r, int width) {
  if (width <= 0) {
    // About three columns per compute instruction of the busiest stage, within a terminal's reach.
    std::size_t most = 0;
    for (const auto& st : p.stages) {
      std::size_t n = 0;
      for (const auto& i : st.instructions)
        n += i.op == Op::forward || i.op == Op::backward || i.op == Op::encoder_task;
      most = std::max(most, n);
    }
    width = static_cast<int>(std::clamp<std::size_t>(3 * most, 60, 200));
  }
  const double scale = r.step_time_s > 0 ? width / r.step_time_s : 0;
  std::vector<std::string> rows(p.stages.size(), std::string(static_cast<std::size_t>(width), '.'));
  std::size_t label = 0;
  for (const auto& s : p.stages) label = std::max(label, s.name.size());
  for (const auto& e : r.trace) {
    if (r.rank_replica[static_cast<std::size_t>(e.rank)] != 0 || e.lane == 1) continue;
    const Instruction& i =
        p.stages[static_cast<std::size_t>(e.stage)].instructions[static_cast<std::size_t>(e.instruction)];
    char c = '?';
    const int mb = i.microbatch >= 0 ? i.microbatch % 10 : 0;
    switch (i.op) {
      case Op::forward:
        c = static_cast<char>('0' + mb);
        break;
      case Op::backward:
        c = static_cast<char>('a' + mb);
        break;
      case Op::encoder_task:
        c = (i.flags & pipeline::kBackwardTask) ? 'E' : 'e';
        break;
      case Op::reduce_grads:
        c = 'R';
        break;
      case Op::batch_sync:
        c = 'S';
        break;
      case Op::optimizer_step:
        c = 'o';
        break;
      default:
        break;
    }
    int from = static_cast<int>(e.start * scale), to = static_cast<int>((e.start + e.duration) * scale);
    to = std::max(to, from + 1);
    for (int x = std::max(0, from); x < std::min(width, to); ++x)
      rows[static_cast<std::size_t>(e.stage)][static_cast<std::size_t>(x)] = c;
  }
  std::string out;
  char end[32];
  std::snprintf(end, sizeof end, "%.4g s", r.step_time_s);
  const std::string start = "0 s";
  out += std::string(label + 2, ' ') + start +
         std::string(static_cast<std::size_t>(
                         std::max<int>(1, width + 2 - static_cast<int>(start.size() + std::string(end).size()))),
                     ' ') +
         end + "\n";
  for (std::size_t s = 0; s < rows.size(); ++s) {
    out += std::string(label - p.stages[s].name.size(), ' ') + p.stages[s].name + " |" + rows[s] + "|\n";
  }
  out +=
      "forward: microbatch digit (mod 10); backward: a-j; e/E encoder forward/backward; R ReduceGrads; S BatchSync; o "
      "optimizer; . idle\n";
  return out;
}

}  // namespace braid::sim
