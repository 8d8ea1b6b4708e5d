#include "core/nn/tensor.hpp"

#include <utility>

#include "core/common/error.hpp"

namespace braid::nn {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(Status::invalid_argument, "tensor: negative dimension in shape " + shape_string(shape));
    if (__builtin_mul_overflow(n, d, &n))
      throw Error(Status::invalid_argument, "tensor: shape " + shape_string(shape) + " has more elements than 2^63");
  }
  return n;
}

std::string shape_string(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

Tensor::Tensor(Shape shape_in, float fill)
    : shape(std::move(shape_in)), data(static_cast<std::size_t>(shape_numel(shape)), fill) {}

Tensor::Tensor(Shape shape_in, Storage values) : shape(std::move(shape_in)), data(std::move(values)) {
  if (shape_numel(shape) != numel())
    throw Error(Status::invalid_argument,
                "tensor: " + std::to_string(numel()) + " values do not fill shape " + shape_string(shape));
}

int64_t Tensor::dim(int axis) const {
  const int r = rank();
  if (axis < -r || axis >= r)
    throw Error(Status::invalid_argument,
                "tensor: axis " + std::to_string(axis) + " out of range for shape " + shape_string(shape));
  return shape[static_cast<std::size_t>(axis < 0 ? axis + r : axis)];
}

Tensor& Tensor::reshape(Shape new_shape) {
  if (shape_numel(new_shape) != numel())
    throw Error(Status::invalid_argument,
                "tensor: cannot reshape " + shape_string(shape) + " to " + shape_string(new_shape));
  shape = std::move(new_shape);
  return *this;
}

void reset(Tensor& t, const Shape& shape) {
  t.data.assign(static_cast<std::size_t>(shape_numel(shape)), 0.0f);  // checks borrowed memory first
  t.shape = shape;
}

void prepare_output(Tensor& t, const Shape& shape) {
  t.data.resize_for_overwrite(static_cast<std::size_t>(shape_numel(shape)));
  t.shape = shape;
}

void expect_shape(const Tensor& t, const Shape& shape, const char* op, const char* what) {
  if (t.shape != shape)
    throw Error(Status::invalid_argument, std::string(op) + ": " + what + " has shape " + shape_string(t.shape) +
                                              " but " + shape_string(shape) + " is expected");
}

}  // namespace braid::nn
