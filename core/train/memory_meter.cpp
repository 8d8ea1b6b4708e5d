#include "core/train/memory_meter.hpp"

#include <malloc.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/common/error.hpp"
#include "core/common/text.hpp"
#include "core/cost/cost_model.hpp"
#include "core/plan/evaluate.hpp"
#include "core/train/comm_buffer.hpp"

namespace braid::train {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double tensor_bytes(const nn::Tensor& t) { return static_cast<double>(t.data.size() * sizeof(float)); }

double sum(const MemoryBytes& m) {
  double s = 0;
  for (double b : m.bytes) s += b;
  return s;
}

}  // namespace

const char* memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::weights:
      return "weights";
    case MemoryKind::gradients:
      return "gradients";
    case MemoryKind::optimizer:
      return "optimizer";
    case MemoryKind::activations:
      return "activations";
    case MemoryKind::communication:
      return "communication";
    case MemoryKind::messages:
      return "messages";
  }
  return "?";
}

void CommBytes::sample() const {
  if (meter) meter->sample();
}

MemoryMeter::MemoryMeter(const std::vector<TrainedParameter>& params) : params_(&params) {}

void MemoryMeter::add_source(MemoryKind kind, std::function<std::size_t()> bytes) {
  if (kind == MemoryKind::activations)
    throw Error(Status::invalid_argument,
                "memory sources report weights, gradients, optimizer state, communication buffers or messages; "
                "activations "
                "are measured from the heap");
  sources_.emplace_back(kind, std::move(bytes));
}

std::size_t MemoryMeter::heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

MemoryBytes MemoryMeter::tracked() const {
  MemoryBytes m;
  for (const auto& p : *params_) {
    // Under ZeRO the shards are what a rank keeps; the whole tensors exist while in use.
    m[MemoryKind::weights] += tensor_bytes(p.param->value) + tensor_bytes(p.value_shard);
    m[MemoryKind::gradients] += tensor_bytes(p.param->grad) + tensor_bytes(p.grad_shard);
    m[MemoryKind::optimizer] += tensor_bytes(p.state.m) + tensor_bytes(p.state.v);
  }
  for (const auto& [kind, bytes] : sources_) m[kind] += static_cast<double>(bytes());
  return m;
}

void MemoryMeter::add_idle_heap(std::function<std::size_t()> bytes) { idle_.push_back(std::move(bytes)); }

void MemoryMeter::measure_activations_on_device(std::function<std::size_t()> in_use) {
  device_in_use_ = std::move(in_use);
}

double MemoryMeter::heap_used() const {
  if (device_in_use_) return static_cast<double>(device_in_use_());
  double heap = static_cast<double>(heap_in_use());
  for (const auto& idle : idle_) heap -= static_cast<double>(idle());
  return heap;
}

void MemoryMeter::begin_step() {
  // One baseline, before the first step: later steps' activations are measured against the
  // same heap, so state created by a step (AdamW's moments) counts as its own kind, not as a
  // drop in activations. The heap first: computing the other kinds allocates nothing, but the
  // order keeps the two baselines from one moment whatever the sources do.
  if (samples_ == 0) {
    heap_at_start_ = heap_used();
    tracked_at_start_ = sum(tracked());
  }
  sample();
}

void MemoryMeter::sample() {
  const double heap = heap_used();
  MemoryBytes now = tracked();
  const double grown = sum(now) - tracked_at_start_;
  now[MemoryKind::activations] = std::max(0.0, heap - heap_at_start_ - grown);
  now.total = sum(now);
  for (std::size_t k = 0; k < now.bytes.size(); ++k) peak_.bytes[k] = std::max(peak_.bytes[k], now.bytes[k]);
  peak_.total = std::max(peak_.total, now.total);
  last_ = now;
  ++samples_;
}

