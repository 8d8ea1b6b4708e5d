// Named float32 parameters with their gradients, and the store that creates them.
//
// Initial values are a pure function of (seed, parameter name, element index): a
// counter-based generator, no shared stream. A parameter's values therefore do not depend
// on which other parameters exist, in what order they were created, or on how many ranks
// build the model, so every rank (and every layout) starts from the same weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/nn/ops.hpp"
#include "core/nn/tensor.hpp"

namespace braid::nn {

struct Init {
  enum class Kind : std::uint8_t { normal, constant };
  Kind kind = Kind::normal;
  float value = 0.02f;  // normal: the standard deviation (mean 0); constant: the value

  static Init normal(float stddev) { return {Kind::normal, stddev}; }
  static Init constant(float v) { return {Kind::constant, v}; }
};

// Which part of a parameter's whole tensor a rank holds under tensor parallelism: slice
// `index` of `count` equal slices along `axis` (0: rows, 1: columns), or all of it.
struct TensorSlice {
  int axis = -1;  // -1: the whole tensor
  int index = 0, count = 1;
  bool whole() const { return axis < 0; }
  friend bool operator==(const TensorSlice&, const TensorSlice&) = default;
};

struct Parameter {
  std::string name;       // "<module>.<part>.<tensor>", e.g. "vision.blocks.0.attn.q.weight"
  Tensor value;           // the slice this rank holds (all of it unless `slice` says otherwise)
  Tensor grad;            // value's shape; gradients add up here. Empty when frozen.
  bool trainable = true;  // false: frozen, no gradient, no optimizer state
  bool decay = true;      // AdamW weight decay applies: matrices yes; biases, norms, scales no
  Shape full_shape;       // the whole tensor's shape
  TensorSlice slice;      // what `value` is of the whole tensor
  Tensor* grad_or_null() { return trainable ? &grad : nullptr; }
};

// Fills `t` with draws of normal(0, stddev) keyed by (seed, name, element index).
void init_normal(Tensor& t, std::uint64_t seed, std::string_view name, float stddev);

class ParameterStore {
 public:
  explicit ParameterStore(std::uint64_t seed = 0) : seed_(seed) {}
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;
  ParameterStore(ParameterStore&&) = default;  // parameters keep their addresses
  ParameterStore& operator=(ParameterStore&&) = default;

  std::uint64_t seed() const { return seed_; }
  // Creates an initialised parameter (gradient zero when trainable). Throws
  // Error(invalid_argument) on a duplicate or empty name. The reference stays valid for
  // the store's life, moves included.
  Parameter& create(const std::string& name, const Shape& shape, Init init, bool trainable = true);

  // Every parameter in creation order: the flat, deterministic order that optimizer state and
  // checkpoints follow (the data-parallel gradient all-reduce takes it through
  // nn::layout_order).
  const std::vector<Parameter*>& all() const { return order_; }
  // nullptr when absent.
  Parameter* find(std::string_view name) const;
  int64_t numel() const;  // elements of every parameter as held here (slices), frozen ones included
  void zero_grads();
  // Every value and gradient where `ops` keeps tensors (a device's memory), and their
  // gradients zeroed there.
  void move_to(Ops& ops);

 private:
  std::uint64_t seed_;
  std::vector<std::unique_ptr<Parameter>> owned_;
  std::vector<Parameter*> order_;
};

// What every module has: a name (the prefix of its parameters' names), the parameters it
// and its parts created, in creation order, and whether it is frozen.
class Module {
 public:
  const std::string& name() const { return name_; }
  const std::vector<Parameter*>& parameters() const { return params_; }
  bool frozen() const { return frozen_; }
  int64_t numel() const;

 protected:
  Module(std::string name, bool frozen) : name_(std::move(name)), frozen_(frozen) {}
  // A parameter named "<this module>.<local>", trainable unless the module is frozen.
  Parameter& param(ParameterStore& store, const std::string& local, const Shape& shape, Init init);
  // Appends a part's parameters to this module's list (call right after building the part).
  void adopt(const Module& part);

 private:
  std::string name_;
  bool frozen_;
  std::vector<Parameter*> params_;
};

}  // namespace braid::nn
