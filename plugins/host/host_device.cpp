// libbraid-host.so: the host backend behind the device interface v2 (the ggml way: the
// same interface as the CUDA backend), so the whole device path — loading, memory,
// streams, op dispatch and memory accounting — runs and is tested on machines without a
// GPU. Its device memory is host memory, its ops are braid's host ops (OpenBLAS + threads)
// on borrowed views, and a stream runs its work in the calling thread as it is issued, so
// events are complete once recorded. BRAID_HOST_THREADS sets the ops' thread count.
// BRAID_HOST_MEMORY=separate makes it report its memory as not host memory, so braid treats
// it as a GPU's (an "emulated" device): every host access to it is an error and every copy
// goes through the backend, which tests the GPU's data path on a machine without one.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "braid_device_v2.h"
#include "core/common/error.hpp"
#include "core/nn/contrastive_tiled.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/op_shapes.hpp"

#define BRAID_PLUGIN_EXPORT __attribute__((visibility("default")))

struct braid_device_stream_s {
  int32_t device;
};
struct braid_device_event_s {
  int32_t device;
};

namespace {

using braid::nn::Device;
using braid::nn::Shape;
using braid::nn::Storage;
using braid::nn::Tensor;

constexpr std::size_t kAlignment = 64;  // a cache line; AVX-512 loads

int fail(char* error, size_t size, const std::string& message) {
  if (error && size) std::snprintf(error, size, "%s", message.c_str());
  return 1;
}

// A caching pool: freed blocks are kept by size and handed out again, so a training
// step allocates nothing from the system once the first step has run. Each block starts
// with a header (a magic number, its size and the bytes asked for) one alignment unit
// before the pointer handed out, and the free lists keep their capacity: after warm-up
// neither alloc nor free touches the heap. Every block's pointer is kept in a sorted list
// (it grows only with the blocks), so a free of any other pointer is refused unread.
class Pool {
 public:
  void* allocate(std::size_t bytes) {
    // The block, its header's unit and the rounding must fit in a size_t.
    if (bytes > std::numeric_limits<std::size_t>::max() - 2 * kAlignment) throw std::bad_alloc();
    const std::size_t rounded = round_up(bytes);
    std::lock_guard lock(mutex_);
    void* p = nullptr;
    if (auto& free = cached_[rounded]; !free.empty()) {
      p = free.back();
      free.pop_back();
    } else {
      auto* block = static_cast<char*>(std::aligned_alloc(kAlignment, rounded + kAlignment));
      if (!block) throw std::bad_alloc();
      p = block + kAlignment;
      blocks_.insert(std::upper_bound(blocks_.begin(), blocks_.end(), p, std::less<>()), p);
      header_of(p)->size = rounded;
      stats_.reserved += rounded + kAlignment;  // the header's alignment unit too
    }
    header_of(p)->magic = kMagic;
    header_of(p)->requested = bytes;
    ++stats_.allocations;
    stats_.in_use += bytes;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    return p;
  }

  // False for a pointer this pool did not hand out, or handed out and already took back.
  bool release(void* p) {
    std::lock_guard lock(mutex_);
    if (!std::binary_search(blocks_.begin(), blocks_.end(), p, std::less<>())) return false;
    Header* header = header_of(p);
    if (header->magic != kMagic) return false;
    header->magic = kFreed;
    stats_.in_use -= header->requested;
    cached_[header->size].push_back(p);
    return true;
  }

  braid_device_memory_stats_v2 stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  // Returns the cached blocks to the system. Blocks still handed out stay counted and can
  // still be freed (into the cache).
  void clear() {
    std::lock_guard lock(mutex_);
    for (auto& [size, free] : cached_) {
      for (void* p : free) {
        blocks_.erase(std::lower_bound(blocks_.begin(), blocks_.end(), p, std::less<>()));
        stats_.reserved -= size + kAlignment;
        std::free(header_of(p));
      }
    }
    cached_.clear();
    stats_.allocations = 0;
    stats_.peak_in_use = stats_.in_use;
  }

 private:
  struct Header {
    std::uint64_t magic, size, requested;
  };
  static_assert(sizeof(Header) <= kAlignment);
  static constexpr std::uint64_t kMagic = 0x62726169642d686fULL;  // "braid-ho": in use
  static constexpr std::uint64_t kFreed = 0x62726169642d6672ULL;  // "braid-fr": in the cache

