// A float32 tensor for the reference ops: a shape and contiguous row-major storage, which
// the tensor owns (host) or borrows (device memory, a framework's buffer): see storage.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/storage.hpp"

namespace braid::nn {

using Shape = std::vector<int64_t>;

struct Tensor {
  Shape shape;
  Storage data;

  Tensor() = default;
  explicit Tensor(Shape shape, float fill = 0.0f);
  Tensor(Shape shape, Storage values);  // values.size() must match the shape

  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  const Device& device() const { return data.device(); }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int axis) const;  // a negative axis counts from the back
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }
  // The same elements under another shape with the same element count.
  Tensor& reshape(Shape new_shape);
};

int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);  // "(2, 3, 4)"

// Gives `t` this shape, every element zero (storage is reused).
void reset(Tensor& t, const Shape& shape);
// Gives `t` this shape for an op that writes every element: their values until then are
// unspecified (NaN in debug builds), nothing is zeroed (storage is reused).
void prepare_output(Tensor& t, const Shape& shape);
// Throws invalid_argument naming the op and the argument unless `t` has exactly `shape`.
void expect_shape(const Tensor& t, const Shape& shape, const char* op, const char* what);

}  // namespace braid::nn
