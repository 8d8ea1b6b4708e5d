// braid/tensor.h: braid_tensor views converted to core views, and the contrastive loss:
// CPU tensors on core/nn/contrastive_tiled, CUDA tensors on the CUDA plugin's tiled op
// (device interface v2), ordered on the caller's stream.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "capi/src/cuda_contrastive.hpp"
#include "capi/src/guard.hpp"
#include "core/nn/contrastive_tiled.hpp"

// The DLTensor layout (DLPack v0.8) on every 64-bit target braid builds for.
static_assert(sizeof(braid_device) == 8 && sizeof(braid_dtype) == 4);
static_assert(offsetof(braid_tensor, device) == 8 && offsetof(braid_tensor, ndim) == 16 &&
              offsetof(braid_tensor, dtype) == 20 && offsetof(braid_tensor, shape) == 24 &&
              offsetof(braid_tensor, strides) == 32 && offsetof(braid_tensor, byte_offset) == 40 &&
              sizeof(braid_tensor) == 48);

namespace {

using braid::Error;
using braid::Status;
using braid::nn::RowsView;

constexpr std::size_t kOptionsVersions[] = {sizeof(braid_contrastive_options)};

std::string shape_text(const braid_tensor& t) {
  std::string s = "(";
  for (int32_t d = 0; d < t.ndim; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + (t.ndim == 1 ? ",)" : ")");
}

std::string device_text(const braid_device& d) {
  return d.type == BRAID_DEVICE_CPU    ? std::string("CPU memory")
         : d.type == BRAID_DEVICE_CUDA ? "CUDA device " + std::to_string(d.index)
                                       : "device type " + std::to_string(d.type);
}

// A 2-D float32 tensor on `device` with contiguous rows as a core view, or an error naming
// `name`. CUDA views must also be dense (the device ops take row-major views).
template <class T>
RowsView<T> rows_view(const char* func, const char* name, const braid_tensor* t, braid_device device) {
  const std::string where = std::string(func) + ": " + name;
  if (!t) throw Error(Status::invalid_argument, where + " is NULL");
  if (t->device.type != BRAID_DEVICE_CPU && t->device.type != BRAID_DEVICE_CUDA)
    throw Error(Status::unsupported, where + " has device type " + std::to_string(t->device.type) +
                                         "; supported: CPU memory (BRAID_DEVICE_CPU, 1) and CUDA memory "
                                         "(BRAID_DEVICE_CUDA, 2)");
  if (t->device.type != device.type || (device.type == BRAID_DEVICE_CUDA && t->device.index != device.index))
    throw Error(Status::invalid_argument, where + " is in " + device_text(t->device) + " but local_image is in " +
                                              device_text(device) + ": every tensor of the call must be on one device");
  if (t->dtype.code != BRAID_DTYPE_FLOAT || t->dtype.bits != 32 || t->dtype.lanes != 1)
    throw Error(Status::unsupported, where + " has dtype {code " + std::to_string(t->dtype.code) + ", bits " +
                                         std::to_string(t->dtype.bits) + ", lanes " + std::to_string(t->dtype.lanes) +
                                         "}; supported: float32 {BRAID_DTYPE_FLOAT, 32, 1}");
  if (t->ndim != 2) {
    const std::string shape = t->shape && t->ndim > 0 && t->ndim < 64 ? " " + shape_text(*t) : "";
    throw Error(Status::unsupported,
                where + " has " + std::to_string(t->ndim) + " dimensions" + shape + "; supported: 2-D (rows, E) views");
  }
  if (!t->shape) throw Error(Status::invalid_argument, where + "->shape is NULL");
  const int64_t rows = t->shape[0], cols = t->shape[1];
  if (rows < 0 || cols < 0) throw Error(Status::invalid_argument, where + " has a negative shape " + shape_text(*t));
  int64_t row_stride = cols;
  if (t->strides) {
    if (cols > 1 && t->strides[1] != 1)
      throw Error(Status::unsupported,
                  where + " " + shape_text(*t) + " has strides (" + std::to_string(t->strides[0]) + ", " +
                      std::to_string(t->strides[1]) +
                      "); supported: contiguous rows (strides[1] == 1) with a row stride >= " + std::to_string(cols));
    row_stride = t->strides[0];
    if (rows > 1 && row_stride < cols)
      throw Error(Status::unsupported, where + " " + shape_text(*t) + " has strides (" + std::to_string(t->strides[0]) +
                                           ", " + std::to_string(t->strides[1]) +
                                           "): its rows overlap; supported: a row stride >= " + std::to_string(cols));
  }
  if (device.type == BRAID_DEVICE_CUDA && rows > 1 && row_stride != cols)
    throw Error(Status::unsupported, where + " " + shape_text(*t) + " has a row stride of " +
                                         std::to_string(row_stride) + "; CUDA tensors need dense rows (stride " +
                                         std::to_string(cols) + ")");
  if (!t->data && rows * cols > 0) throw Error(Status::invalid_argument, where + "->data is NULL");
  char* first = static_cast<char*>(t->data) + t->byte_offset;
  if (reinterpret_cast<std::uintptr_t>(first) % alignof(float) != 0)
    throw Error(Status::invalid_argument, where + ": data + byte_offset is not aligned to a float (4 bytes)");
  return {reinterpret_cast<T*>(first), rows, cols, row_stride};
}

// The problem from the four inputs, the scale and the caller's options.
// The call's device: local_image's (every other tensor must be on it).
braid_device call_device(const char* func, const braid_tensor* local_image) {
  if (!local_image) throw Error(Status::invalid_argument, std::string(func) + ": local_image is NULL");
  return local_image->device;
}

braid::nn::ContrastiveProblem read_problem(const char* func, const braid_tensor* local_image,
                                           const braid_tensor* local_text, const braid_tensor* all_image,
                                           const braid_tensor* all_text, float logit_scale,
                                           const braid_contrastive_options& options) {
  const braid_device device = call_device(func, local_image);
  braid::nn::ContrastiveProblem p;
  p.local_image = rows_view<const float>(func, "local_image", local_image, device);
  p.local_text = rows_view<const float>(func, "local_text", local_text, device);
  p.all_image = rows_view<const float>(func, "all_image", all_image, device);
  p.all_text = rows_view<const float>(func, "all_text", all_text, device);
  p.row_offset = options.row_offset;
  p.logit_scale = logit_scale;
  p.tile = options.tile;
  braid::nn::check_contrastive_problem(p);  // the inputs' errors before those of the outputs
  return p;
}

// stats (2, n): its two rows.
braid::nn::ContrastiveStats read_stats(const char* func, const braid_tensor* stats, int64_t n, braid_device device) {
  const auto view = rows_view<float>(func, "stats", stats, device);
  if (view.rows != 2 || view.cols != n)
    throw Error(Status::invalid_argument, std::string(func) + ": stats is (" + std::to_string(view.rows) + ", " +
                                              std::to_string(view.cols) + "); expected (2, " + std::to_string(n) +
                                              "): one log-sum-exp per local row and direction");
  return {view.data, view.data + view.stride};
}

// A gradient the caller may leave out (a NULL tensor); one given has its input's shape
// (`rows` x `cols`, as `like`), even with no elements, where its data may be NULL.
RowsView<float> optional_grad(const char* func, const char* name, braid_tensor* t, braid_device device, int64_t rows,
                              int64_t cols, const char* like) {
  if (!t) return {};
  const auto view = rows_view<float>(func, name, t, device);
  if (view.rows != rows || view.cols != cols)
    throw Error(Status::invalid_argument, std::string(func) + ": " + name + " is (" + std::to_string(view.rows) + ", " +
                                              std::to_string(view.cols) + "); expected (" + std::to_string(rows) +
                                              ", " + std::to_string(cols) + ") as " + like + " (or NULL: not wanted)");
  return view;
}

// The bytes a view spans, first element to last (none when it holds no element).
struct Extent {
  const char* begin = nullptr;
  const char* end = nullptr;
  const char* name = "";
};
template <class T>
Extent extent(const RowsView<T>& v, const char* name) {
  if (!v.data || v.rows <= 0 || v.cols <= 0) return {nullptr, nullptr, name};
  const char* begin = reinterpret_cast<const char*>(v.data);
  return {begin, begin + static_cast<std::size_t>((v.rows - 1) * v.stride + v.cols) * sizeof(float), name};
}

// Gradients are written, not added to: one sharing memory with another gradient or with an
// input would be read after it was written over, and the results would be silently wrong.
void expect_apart(const char* func, const std::vector<Extent>& outputs, const std::vector<Extent>& inputs) {
  const auto overlap = [](const Extent& a, const Extent& b) {
    return a.begin && b.begin && a.begin < b.end && b.begin < a.end;
  };
  const auto refuse = [&](const Extent& a, const Extent& b) {
    throw Error(Status::invalid_argument, std::string(func) + ": " + a.name + " overlaps " + b.name +
                                              "; gradients are written in place and must not share memory with "
                                              "each other or the inputs");
  };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (overlap(outputs[i], outputs[j])) refuse(outputs[i], outputs[j]);
    for (const Extent& in : inputs)
      if (overlap(outputs[i], in)) refuse(outputs[i], in);
  }
}

}  // namespace