  static Header* header_of(void* p) { return reinterpret_cast<Header*>(static_cast<char*>(p) - kAlignment); }
  static std::size_t round_up(std::size_t bytes) {
    return std::max<std::size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  }
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> cached_;
  std::vector<void*> blocks_;  // every block from the system, sorted
  braid_device_memory_stats_v2 stats_{};
};

Pool& pool() {
  static Pool p;
  return p;
}

// Threads from BRAID_HOST_THREADS (braid train sets it to its --threads), else one per
// hardware thread: several processes on one host must not each take every core.
braid::nn::HostOps& host_ops() {
  static braid::nn::HostOps ops([] {
    const char* env = std::getenv("BRAID_HOST_THREADS");
    return env ? std::atoi(env) : 0;
  }());
  return ops;
}

// BRAID_HOST_MEMORY: "shared" (the default) or "separate", read when the properties are
// asked (a DeviceBackend asks when it opens), so one process may open both kinds.
bool separate_memory() {
  const char* env = std::getenv("BRAID_HOST_MEMORY");
  return env && std::strcmp(env, "separate") == 0;
}

int check_device(int32_t device, char* error, size_t size) {
  return device == 0 ? 0 : fail(error, size, "host backend: no device " + std::to_string(device) + " (it has one, 0)");
}

// The interface's code for a caller's mistake, with a message naming the entry and argument.
int refuse(char* error, size_t size, const std::string& message) {
  fail(error, size, "host backend: " + message);
  return BRAID_DEVICE_INVALID_ARGUMENT;
}

// ---- memory, streams, events ----

// Each loaded copy of the plugin (one per DevicePlugin) inits and finalizes; they share the
// pool, which is emptied when the last one goes.
std::mutex users_mutex;
int users = 0;

int init(char* error, size_t size) {
  const char* memory = std::getenv("BRAID_HOST_MEMORY");
  if (memory && std::strcmp(memory, "shared") != 0 && std::strcmp(memory, "separate") != 0)
    return fail(error, size,
                std::string("host backend: BRAID_HOST_MEMORY must be shared or separate, got '") + memory + "'");
  std::lock_guard lock(users_mutex);
  ++users;
  return 0;
}

int device_count(int32_t* count, char* error, size_t size) {
  if (!count) return refuse(error, size, "device_count: count is NULL");
  *count = 1;
  return 0;
}

int device_properties(int32_t device, braid_device_properties_v2* out, char* error, size_t size) {
  if (int rc = check_device(device, error, size)) return rc;
  if (!out || out->struct_size < sizeof(braid_device_properties_v2))
    return fail(error, size, "host backend: properties struct_size too small");
  const int threads = host_ops().threads();
  std::snprintf(out->name, sizeof out->name, "host (%d thread%s)", threads, threads == 1 ? "" : "s");
  out->memory_bytes = 0;  // whatever the process may take
  out->multiprocessors = host_ops().threads();
  out->compute_major = out->compute_minor = 0;
  out->pci_bus_id = -1;
  out->host_memory = separate_memory() ? 0 : 1;
  return 0;
}

int self_test(int32_t device, char* error, size_t size) {
  if (int rc = check_device(device, error, size)) return rc;
  try {
    Tensor x({2, 3}, {1, 2, 3, 4, 5, 6}), w({1, 3}, {1, 1, 1}), y;
    host_ops().linear_forward(x, w, nullptr, y);
    if (y.data[0] != 6.0f || y.data[1] != 15.0f) return fail(error, size, "host backend: linear self-test is wrong");
  } catch (const std::exception& e) {
    return fail(error, size, std::string("host backend: self-test: ") + e.what());
  }
  return 0;
}

int alloc(int32_t device, size_t bytes, braid_device_stream_v2, void** ptr, char* error, size_t size) {
  if (int rc = check_device(device, error, size)) return rc;
  if (!ptr) return refuse(error, size, "alloc: ptr is NULL");
  try {
    *ptr = pool().allocate(bytes);
  } catch (const std::bad_alloc&) {
    return fail(error, size, "host backend: out of memory allocating " + std::to_string(bytes) + " bytes");
  }
  return 0;
}

int release(int32_t device, void* ptr, braid_device_stream_v2, char* error, size_t size) {
  if (int rc = check_device(device, error, size)) return rc;
  try {
    if (ptr && !pool().release(ptr))
      return fail(error, size, "host backend: free of a pointer it did not allocate (or freed already)");
  } catch (const std::bad_alloc&) {  // the free list could not grow: the block stays allocated
    return fail(error, size, "host backend: out of memory keeping a freed block");
  }
  return 0;
}

int memory_stats(int32_t device, braid_device_memory_stats_v2* out, char* error, size_t size) {
  if (int rc = check_device(device, error, size)) return rc;
  if (!out || out->struct_size < sizeof(braid_device_memory_stats_v2))
    return fail(error, size, "host backend: memory stats struct_size too small");
  braid_device_memory_stats_v2 s = pool().stats();
  s.struct_size = out->struct_size;
  *out = s;
  return 0;
}

int copy(void* dst, const void* src, size_t bytes, int32_t kind, braid_device_stream_v2, char* error, size_t size) {
  if (kind < BRAID_COPY_HOST_TO_DEVICE || kind > BRAID_COPY_DEVICE_TO_DEVICE)
    return fail(error, size, "host backend: unknown copy kind " + std::to_string(kind));
  if (bytes && (!dst || !src)) return refuse(error, size, std::string("copy: ") + (dst ? "src" : "dst") + " is NULL");
  if (bytes) std::memmove(dst, src, bytes);
  return 0;
}

int memset_zero(void* dst, size_t bytes, braid_device_stream_v2, char* error, size_t size) {
  if (bytes && !dst) return refuse(error, size, "memset_zero: dst is NULL");
  if (bytes) std::memset(dst, 0, bytes);
  return 0;
}

int stream_create(int32_t device, braid_device_stream_v2* stream, char* error, size_t size) {
  if (int rc = check_device(device, error, size)) return rc;
  if (!stream) return refuse(error, size, "stream_create: stream is NULL");
  *stream = new (std::nothrow) braid_device_stream_s{device};
  return *stream ? 0 : fail(error, size, "host backend: out of memory");
}
int stream_destroy(braid_device_stream_v2 stream, char*, size_t) {
  delete stream;
  return 0;
}
int stream_wrap(int32_t device, void*, braid_device_stream_v2* stream, char* error, size_t size) {
  return stream_create(device, stream, error, size);  // host work has no native stream to order on
}
int stream_synchronize(braid_device_stream_v2, char*, size_t) { return 0; }
int event_create(int32_t device, braid_device_event_v2* event, char* error, size_t size) {
  if (int rc = check_device(device, error, size)) return rc;
  if (!event) return refuse(error, size, "event_create: event is NULL");
  *event = new (std::nothrow) braid_device_event_s{device};
  return *event ? 0 : fail(error, size, "host backend: out of memory");
}
int event_destroy(braid_device_event_v2 event, char*, size_t) {
  delete event;
  return 0;
}
int event_record(braid_device_event_v2, braid_device_stream_v2, char*, size_t) { return 0; }
int stream_wait_event(braid_device_stream_v2, braid_device_event_v2, char*, size_t) { return 0; }
int event_synchronize(braid_device_event_v2, char*, size_t) { return 0; }

// ---- ops: views in, host ops on borrowed tensors ----

// A view as a tensor borrowing its memory. Inputs are borrowed through a const_cast: the
// host ops take them by const reference and never write them.
Tensor view(const braid_device_tensor_v2* t, const char* op, const char* what) {
  if (!t) throw std::invalid_argument(std::string(op) + ": " + what + " is null");
  if (t->dtype != BRAID_DEVICE_F32) throw std::invalid_argument(std::string(op) + ": " + what + " must be F32");
  if (t->rank < 0 || t->rank > BRAID_DEVICE_MAX_RANK)
    throw std::invalid_argument(std::string(op) + ": " + what + " has rank " + std::to_string(t->rank));
  Tensor out;
  out.shape.assign(t->shape, t->shape + t->rank);
  out.data = Storage::borrow(static_cast<float*>(t->data), static_cast<std::size_t>(braid::nn::shape_numel(out.shape)),
                             Device{});
  return out;
}

std::span<const int32_t> ids_view(const braid_device_tensor_v2* t, const char* op, const char* what) {
  if (!t || t->dtype != BRAID_DEVICE_I32 || t->rank != 1 || t->shape[0] < 0 || (!t->data && t->shape[0] > 0))
    throw std::invalid_argument(std::string(op) + ": " + what + " must be an I32 vector with its memory");
  return {static_cast<const int32_t*>(t->data), static_cast<std::size_t>(t->shape[0])};
}

// Where an op writes a number for the host: it must be given.
template <class T>
void host_result(T* out, const char* op, const char* what) {
  if (!out) throw std::invalid_argument(std::string(op) + ": " + what + " is null");
}

Shape shape_of(const braid_device_tensor_v2* t) {
  return Shape(t->shape, t->shape + std::clamp(t->rank, 0, BRAID_DEVICE_MAX_RANK));
}

// An output the op would write over (or add into) must be its input's shape, checked before
// the op runs: one refused must leave every output as it was.
void expect_like(const braid_device_tensor_v2* out, const braid_device_tensor_v2* like, const char* op,
                 const char* what, const char* like_what) {
  if (!out || !like) return;
  if (shape_of(out) != shape_of(like))
    throw std::invalid_argument(std::string(op) + ": " + what + " has shape " + braid::nn::shape_string(shape_of(out)) +
                                " but " + like_what + " is " + braid::nn::shape_string(shape_of(like)));
}

// The same for an output whose shape the op derives (op_shapes.hpp): an output of the right
// size but another shape was written, then refused.
void expect_shape(const braid_device_tensor_v2* out, const Shape& want, const char* op, const char* what) {
  if (out && shape_of(out) != want)
    throw std::invalid_argument(std::string(op) + ": " + what + " has shape " + braid::nn::shape_string(shape_of(out)) +
                                " but " + braid::nn::shape_string(want) + " is expected");
}

// A bias gradient: one value per output feature, the weight's rows.
void expect_bias(const braid_device_tensor_v2* db, const braid_device_tensor_v2* w, const char* op) {
  if (!db || !w || w->rank < 1) return;
  if (db->rank != 1 || db->shape[0] != w->shape[0])
    throw std::invalid_argument(std::string(op) + ": dbias must be (" + std::to_string(w->shape[0]) +
                                ",), one value per row of the weight");
}

// An optional output: a view, or nothing for a null pointer.
struct Optional {
  Tensor tensor;
  bool given = false;
  Tensor* get() { return given ? &tensor : nullptr; }
};
Optional optional_view(const braid_device_tensor_v2* t, const char* op, const char* what) {
  if (!t) return {};
  return {view(t, op, what), true};
}

// An output the host op wrote: it must still be the caller's memory, in the caller's shape.
void settle(const Tensor& t, const braid_device_tensor_v2* v, const char* op, const char* what) {
  if (!v) return;
  const Shape expected(v->shape, v->shape + v->rank);
  if (t.shape != expected)
    throw std::invalid_argument(std::string(op) + ": " + what + " has shape " + braid::nn::shape_string(expected) +
                                " but " + braid::nn::shape_string(t.shape) + " is expected");
  if (t.numel() > 0 && t.data.data() != v->data)
    throw std::logic_error(std::string(op) + ": the host op replaced the memory of " + what);
}

// Runs an op, turning what it throws into the interface's codes: the caller's mistakes
// (braid's invalid_argument, std::invalid_argument) are BRAID_DEVICE_INVALID_ARGUMENT.
template <typename F>
int guarded(char* error, size_t size, F&& body) {
  try {
    body();
    return 0;
  } catch (const braid::Error& e) {
    fail(error, size, e.what());
    return e.status() == braid::Status::invalid_argument ? BRAID_DEVICE_INVALID_ARGUMENT : 2;
  } catch (const std::invalid_argument& e) {
    fail(error, size, e.what());
    return BRAID_DEVICE_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    fail(error, size, e.what());
    return 2;
  }
}

int linear_forward(braid_ds, const braid_dt* x, const braid_dt* w, const braid_dt* b, braid_dt* y, char* e, size_t n) {
  return guarded(e, n, [&] {
    if (x && w && x->rank >= 1 && w->rank == 2)
      expect_shape(y, braid::nn::linear_output_shape(shape_of(x), shape_of(w)), "linear_forward", "y");
    auto bias = optional_view(b, "linear_forward", "bias");
    Tensor out = view(y, "linear_forward", "y");
    host_ops().linear_forward(view(x, "linear_forward", "x"), view(w, "linear_forward", "weight"), bias.get(), out);
    settle(out, y, "linear_forward", "y");
  });
}

int linear_backward(braid_ds, const braid_dt* x, const braid_dt* w, const braid_dt* dy, braid_dt* dx, braid_dt* dw,
                    braid_dt* db, char* e, size_t n) {
  return guarded(e, n, [&] {
    expect_like(dx, x, "linear_backward", "dx", "x");
    expect_like(dw, w, "linear_backward", "dweight", "weight");
    expect_bias(db, w, "linear_backward");
    auto gx = optional_view(dx, "linear_backward", "dx");
    auto gw = optional_view(dw, "linear_backward", "dweight");
    auto gb = optional_view(db, "linear_backward", "dbias");
    host_ops().linear_backward(view(x, "linear_backward", "x"), view(w, "linear_backward", "weight"),
                               view(dy, "linear_backward", "dy"), gx.get(), gw.get(), gb.get());
    settle(gx.tensor, dx, "linear_backward", "dx");
  });
}

int layernorm_forward(braid_ds, const braid_dt* x, const braid_dt* gamma, const braid_dt* beta, float eps, braid_dt* y,
                      braid_dt* mean, braid_dt* rstd, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "layernorm_forward";
    expect_like(y, x, op, "y", "x");
    if (x) {
      expect_shape(mean, braid::nn::layernorm_stats_shape(shape_of(x)), op, "mean");
      expect_shape(rstd, braid::nn::layernorm_stats_shape(shape_of(x)), op, "rstd");
    }
    Tensor out = view(y, op, "y");
    braid::nn::LayerNormSaved saved{view(mean, op, "mean"), view(rstd, op, "rstd")};
    host_ops().layernorm_forward(view(x, op, "x"), view(gamma, op, "gamma"), view(beta, op, "beta"), eps, out, saved);
    settle(out, y, op, "y");
    settle(saved.mean, mean, op, "mean");
    settle(saved.rstd, rstd, op, "rstd");
  });
}