MemoryComparison compare_with_prediction(const MemoryMeter& mine, const spec::RunSpec& run, const cost::CostModel& cost,
                                         const plan::Plan& plan, runtime::Communicator& world) {
  constexpr std::size_t width = kMemoryKinds + 1;
  std::array<double, width> local{};
  std::copy(mine.peak().bytes.begin(), mine.peak().bytes.end(), local.begin());
  local.back() = mine.peak().total;
  std::vector<double> all(width * static_cast<std::size_t>(world.size()));
  world.allgather(std::as_bytes(std::span<const double>(local)), std::as_writable_bytes(std::span<double>(all)));

  MemoryComparison c;
  c.run_precision = run.training.precision;
  c.predicted_as = cost.run().training.precision;
  c.ranks.resize(static_cast<std::size_t>(world.size()));
  for (std::size_t r = 0; r < c.ranks.size(); ++r) {
    MemoryBytes& m = c.ranks[r].measured;
    std::copy(all.begin() + static_cast<std::ptrdiff_t>(r * width),
              all.begin() + static_cast<std::ptrdiff_t>(r * width + kMemoryKinds), m.bytes.begin());
    m.total = all[r * width + kMemoryKinds];
  }
  try {
    const std::vector<plan::MemoryBreakdown> devices = plan::device_memory(cost, plan);
    for (std::size_t r = 0; r < c.ranks.size() && r < devices.size(); ++r) {
      const plan::MemoryBreakdown& d = devices[r];
      MemoryBytes& p = c.ranks[r].predicted;
      p[MemoryKind::weights] = d.weights;
      p[MemoryKind::gradients] = d.gradients;
      p[MemoryKind::optimizer] = d.optimizer;
      p[MemoryKind::activations] = d.activations;
      p[MemoryKind::communication] = d.communication();
      p.total = d.total() - d.reserved;
      c.ranks[r].predicted_reserved = d.reserved;
    }
  } catch (const Error& e) {
    c.prediction_error = e.what();
  }
  return c;
}

namespace {

std::string ratio(double measured, double predicted) { return predicted > 0 ? fixed(measured / predicted, 2) : "-"; }

}  // namespace

std::string format_memory_comparison(const MemoryComparison& c) {
  std::string out = "memory per rank at its peak, measured and as the cost model predicts it for this plan";
  if (c.run_precision != c.predicted_as)
    out += std::string(" (predicted in ") + spec::precision_name(c.predicted_as) +
           ", as the trainer runs; the run says " + spec::precision_name(c.run_precision) + ")";
  out += ":\n";
  if (!c.prediction_error.empty()) out += "no prediction: " + c.prediction_error + "\n";
  out += pad("rank", 6) + pad("kind", 15) + pad("measured MiB", 14, true) + pad("predicted MiB", 15, true) +
         pad("measured/predicted", 20, true) + "\n";
  for (std::size_t r = 0; r < c.ranks.size(); ++r) {
    const RankMemory& m = c.ranks[r];
    auto row = [&](const std::string& kind, double measured, double predicted, bool is_predicted) {
      out += pad(std::to_string(r), 6) + pad(kind, 15) + pad(fixed(measured / kMiB, 3), 14, true) +
             pad(is_predicted ? fixed(predicted / kMiB, 3) : "-", 15, true) +
             pad(is_predicted ? ratio(measured, predicted) : "-", 20, true) + "\n";
    };
    for (int k = 0; k < kMemoryKinds; ++k) {
      const auto kind = static_cast<MemoryKind>(k);
      row(memory_kind_name(kind), m.measured[kind], m.predicted[kind], predicted_kind(kind));
    }
    row("total", m.measured.total, m.predicted.total, true);
  }
  if (c.prediction_error.empty() && !c.ranks.empty())
    out += "not in the totals: the cluster's reserved memory, " + fixed(c.ranks.front().predicted_reserved / kMiB, 3) +
           " MiB a rank predicted (runtime, communicator buffers),\nas the measurement leaves out the heap before "
           "the first step; messages (point-to-point sends in flight)\nare measured, not predicted\n";
  return out;
}

std::string memory_json(const MemoryComparison& c, std::int64_t step) {
  auto bytes = [](const MemoryBytes& m, bool predicted) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for (int k = 0; k < kMemoryKinds; ++k)
      if (!predicted || predicted_kind(static_cast<MemoryKind>(k)))
        j[memory_kind_name(static_cast<MemoryKind>(k))] = m.bytes[static_cast<std::size_t>(k)];
    j["total"] = m.total;
    return j;
  };
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (std::size_t r = 0; r < c.ranks.size(); ++r) {
    nlohmann::ordered_json rank{{"rank", r}, {"measured_bytes", bytes(c.ranks[r].measured, false)}};
    rank["predicted_bytes"] = c.prediction_error.empty() ? bytes(c.ranks[r].predicted, true) : nlohmann::ordered_json();
    if (c.prediction_error.empty()) rank["predicted_reserved_bytes"] = c.ranks[r].predicted_reserved;
    ranks.push_back(std::move(rank));
  }
  nlohmann::ordered_json j{{"step", step},
                           {"memory", true},
                           {"run_precision", spec::precision_name(c.run_precision)},
                           {"predicted_as", spec::precision_name(c.predicted_as)},
                           {"ranks", ranks}};
  if (!c.prediction_error.empty()) j["prediction_error"] = c.prediction_error;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace braid::train
