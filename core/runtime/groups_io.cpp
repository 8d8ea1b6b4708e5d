#include "core/runtime/groups_io.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/common/text.hpp"

namespace braid::runtime {
namespace {

using nlohmann::ordered_json;

const std::string& module_name(const Topology& t, int m) { return t.modules[static_cast<std::size_t>(m)].name; }

std::string stage_label(const Topology& t, int m, int stage) {
  return module_name(t, m) + " stage " + std::to_string(stage);
}

// Prints at most `limit` of `count` items (all when `all`), then how many it left out.
template <typename Fn>
void listing(std::ostringstream& s, std::size_t count, std::size_t limit, bool all, const std::string& indent,
             Fn&& item) {
  const std::size_t shown = all ? count : std::min(count, limit);
  for (std::size_t i = 0; i < shown; ++i) item(i);
  if (shown < count) s << indent << "... (" << count - shown << " more)\n";
}

std::string span(int first, int last) {
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

std::string holdings_text(const Topology& t, int rank) {
  std::string out;
  for (const Holding& h : t.holdings[static_cast<std::size_t>(rank)]) {
    out += (out.empty() ? "" : "; ") + stage_label(t, h.module, h.stage) + " tp " + std::to_string(h.tp) + " dp " +
           std::to_string(h.dp);
  }
  return out;
}

}  // namespace

std::string format_ranks(const std::vector<int>& v) {
  std::string out;
  std::size_t i = 0;
  while (i < v.size()) {
    std::size_t j = i;
    const long long step = i + 1 < v.size() ? static_cast<long long>(v[i + 1]) - v[i] : 0;
    while (step > 0 && j + 1 < v.size() && static_cast<long long>(v[j + 1]) - v[j] == step) ++j;
    const std::size_t run = j - i + 1;
    std::string piece = std::to_string(v[i]);
    if (step == 1 && run >= 2) {
      piece.append("-").append(std::to_string(v[j]));
    } else if (step > 1 && run >= 5) {
      piece.append(",").append(std::to_string(v[i + 1])).append(",...,").append(std::to_string(v[j]));
    } else {
      j = i;
    }
    out += (out.empty() ? "" : ",") + piece;
    i = j + 1;
  }
  return out;
}

std::string to_json(const Topology& t) {
  ordered_json j;
  j["strategy"] = plan::strategy_name(t.strategy);
  j["layout"] = plan::layout_name(t.layout);
  j["world_size"] = t.world_size;
  j["modules"] = ordered_json::array();
  for (const auto& m : t.modules) {
    j["modules"].push_back(ordered_json{{"name", m.name},
                                        {"role", spec::role_name(m.role)},
                                        {"order", m.grid.order()},
                                        {"first_rank", m.grid.offset()},
                                        {"ranks", m.grid.size()},
                                        {"tp", m.grid.size_of(Axis::tp)},
                                        {"pp", m.grid.size_of(Axis::pp)},
                                        {"dp", m.grid.size_of(Axis::dp)}});
  }
  j["stages"] = ordered_json::array();
  for (const auto& st : t.stages) {
    j["stages"].push_back(ordered_json{{"name", st.name},
                                       {"module", st.module >= 0 ? ordered_json(module_name(t, st.module)) : nullptr},
                                       {"replicas", st.replicas},
                                       {"devices_per_replica", st.devices_per_replica},
                                       {"first_device", st.first_device},
                                       {"device_stride", st.device_stride}});
  }
  j["ranks"] = ordered_json::array();
  for (int rank = 0; rank < t.world_size; ++rank) {
    ordered_json holds = ordered_json::array();
    for (const Holding& h : t.holdings[static_cast<std::size_t>(rank)]) {
      holds.push_back(
          ordered_json{{"module", module_name(t, h.module)}, {"stage", h.stage}, {"tp", h.tp}, {"dp", h.dp}});
    }
    j["ranks"].push_back(ordered_json{
        {"rank", rank}, {"program_stage", t.stage_of_rank[static_cast<std::size_t>(rank)]}, {"holds", holds}});
  }
  j["groups"] = ordered_json::array();
  for (const auto& m : t.modules) {
    for (const auto& g : m.groups) {
      j["groups"].push_back(
          ordered_json{{"name", g.name}, {"module", m.name}, {"axis", axis_name(g.axis)}, {"ranks", g.ranks}});
    }
  }
  j["links"] = ordered_json::array();
  for (const auto& l : t.links) {
    ordered_json pairs = ordered_json::array();
    for (const auto& p : l.pairs) {
      pairs.push_back(ordered_json{{"from_replica", p.from_replica},
                                   {"to_replica", p.to_replica},
                                   {"from_ranks", p.from_ranks},
                                   {"to_ranks", p.to_ranks}});
    }
    j["links"].push_back(ordered_json{{"from", module_name(t, l.from)},
                                      {"from_stage", l.from_stage},
                                      {"to", module_name(t, l.to)},
                                      {"to_stage", l.to_stage},
                                      {"local", l.local},
                                      {"pairs", pairs}});
  }
  j["batch_sync"] = ordered_json::array();
  for (const auto& g : t.batch_syncs) {
    ordered_json members = ordered_json::array();
    for (const auto& m : g.members) {
      members.push_back(ordered_json{
          {"module", module_name(t, m.module)}, {"stage", m.stage}, {"replica", m.replica}, {"ranks", m.ranks}});
    }
    j["batch_sync"].push_back(ordered_json{{"name", g.name}, {"ranks", g.ranks}, {"members", members}});
  }
  return j.dump(2) + "\n";
}

std::string to_text(const Topology& t, const TextOptions& o) {
  const std::size_t limit = static_cast<std::size_t>(std::max(o.shown, 0));
  std::ostringstream s;
  std::size_t module_w = 8, stage_w = 6, group_w = 8;
  for (const auto& m : t.modules) {
    module_w = std::max(module_w, m.name.size() + 2);
    for (const auto& g : m.groups) group_w = std::max(group_w, g.name.size());
  }
  for (const auto& st : t.stages) stage_w = std::max(stage_w, st.name.size() + 2);
  s << "modules (rank grids, order tp-dp-pp: tp ranks consecutive, then replicas, then stages)\n";
  s << "  " << pad("module", module_w) << pad("role", 11) << pad("tp", 4, true) << pad("pp", 4, true)
    << pad("dp", 6, true) << "  ranks\n";
  for (const auto& m : t.modules) {
    s << "  " << pad(m.name, module_w) << pad(spec::role_name(m.role), 11)
      << pad(std::to_string(m.grid.size_of(Axis::tp)), 4, true)
      << pad(std::to_string(m.grid.size_of(Axis::pp)), 4, true)
      << pad(std::to_string(m.grid.size_of(Axis::dp)), 6, true) << "  "
      << span(m.grid.offset(), m.grid.offset() + m.grid.size() - 1) << "\n";
  }

  s << "\npipeline stages (the program's stages; replica r runs on first + r x tp ...)\n";
  s << "  " << pad("stage", 7) << pad("name", stage_w) << pad("replicas", 9, true) << pad("tp", 4, true) << "  ranks\n";
  for (std::size_t i = 0; i < t.stages.size(); ++i) {
    const auto& st = t.stages[i];
    s << "  " << pad(std::to_string(i), 7) << pad(st.name, stage_w) << pad(std::to_string(st.replicas), 9, true)
      << pad(std::to_string(st.devices_per_replica), 4, true) << "  "
      << span(st.first_device, st.first_device + (st.replicas - 1) * st.device_stride + st.devices_per_replica - 1)
      << "\n";
  }

  s << "\nranks (module stage, tp rank, dp replica)\n";
  listing(s, static_cast<std::size_t>(t.world_size), 2 * limit, o.all, "  ", [&](std::size_t r) {
    s << "  " << pad(std::to_string(r), 7) << holdings_text(t, static_cast<int>(r)) << "\n";
  });

  s << "\ngroups\n";
  for (const auto& m : t.modules) {
    std::size_t base = 0;
    for (Axis axis : kGroupAxes) {
      const std::size_t count = static_cast<std::size_t>(m.grid.size() / m.grid.size_of(axis));
      const int size = m.grid.size_of(axis);
      s << "  " << m.name << "." << axis_name(axis) << ": " << count << (count == 1 ? " group of " : " groups of ")
        << size << (size == 1 ? " rank\n" : " ranks\n");
      listing(s, count, limit, o.all, "    ", [&](std::size_t i) {
        const Group& g = m.groups[base + i];
        s << "    " << pad(g.name, group_w) << "  " << format_ranks(g.ranks) << "\n";
      });
      base += count;
    }
  }

  s << "\ncross-module links (activations forward, gradients back)\n";
  if (t.links.empty()) s << "  none\n";
  for (const auto& l : t.links) {
    const int A = t.modules[static_cast<std::size_t>(l.from)].grid.size_of(Axis::dp);
    const int B = t.modules[static_cast<std::size_t>(l.to)].grid.size_of(Axis::dp);
    s << "  " << stage_label(t, l.from, l.from_stage) << " -> " << stage_label(t, l.to, l.to_stage) << ": ";
    s << (A > B   ? "fan-in "
          : A < B ? "fan-out "
                  : "")
      << A << " -> " << B << " replicas, " << l.pairs.size() << (l.pairs.size() == 1 ? " pair" : " pairs")
      << (l.local ? ", local (each pair on the same ranks)" : "") << "\n";
    if (l.local && !o.all) continue;  // the pairs would only repeat the replicas
    listing(s, l.pairs.size(), limit, o.all, "    ", [&](std::size_t i) {
      const auto& p = l.pairs[i];
      s << "    replica " << p.from_replica << " (" << format_ranks(p.from_ranks) << ") -> replica " << p.to_replica
        << " (" << format_ranks(p.to_ranks) << ")\n";
    });
  }

  s << "\nbatch-sync groups (contrastive loss: embeddings of every tower and replica)\n";
  if (t.batch_syncs.empty()) s << "  none\n";
  for (const auto& g : t.batch_syncs) {
    s << "  " << g.name << ": " << g.ranks.size() << " ranks " << format_ranks(g.ranks) << "\n";
    listing(s, g.members.size(), limit, o.all, "    ", [&](std::size_t i) {
      const auto& m = g.members[i];
      s << "    " << stage_label(t, m.module, m.stage) << " replica " << m.replica << " (" << format_ranks(m.ranks)
        << ")\n";
    });
  }
  return s.str();
}

}  // namespace braid::runtime