int layernorm_backward(braid_ds, const braid_dt* x, const braid_dt* gamma, const braid_dt* mean, const braid_dt* rstd,
                       const braid_dt* dy, braid_dt* dx, braid_dt* dgamma, braid_dt* dbeta, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "layernorm_backward";
    const braid::nn::LayerNormSaved saved{view(mean, op, "mean"), view(rstd, op, "rstd")};
    expect_like(dx, x, op, "dx", "x");
    expect_like(dgamma, gamma, op, "dgamma", "gamma");
    expect_like(dbeta, gamma, op, "dbeta", "gamma");
    auto gx = optional_view(dx, op, "dx");
    auto gg = optional_view(dgamma, op, "dgamma");
    auto gb = optional_view(dbeta, op, "dbeta");
    host_ops().layernorm_backward(view(x, op, "x"), view(gamma, op, "gamma"), saved, view(dy, op, "dy"), gx.get(),
                                  gg.get(), gb.get());
    settle(gx.tensor, dx, op, "dx");
  });
}

int l2_normalize_forward(braid_ds, const braid_dt* x, braid_dt* y, char* e, size_t n) {
  return guarded(e, n, [&] {
    expect_like(y, x, "l2_normalize_forward", "y", "x");
    Tensor out = view(y, "l2_normalize_forward", "y");
    host_ops().l2_normalize_forward(view(x, "l2_normalize_forward", "x"), out);
    settle(out, y, "l2_normalize_forward", "y");
  });
}

