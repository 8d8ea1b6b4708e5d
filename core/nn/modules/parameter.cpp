#include "core/nn/modules/parameter.hpp"

#include <cmath>
#include <utility>

#include "core/common/error.hpp"

namespace braid::nn {
namespace {

// SplitMix64's finaliser (Steele et al., "Fast splittable pseudorandom number generators",
// OOPSLA 2014): a bijective mix of 64 bits, enough to turn counters into independent draws.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

// A uniform draw in (0, 1] from 53 random bits: never 0, so its logarithm is finite.
double unit(std::uint64_t bits) { return static_cast<double>((bits >> 11) + 1) * 0x1.0p-53; }

}  // namespace

void init_normal(Tensor& t, std::uint64_t seed, std::string_view name, float stddev) {
  const std::uint64_t key = mix(seed ^ mix(fnv1a(name)));
  constexpr double kTwoPi = 6.283185307179586;
  for (std::size_t i = 0; i < t.data.size(); ++i) {
    // Box-Muller on two draws indexed by the element: no sequence, no order dependence.
    const std::uint64_t counter = 2 * static_cast<std::uint64_t>(i);
    const double u1 = unit(mix(key ^ mix(counter))), u2 = unit(mix(key ^ mix(counter + 1)));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
    t.data[i] = static_cast<float>(z * stddev);
  }
}

Parameter& ParameterStore::create(const std::string& name, const Shape& shape, Init init, bool trainable) {
  if (name.empty()) throw Error(Status::invalid_argument, "parameter store: a parameter needs a name");
  if (find(name)) throw Error(Status::invalid_argument, "parameter store: duplicate parameter name '" + name + "'");
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->value = Tensor(shape);
  p->full_shape = shape;
  if (init.kind == Init::Kind::normal)
    init_normal(p->value, seed_, name, init.value);
  else
    for (float& x : p->value.data) x = init.value;
  p->trainable = trainable;
  if (trainable) p->grad = Tensor(shape);
  p->decay = shape.size() >= 2;  // as open_clip: no decay on gains, biases and the logit scale
  order_.push_back(p.get());
  owned_.push_back(std::move(p));
  return *order_.back();
}

Parameter* ParameterStore::find(std::string_view name) const {
  for (Parameter* p : order_)
    if (p->name == name) return p;
  return nullptr;
}

int64_t ParameterStore::numel() const {
  int64_t n = 0;
  for (const Parameter* p : order_) n += p->value.numel();
  return n;
}

void ParameterStore::zero_grads() {
  for (Parameter* p : order_)
    if (p->trainable) reset(p->grad, p->value.shape);
}

void ParameterStore::move_to(Ops& ops) {
  for (Parameter* p : order_) {
    p->value = ops.from_host(p->value);
    if (p->trainable) ops.zero(p->grad, p->value.shape);
  }
}

int64_t Module::numel() const {
  int64_t n = 0;
  for (const Parameter* p : params_) n += p->value.numel();
  return n;
}

Parameter& Module::param(ParameterStore& store, const std::string& local, const Shape& shape, Init init) {
  Parameter& p = store.create(name_ + "." + local, shape, init, !frozen_);
  params_.push_back(&p);
  return p;
}

void Module::adopt(const Module& part) { params_.insert(params_.end(), part.params_.begin(), part.params_.end()); }

}  // namespace braid::nn