extern "C" {

BRAID_API braid_status braid_contrastive_forward(const braid_tensor* local_image, const braid_tensor* local_text,
                                                 const braid_tensor* all_image, const braid_tensor* all_text,
                                                 float logit_scale, const braid_contrastive_options* options,
                                                 braid_tensor* stats, float* loss, void* stream) {
  BRAID_API_BEGIN  // CPU tensors: synchronous, the stream unused
      BRAID_REQUIRE(loss, "loss is NULL");
  braid_contrastive_options opts = BRAID_CONTRASTIVE_OPTIONS_INIT;
  if (options)
    BRAID_READ_OPTIONS(options, braid_contrastive_options, kOptionsVersions, BRAID_CONTRASTIVE_OPTIONS_VERSION,
                       BRAID_CONTRASTIVE_OPTIONS_INIT, &opts);
  const auto problem = read_problem(__func__, local_image, local_text, all_image, all_text, logit_scale, opts);
  const int64_t n = problem.local_image.rows;
  const braid_device device = local_image->device;
  const auto st = read_stats(__func__, stats, n, device);
  if (device.type == BRAID_DEVICE_CUDA) {
    const double sum = braid::capi::cuda_contrastive_forward(problem, st, device.index, stream);
    *loss = n > 0 ? static_cast<float>(sum / (2.0 * static_cast<double>(n))) : 0.0f;
    return BRAID_OK;
  }
  *loss = static_cast<float>(braid::nn::contrastive_local_mean_forward(problem, st));
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_contrastive_backward(const braid_tensor* local_image, const braid_tensor* local_text,
                                                  const braid_tensor* all_image, const braid_tensor* all_text,
                                                  float logit_scale, const braid_contrastive_options* options,
                                                  const braid_tensor* stats, float grad_loss,
                                                  braid_tensor* grad_local_image, braid_tensor* grad_local_text,
                                                  braid_tensor* grad_all_image, braid_tensor* grad_all_text,
                                                  float* grad_logit_scale, void* stream) {
  BRAID_API_BEGIN  // CPU tensors: synchronous, the stream unused
      braid_contrastive_options opts = BRAID_CONTRASTIVE_OPTIONS_INIT;
  if (options)
    BRAID_READ_OPTIONS(options, braid_contrastive_options, kOptionsVersions, BRAID_CONTRASTIVE_OPTIONS_VERSION,
                       BRAID_CONTRASTIVE_OPTIONS_INIT, &opts);
  const auto problem = read_problem(__func__, local_image, local_text, all_image, all_text, logit_scale, opts);
  const int64_t n = problem.local_image.rows;
  const braid_device device = local_image->device;
  const int64_t total = problem.all_image.rows, e = problem.local_image.cols;
  const braid::nn::ContrastiveGradViews grads{
      optional_grad(__func__, "grad_local_image", grad_local_image, device, n, e, "local_image"),
      optional_grad(__func__, "grad_local_text", grad_local_text, device, n, e, "local_text"),
      optional_grad(__func__, "grad_all_image", grad_all_image, device, total, e, "all_image"),
      optional_grad(__func__, "grad_all_text", grad_all_text, device, total, e, "all_text")};
  const auto st = read_stats(__func__, stats, n, device);
  expect_apart(__func__,
               {extent(grads.local_image, "grad_local_image"), extent(grads.local_text, "grad_local_text"),
                extent(grads.all_image, "grad_all_image"), extent(grads.all_text, "grad_all_text")},
               {extent(problem.local_image, "local_image"), extent(problem.local_text, "local_text"),
                extent(problem.all_image, "all_image"), extent(problem.all_text, "all_text"),
                extent(RowsView<const float>{st.image_to_text, 2, n, st.text_to_image - st.image_to_text}, "stats")});
  // open_clip's local mean: the gradient of grad_loss * sum / 2n.
  const double weight = n > 0 ? grad_loss / (2.0 * static_cast<double>(n)) : 0.0;
  const double d_scale = device.type == BRAID_DEVICE_CUDA
                             ? braid::capi::cuda_contrastive_backward(problem, st, weight, grads, device.index, stream)
                             : braid::nn::contrastive_local_mean_backward(problem, st, grad_loss, grads);
  if (grad_logit_scale) *grad_logit_scale = static_cast<float>(d_scale);
  return BRAID_OK;
  BRAID_API_END
}

}  // extern "C"