int l2_normalize_backward(braid_ds, const braid_dt* x, const braid_dt* dy, braid_dt* dx, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "l2_normalize_backward";
    expect_like(dx, x, op, "dx", "x");
    Tensor out = view(dx, op, "dx");
    host_ops().l2_normalize_backward(view(x, op, "x"), view(dy, op, "dy"), out);
    settle(out, dx, op, "dx");
  });
}

int add(braid_ds, braid_dt* y, const braid_dt* x, char* e, size_t n) {
  return guarded(e, n, [&] {
    Tensor out = view(y, "add", "y");
    host_ops().add(out, view(x, "add", "x"));
  });
}

int gelu_forward(braid_ds, const braid_dt* x, braid_dt* y, char* e, size_t n) {
  return guarded(e, n, [&] {
    expect_like(y, x, "gelu_forward", "y", "x");
    Tensor out = view(y, "gelu_forward", "y");
    host_ops().gelu_forward(view(x, "gelu_forward", "x"), out);
    settle(out, y, "gelu_forward", "y");
  });
}

int gelu_backward(braid_ds, const braid_dt* x, const braid_dt* dy, braid_dt* dx, char* e, size_t n) {
  return guarded(e, n, [&] {
    expect_like(dx, x, "gelu_backward", "dx", "x");
    Tensor out = view(dx, "gelu_backward", "dx");
    host_ops().gelu_backward(view(x, "gelu_backward", "x"), view(dy, "gelu_backward", "dy"), out);
    settle(out, dx, "gelu_backward", "dx");
  });
}

