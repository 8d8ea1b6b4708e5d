#include "core/train/zero.hpp"

#include <algorithm>
#include <memory>
#include <set>
#include <span>
#include <utility>

#include "core/common/error.hpp"
#include "core/train/host_staging.hpp"
#include "core/train/memory_meter.hpp"

namespace braid::train {

nn::Shape held_shape(const nn::Parameter& p) {
  nn::Shape shape = p.full_shape;
  if (!p.slice.whole()) shape[static_cast<std::size_t>(p.slice.axis)] /= p.slice.count;
  return shape;
}

std::vector<ZeroUnitSpec> zero_units(const std::vector<nn::Parameter*>& part,
                                     const std::vector<const nn::TransformerBlock*>& blocks) {
  std::vector<ZeroUnitSpec> out;
  std::set<const nn::Parameter*> in_blocks;
  for (const nn::TransformerBlock* b : blocks) {
    ZeroUnitSpec unit{b, {}};
    for (nn::Parameter* p : b->parameters()) {
      if (p->trainable) unit.params.push_back(p);
      in_blocks.insert(p);
    }
    out.push_back(std::move(unit));
  }
  ZeroUnitSpec rest;
  for (nn::Parameter* p : part)
    if (p->trainable && !in_blocks.count(p)) rest.params.push_back(p);
  out.push_back(std::move(rest));
  return out;
}

namespace {

// Sets a flag for its scope, whatever leaves it.
struct StepEnd {
  explicit StepEnd(bool& flag) : flag(flag) { flag = true; }
  ~StepEnd() { flag = false; }
  StepEnd(const StepEnd&) = delete;
  StepEnd& operator=(const StepEnd&) = delete;
  bool& flag;
};

}  // namespace

ZeroModule::ZeroModule(std::string name, int stage, runtime::Communicator& dp, nn::Ops& ops,
                       std::vector<ZeroUnitSpec> units, std::vector<TrainedParameter>& params,
                       std::function<void(double)> in_pipeline_wait)
    : name_(std::move(name)), stage_(stage), dp_(dp), ops_(ops), in_pipeline_wait_(std::move(in_pipeline_wait)) {
  if (stage < 1 || stage > 3)
    throw Error(Status::invalid_argument, name_ + ": ZeRO stage " + std::to_string(stage) + " does not exist");
  std::map<const nn::Parameter*, TrainedParameter*> trained;
  for (auto& t : params) trained[t.param] = &t;
  const std::int64_t ranks = dp.size(), rank = dp.rank();
  units_.emplace_back();  // the rest of the module part comes first, even when empty
  for (auto& spec : units) {
    Unit u;
    for (nn::Parameter* p : spec.params) {
      const auto it = trained.find(p);
      if (it == trained.end()) throw Error(Status::internal, name_ + ": ZeRO unit holds untrained " + p->name);
      u.offsets.push_back(u.numel);
      u.params.push_back(it->second);
      u.numel += p->value.numel();
    }
    u.shard = (u.numel + ranks - 1) / ranks;
    const std::int64_t lo = rank * u.shard, hi = lo + u.shard;
    for (std::size_t i = 0; i < u.params.size(); ++i) {
      TrainedParameter& t = *u.params[i];
      const std::int64_t at = u.offsets[i], n = t.param->value.numel();
      t.begin = std::clamp(lo - at, std::int64_t{0}, n);
      t.end = std::clamp(hi - at, t.begin, n);
      // Stage 1 reduces into its range of the whole gradient; 2 and 3 keep the shard alone.
      if (stage_ >= 2) {
        t.grad_shard = nn::Tensor({t.end - t.begin});
        t.param->grad = nn::Tensor();
      }
    }
    if (spec.block) {
      by_block_[spec.block] = units_.size();
      units_.push_back(std::move(u));
    } else {
      units_.front() = std::move(u);
    }
  }
  if (stage_ == 3)
    for (auto& u : units_) {
      for (TrainedParameter* t : u.params) {
        nn::Tensor scratch;
        const float* from = on_host(ops_, t->param->value, scratch).ptr();
        nn::Tensor shard({t->end - t->begin});
        std::copy(from + t->begin, from + t->end, shard.ptr());
        t->value_shard = ops_.from_host(std::move(shard));
        t->weights_sharded = true;
      }
      free_weights(u);
    }
}

void ZeroModule::measure_with(MemoryMeter& meter) {
  comm_bytes_.meter = &meter;
  meter.add_source(MemoryKind::communication, [this] { return comm_bytes_.in_flight; });
}

void ZeroModule::sample_inside() {
  if (running_ || step_end_) comm_bytes_.sample();
}

ZeroModule::Unit& ZeroModule::unit_of(const nn::TransformerBlock& block) {
  const auto it = by_block_.find(&block);
  if (it == by_block_.end()) throw Error(Status::internal, name_ + ": ZeRO has no unit for " + block.name());
  return units_[it->second];
}

void ZeroModule::begin_step() {
  // Stages 2 and 3 keep no whole gradient between instructions (an evaluation's gather makes
  // them again).
  for (auto& u : units_)
    for (TrainedParameter* t : u.params) {
      if (!t->grad_shard.data.empty()) ops_.zero(t->grad_shard, t->grad_shard.shape);
      if (stage_ >= 2) t->param->grad = nn::Tensor();
    }
}

void ZeroModule::free_weights(Unit& u) {
  for (TrainedParameter* t : u.params) t->param->value = nn::Tensor();
}

void ZeroModule::begin_instruction(int block_calls, int rest_calls, bool backward) {
  if (running_) throw Error(Status::internal, name_ + ": ZeRO instructions overlap");
  running_ = true;
  backward_ = backward;
  for (auto& u : units_) u.calls = block_calls;
  units_.front().calls = rest_calls;
  // A stage-3 backward gathers every unit first. Gathered at first use, a replica with one call
  // (one image-side group) would post "gather b1, reduce b1, gather b0" where one with two posts
  // "gather b1, gather b0, reduce b1": the replicas' collectives would cross (a hang, or a
  // gather matched with a reduction). Gathered first, each posts the gathers in unit order,
  // then the reductions after each unit's last use, in the order the backward finishes them.
  if (backward && stage_ == 3 && !whole_ && dp_.size() > 1)
    for (auto& u : units_) {
      in_pipeline_wait_(all_gather(u));
      u.gathered = true;
    }
}

void ZeroModule::end_instruction() {
  running_ = false;
  for (auto& u : units_) {
    // Gathered for a backward that made no call into it (or stopped short): its last use freed nothing.
    if (u.gathered && (u.calls == 0 || u.done < u.calls)) free_weights(u);
    u.used = u.done = 0;
    u.gathered = false;
  }
}

void ZeroModule::acquire(Unit& u) {
  if (!running_) throw Error(Status::internal, name_ + ": ZeRO unit used outside an instruction");
  if (u.used >= u.calls)
    throw Error(Status::internal, name_ + ": a ZeRO unit used more often than its instruction announced");
  if (u.used++ > 0) return;
  if (stage_ == 3 && !whole_ && !u.gathered) in_pipeline_wait_(all_gather(u));
  if (backward_ && stage_ >= 2)
    for (TrainedParameter* t : u.params)
      if (t->param->grad.data.empty()) ops_.zero(t->param->grad, held_shape(*t->param));
}

void ZeroModule::release(Unit& u) {
  if (u.done >= u.used) throw Error(Status::internal, name_ + ": a ZeRO unit released more often than it was used");
  if (++u.done < u.calls) return;
  if (backward_ && stage_ >= 2) {
    in_pipeline_wait_(reduce_scatter(u));
    for (TrainedParameter* t : u.params) t->param->grad = nn::Tensor();
  }
  if (stage_ == 3 && !whole_) free_weights(u);
}

void ZeroModule::before_call() { acquire(units_.front()); }
void ZeroModule::after_call() { release(units_.front()); }
void ZeroModule::before_block(const nn::TransformerBlock& block, bool) { acquire(unit_of(block)); }
void ZeroModule::after_block(const nn::TransformerBlock& block, bool) { release(unit_of(block)); }

double ZeroModule::reduce() {
  Pending posted = post_reduce();
  return posted.empty() ? 0.0 : posted.finish();
}

Pending ZeroModule::post_reduce() {
  if (stage_ != 1) return {};
  // Unit by unit, each posted once the one before has completed (in unit order on every rank):
  // one unit's copy and shard alive at a time, and the MPI library's buffers of one
  // non-blocking reduce-scatter (Open MPI's hold about twice its input), not the module part's.
  struct Chain {
    std::size_t next = 0;
    std::function<void()> copy;  // owns the unit's buffers
    runtime::Request current;    // declared after them: dropped unfinished, it waits before they go
    bool done = false;
  };
  auto chain = std::make_shared<Chain>();
  // Copies the completed unit's sums in and posts the next unit; done when none is left.
  auto advance = [this, chain] {
    if (chain->copy) std::exchange(chain->copy, {})();
    while (chain->next < units_.size() && units_[chain->next].params.empty()) ++chain->next;
    if (chain->next == units_.size()) {
      chain->done = true;
      return;
    }
    std::vector<runtime::Request> posted;
    const StepEnd sampled(step_end_);  // as the unit is copied out, before its post
    chain->copy = post_reduce_scatter(units_[chain->next++], posted);
    chain->current = std::move(posted.front());
  };
  advance();
  if (chain->done) return {};
  Pending p;
  p.test = [chain, advance] {
    while (!chain->done && chain->current.test()) advance();
    return chain->done;
  };
  p.finish = [chain, advance] {
    double waited = 0;
    while (!chain->done) {
      waited += chain->current.wait();
      advance();
    }
    return waited;
  };
  return p;
}

double ZeroModule::after_step() {
  double waited = 0;
  const StepEnd sampled(step_end_);
  if (stage_ < 3)
    for (auto& u : units_) waited += all_gather(u);
  return waited;
}

void ZeroModule::materialize(bool whole) {
  if (stage_ != 3 || whole == whole_) return;
  for (auto& u : units_) {
    if (whole)
      all_gather(u);
    else
      free_weights(u);
  }
  whole_ = whole;
}

double ZeroModule::reduce_scatter(Unit& u) {
  if (u.params.empty()) return 0;
  std::vector<runtime::Request> requests;
  std::function<void()> copy = post_reduce_scatter(u, requests);
  return pending_requests(std::move(requests), std::move(copy)).finish();
}

std::function<void()> ZeroModule::post_reduce_scatter(Unit& u, std::vector<runtime::Request>& requests) {
  auto flat = std::make_shared<CommBuffer>(static_cast<std::size_t>(u.shard * dp_.size()), comm_bytes_.in_flight);
  for (std::size_t i = 0; i < u.params.size(); ++i) {
    nn::Tensor scratch;
    const nn::Tensor& g = on_host(ops_, u.params[i]->param->grad, scratch);
    std::copy(g.data.begin(), g.data.end(), flat->data.begin() + u.offsets[i]);
  }
  auto mine = std::make_shared<CommBuffer>(static_cast<std::size_t>(u.shard), comm_bytes_.in_flight);
  sample_inside();  // the unit's whole gradient, its copy, the shards
  requests.push_back(dp_.ireduce_scatter(std::span<const float>(flat->data), std::span<float>(mine->data)));
  return [this, &u, flat, mine] {
    const std::int64_t lo = dp_.rank() * u.shard;
    for (std::size_t i = 0; i < u.params.size(); ++i) {
      TrainedParameter& t = *u.params[i];
      if (t.end == t.begin) continue;  // none of it is this rank's
      const float* from = mine->data.data() + (u.offsets[i] + t.begin - lo);
      if (stage_ == 1) {  // once per step: the sum replaces this rank's range of the whole gradient
        edit_on_host(ops_, t.param->grad,
                     [&](nn::Tensor& g) { std::copy(from, from + (t.end - t.begin), g.data.begin() + t.begin); });
        continue;
      }
      edit_on_host(ops_, t.grad_shard, [&](nn::Tensor& g) {
        for (std::int64_t k = 0; k < t.end - t.begin; ++k) g.data[static_cast<std::size_t>(k)] += from[k];
      });
    }
  };
}

double ZeroModule::all_gather(Unit& u) {
  if (u.params.empty()) return 0;
  CommBuffer mine(static_cast<std::size_t>(u.shard), comm_bytes_.in_flight);
  const std::int64_t lo = dp_.rank() * u.shard;
  for (std::size_t i = 0; i < u.params.size(); ++i) {
    const TrainedParameter& t = *u.params[i];
    if (t.end == t.begin) continue;  // none of it is this rank's
    nn::Tensor scratch;
    const float* from = stage_ == 3 ? on_host(ops_, t.value_shard, scratch).ptr()
                                    : on_host(ops_, t.param->value, scratch).ptr() + t.begin;
    std::copy(from, from + (t.end - t.begin), mine.data.begin() + (u.offsets[i] + t.begin - lo));
  }
  CommBuffer all(static_cast<std::size_t>(u.shard * dp_.size()), comm_bytes_.in_flight);
  auto req = dp_.iallgather(std::as_bytes(std::span<const float>(mine.data)),
                            std::as_writable_bytes(std::span<float>(all.data)));
  const double waited = req.wait();
  for (std::size_t i = 0; i < u.params.size(); ++i) {
    nn::Parameter& p = *u.params[i]->param;
    const auto first = all.data.begin() + u.offsets[i];
    if (p.value.device().is_host() && !p.value.data.empty()) {  // in place
      std::copy(first, first + p.value.numel(), p.value.data.begin());
      continue;
    }
    nn::Tensor value(held_shape(p));
    std::copy(first, first + value.numel(), value.data.begin());
    p.value = ops_.from_host(std::move(value));
  }
  sample_inside();  // the unit's whole weights beside its buffers
  return waited;
}

std::map<const nn::Parameter*, nn::Tensor> ZeroModule::gather(
    const std::function<std::optional<std::span<const float>>(const TrainedParameter&)>& shard_of) {
  std::map<const nn::Parameter*, nn::Tensor> out;
  for (auto& u : units_) {
    if (u.params.empty()) continue;
    std::vector<float> mine(static_cast<std::size_t>(u.shard), 0.0f);
    const std::int64_t lo = dp_.rank() * u.shard;
    std::vector<bool> exists(u.params.size(), false);
    for (std::size_t i = 0; i < u.params.size(); ++i) {
      const TrainedParameter& t = *u.params[i];
      const auto shard = shard_of(t);
      exists[i] = shard && static_cast<std::int64_t>(shard->size()) == t.end - t.begin;
      if (exists[i] && t.end > t.begin)
        std::copy(shard->begin(), shard->end(), mine.begin() + (u.offsets[i] + t.begin - lo));
    }
    std::vector<float> all(static_cast<std::size_t>(u.shard * dp_.size()));
    dp_.allgather(std::as_bytes(std::span<const float>(mine)), std::as_writable_bytes(std::span<float>(all)));
    for (std::size_t i = 0; i < u.params.size(); ++i) {
      const nn::Parameter& p = *u.params[i]->param;
      nn::Tensor whole;
      if (exists[i] || u.params[i]->end == u.params[i]->begin) {
        whole = nn::Tensor(held_shape(p));
        std::copy(all.begin() + u.offsets[i], all.begin() + u.offsets[i] + whole.numel(), whole.data.begin());
      }
      out[&p] = std::move(whole);
    }
  }
  return out;
}

void hold_state(TrainedParameter& t, nn::Tensor value, nn::AdamWState adam) {
  if (!t.sharded()) {
    t.param->value = std::move(value);
    t.state = std::move(adam);
    return;
  }
  auto cut = [&](const nn::Tensor& whole) {
    if (whole.data.empty()) return nn::Tensor();
    if (whole.numel() != nn::shape_numel(held_shape(*t.param)))
      throw Error(Status::bad_config, t.param->name + ": the checkpoint holds " + std::to_string(whole.numel()) +
                                          " elements of its state, the model " +
                                          std::to_string(nn::shape_numel(held_shape(*t.param))));
    nn::Tensor shard({t.end - t.begin});
    std::copy(whole.data.begin() + t.begin, whole.data.begin() + t.end, shard.data.begin());
    return shard;
  };
  t.state.m = cut(adam.m);
  t.state.v = cut(adam.v);
  t.state.step = adam.step;
  if (t.weights_sharded)  // stage 3: the weights' shard only
    t.value_shard = cut(value);
  else
    t.param->value = std::move(value);
}

std::map<const nn::Parameter*, nn::Tensor> gather_sharded(const std::vector<ZeroModule*>& modules,
                                                          const std::string& kind) {
  std::map<const nn::Parameter*, nn::Tensor> out;
  for (ZeroModule* z : modules) {
    if (!z || (kind == "param" && z->stage() < 3)) continue;
    const int stage = z->stage();
    nn::Tensor scratch;  // a device tensor's host copy, read before the next call
    auto part = z->gather([&](const TrainedParameter& t) -> std::optional<std::span<const float>> {
      auto of = [&](const nn::Tensor& x) -> std::optional<std::span<const float>> {
        if (x.data.empty()) return std::nullopt;  // not created yet (or a shard of no elements)
        return std::span<const float>(on_host(z->ops(), x, scratch).data);
      };
      if (kind == "param") return of(t.value_shard);
      if (kind == "adam_m") return of(t.state.m);
      if (kind == "adam_v") return of(t.state.v);
      if (kind == "grad" && stage == 1)  // reduced in place
        return std::span<const float>(on_host(z->ops(), t.param->grad, scratch).data)
            .subspan(static_cast<std::size_t>(t.begin), static_cast<std::size_t>(t.end - t.begin));
      if (kind == "grad") return of(t.grad_shard);
      throw Error(Status::internal, "ZeRO: no state '" + kind + "'");
    });
    out.merge(part);
  }
  return out;
}

}  // namespace braid::train