int attention_saved_shape(const braid_dt* q, const braid_dt* k, int64_t heads, int32_t, braid_dt* saved, char* e,
                          size_t n) {
  return guarded(e, n, [&] {
    if (!q || !k || !saved || q->rank != 3 || k->rank != 3 || heads <= 0)
      throw std::invalid_argument("attention_saved_shape: q and k must be (B, S, H*D) and heads positive");
    if (q->shape[2] % heads != 0)
      throw std::invalid_argument("attention_saved_shape: " + std::to_string(heads) +
                                  " heads do not divide the width " + std::to_string(q->shape[2]));
    saved->dtype = BRAID_DEVICE_F32;
    saved->rank = 4;
    const int64_t shape[4] = {q->shape[0], heads, q->shape[1], k->shape[1]};
    std::copy(shape, shape + 4, saved->shape);
  });
}

int attention_forward(braid_ds, const braid_dt* q, const braid_dt* k, const braid_dt* v, int64_t heads, int32_t causal,
                      braid_dt* out, braid_dt* saved, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "attention_forward";
    expect_like(out, q, op, "out", "q");
    if (q && k && q->rank == 3 && k->rank == 3)
      expect_shape(saved, {q->shape[0], heads, q->shape[1], k->shape[1]}, op, "saved");
    Tensor o = view(out, op, "out");
    braid::nn::AttentionSaved s{view(saved, op, "saved")};
    host_ops().attention_forward(view(q, op, "q"), view(k, op, "k"), view(v, op, "v"), {heads, causal != 0}, o, s);
    settle(o, out, op, "out");
    settle(s.probs, saved, op, "saved");
  });
}

int attention_backward(braid_ds, const braid_dt* q, const braid_dt* k, const braid_dt* v, int64_t heads, int32_t causal,
                       const braid_dt* saved, const braid_dt* dout, braid_dt* dq, braid_dt* dk, braid_dt* dv, char* e,
                       size_t n) {
  return guarded(e, n, [&] {
    const char* op = "attention_backward";
    expect_like(dq, q, op, "dq", "q");
    expect_like(dk, k, op, "dk", "k");
    expect_like(dv, v, op, "dv", "v");
    Tensor gq = view(dq, op, "dq"), gk = view(dk, op, "dk"), gv = view(dv, op, "dv");
    const braid::nn::AttentionSaved s{view(saved, op, "saved")};
    host_ops().attention_backward(view(q, op, "q"), view(k, op, "k"), view(v, op, "v"), {heads, causal != 0}, s,
                                  view(dout, op, "dout"), gq, gk, gv);
    settle(gq, dq, op, "dq");
    settle(gk, dk, op, "dk");
    settle(gv, dv, op, "dv");
  });
}

int embedding_forward(braid_ds, const braid_dt* table, const braid_dt* ids, braid_dt* out, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "embedding_forward";
    if (table && ids && table->rank == 2 && ids->rank == 1)
      expect_shape(out, braid::nn::embedding_output_shape(ids->shape[0], shape_of(table)), op, "out");
    Tensor o = view(out, op, "out");
    host_ops().embedding_forward(view(table, op, "table"), ids_view(ids, op, "ids"), o);
    settle(o, out, op, "out");
  });
}

int embedding_backward(braid_ds, const braid_dt* ids, const braid_dt* dout, braid_dt* dtable, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "embedding_backward";
    Tensor t = view(dtable, op, "dtable");
    host_ops().embedding_backward(ids_view(ids, op, "ids"), view(dout, op, "dout"), t);
  });
}

int patch_embedding_forward(braid_ds, const braid_dt* image, int64_t patch, const braid_dt* w, const braid_dt* b,
                            braid_dt* out, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "patch_embedding_forward";
    if (image && w && (image->rank == 3 || image->rank == 4) && patch > 0 && w->rank == 2)
      expect_shape(out, braid::nn::patch_embedding_output_shape(shape_of(image), patch, shape_of(w)), op, "out");
    auto bias = optional_view(b, op, "bias");
    Tensor o = view(out, op, "out");
    host_ops().patch_embedding_forward(view(image, op, "image"), patch, view(w, op, "weight"), bias.get(), o);
    settle(o, out, op, "out");
  });
}

int patch_embedding_backward(braid_ds, const braid_dt* image, int64_t patch, const braid_dt* w, const braid_dt* dout,
                             braid_dt* dimage, braid_dt* dw, braid_dt* db, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "patch_embedding_backward";
    expect_like(dimage, image, op, "dimage", "image");
    expect_like(dw, w, op, "dweight", "weight");
    expect_bias(db, w, op);
    auto gi = optional_view(dimage, op, "dimage");
    auto gw = optional_view(dw, op, "dweight");
    auto gb = optional_view(db, op, "dbias");
    host_ops().patch_embedding_backward(view(image, op, "image"), patch, view(w, op, "weight"), view(dout, op, "dout"),
                                        gi.get(), gw.get(), gb.get());
    settle(gi.tensor, dimage, op, "dimage");
  });
}

int cross_entropy(braid_ds, const braid_dt* logits, const braid_dt* targets, int64_t normalizer, braid_dt* dlogits,
                  float* loss, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "cross_entropy";
    host_result(loss, op, "loss");
    expect_like(dlogits, logits, op, "dlogits", "logits");
    auto g = optional_view(dlogits, op, "dlogits");
    *loss = host_ops().cross_entropy(view(logits, op, "logits"), ids_view(targets, op, "targets"), normalizer, g.get());
    settle(g.tensor, dlogits, op, "dlogits");
  });
}

// A dense view as the tiled kernel's rows (n, E); a null view is an empty one.
template <class T>
braid::nn::RowsView<T> rows(const braid_device_tensor_v2* t, const char* op, const char* what) {
  if (!t) return {};
  if (t->dtype != BRAID_DEVICE_F32 || t->rank != 2)
    throw std::invalid_argument(std::string(op) + ": " + what + " must be F32 (rows, E)");
  return {static_cast<T*>(t->data), t->shape[0], t->shape[1], t->shape[1]};
}

braid::nn::ContrastiveProblem contrastive_problem(const braid_dt* li, const braid_dt* lt, const braid_dt* ai,
                                                  const braid_dt* at, int64_t row_offset, float scale, int64_t tile,
                                                  const char* op) {
  braid::nn::ContrastiveProblem p;
  p.local_image = rows<const float>(li, op, "local_image");
  p.local_text = rows<const float>(lt, op, "local_text");
  p.all_image = rows<const float>(ai, op, "all_image");
  p.all_text = rows<const float>(at, op, "all_text");
  p.row_offset = row_offset;
  p.logit_scale = scale;
  p.tile = tile;
  p.threads = host_ops().threads();
  braid::nn::check_contrastive_problem(p);
  return p;
}

braid::nn::ContrastiveStats contrastive_stats(const braid_dt* stats, int64_t n, const char* op) {
  const Tensor s = view(stats, op, "stats");
  if (s.shape != Shape{2, n})
    throw std::invalid_argument(std::string(op) + ": stats has shape " + braid::nn::shape_string(s.shape) +
                                " but (2, " + std::to_string(n) + ") is expected");
  float* data = static_cast<float*>(stats->data);
  return {data, data + n};
}

int contrastive_forward(braid_ds, const braid_dt* li, const braid_dt* lt, const braid_dt* ai, const braid_dt* at,
                        int64_t row_offset, float scale, int64_t tile, braid_dt* stats, double* sum, char* e,
                        size_t n) {
  return guarded(e, n, [&] {
    const char* op = "contrastive_forward";
    host_result(sum, op, "sum");
    const auto p = contrastive_problem(li, lt, ai, at, row_offset, scale, tile, op);
    *sum = braid::nn::contrastive_tiled_forward(p, contrastive_stats(stats, p.local_image.rows, op));
  });
}

int contrastive_backward(braid_ds, const braid_dt* li, const braid_dt* lt, const braid_dt* ai, const braid_dt* at,
                         int64_t row_offset, float scale, int64_t tile, const braid_dt* stats, double weight,
                         braid_dt* dli, braid_dt* dlt, braid_dt* dai, braid_dt* dat, double* d_scale, char* e,
                         size_t n) {
  return guarded(e, n, [&] {
    const char* op = "contrastive_backward";
    host_result(d_scale, op, "d_scale");
    const auto p = contrastive_problem(li, lt, ai, at, row_offset, scale, tile, op);
    const braid::nn::ContrastiveGradViews grads{
        rows<float>(dli, op, "d_local_image"), rows<float>(dlt, op, "d_local_text"),
        rows<float>(dai, op, "d_all_image"), rows<float>(dat, op, "d_all_text")};
    *d_scale =
        braid::nn::contrastive_tiled_backward(p, contrastive_stats(stats, p.local_image.rows, op), weight, grads);
  });
}

int contrastive_loss(braid_ds, const braid_dt* li, const braid_dt* lt, const braid_dt* ai, const braid_dt* at,
                     int64_t row_offset, float scale, int64_t tile, braid_dt* stats, double weight, double* sum,
                     braid_dt* dli, braid_dt* dlt, braid_dt* dai, braid_dt* dat, double* d_scale, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "contrastive_loss";
    host_result(sum, op, "sum");
    const auto p = contrastive_problem(li, lt, ai, at, row_offset, scale, tile, op);
    contrastive_stats(stats, p.local_image.rows, op);  // checked: the fused kernel keeps its own
    const braid::nn::ContrastiveGradViews grads{
        rows<float>(dli, op, "d_local_image"), rows<float>(dlt, op, "d_local_text"),
        rows<float>(dai, op, "d_all_image"), rows<float>(dat, op, "d_all_text")};
    *sum = braid::nn::contrastive_tiled_loss(p, weight, grads, d_scale);
  });
}

int adamw_step(braid_ds, braid_dt* param, const braid_dt* grad, braid_dt* m, braid_dt* v, int64_t step,
               const braid_adamw_config_v2* c, char* e, size_t n) {
  return guarded(e, n, [&] {
    const char* op = "adamw_step";
    if (step < 1 || !c) throw std::invalid_argument("adamw_step: step must be at least 1 and config given");
    Tensor p = view(param, op, "param");
    braid::nn::AdamWState state{view(m, op, "m"), view(v, op, "v"), step - 1};
    host_ops().adamw_step(p, view(grad, op, "grad"), state, {c->lr, c->beta1, c->beta2, c->eps, c->weight_decay});
  });
}

int squared_norm(braid_ds, const braid_dt* t, double* result, char* e, size_t n) {
  return guarded(e, n, [&] {
    host_result(result, "squared_norm", "result");
    *result = host_ops().squared_norm(view(t, "squared_norm", "t"));
  });
}

int scale(braid_ds, braid_dt* t, float factor, char* e, size_t n) {
  return guarded(e, n, [&] {
    Tensor x = view(t, "scale", "t");
    host_ops().scale(x, factor);
  });
}

int supports(int32_t op) { return op >= 0 && op < BRAID_OP_COUNT_V2 ? 1 : 0; }

void finalize() {
  std::lock_guard lock(users_mutex);
  if (users > 0 && --users == 0) pool().clear();
}

const braid_device_ops_v2 kOps = {linear_forward,
                                  linear_backward,
                                  layernorm_forward,
                                  layernorm_backward,
                                  l2_normalize_forward,
                                  l2_normalize_backward,
                                  add,
                                  gelu_forward,
                                  gelu_backward,
                                  attention_forward,
                                  attention_backward,
                                  embedding_forward,
                                  embedding_backward,
                                  patch_embedding_forward,
                                  patch_embedding_backward,
                                  cross_entropy,
                                  contrastive_forward,
                                  contrastive_backward,
                                  contrastive_loss,
                                  adamw_step,
                                  squared_norm,
                                  scale};

}  // namespace

extern "C" BRAID_PLUGIN_EXPORT const braid_device_plugin_v2 braidDevicePlugin_v2 = {2,
                                                                                    "host",
                                                                                    init,
                                                                                    device_count,
                                                                                    device_properties,
                                                                                    self_test,
                                                                                    alloc,
                                                                                    release,
                                                                                    memory_stats,
                                                                                    copy,
                                                                                    memset_zero,
                                                                                    stream_create,
                                                                                    stream_destroy,
                                                                                    stream_wrap,
                                                                                    stream_synchronize,
                                                                                    event_create,
                                                                                    event_destroy,
                                                                                    event_record,
                                                                                    stream_wait_event,
                                                                                    event_synchronize,
                                                                                    supports,
                                                                                    attention_saved_shape,
                                                                                    &kOps,
                                                                                    finalize};
