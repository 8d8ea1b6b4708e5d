// The host buffers braid's own data-parallel collectives copy gradients and weights through,
// counted for the memory meter's communication kind while they live (the cost model's
// counterpart: cost::CostModel::collective_buffer_bytes).
#pragma once

#include <cstddef>
#include <vector>

namespace braid::train {

class MemoryMeter;

// What a module's collectives report their buffers to: the bytes alive, and the meter to
// sample once a buffer is filled (null: none), before its collective is posted, so that the
// communication library's own buffers are not taken for activations.
struct CommBytes {
  std::size_t in_flight = 0;
  MemoryMeter* meter = nullptr;
  void sample() const;  // a sample of meter's, if any
};

// `bytes` counted in `counter` while it lives: a buffer held elsewhere (on a device).
struct CountedBytes {
  CountedBytes(std::size_t bytes, std::size_t& counter) : bytes(bytes), counter(counter) { counter += bytes; }
  ~CountedBytes() { counter -= bytes; }
  CountedBytes(const CountedBytes&) = delete;
  CountedBytes& operator=(const CountedBytes&) = delete;
  std::size_t bytes;
  std::size_t& counter;
};

// A collective's host buffer of `elements` floats, counted in `counter` while it lives.
struct CommBuffer {
  CommBuffer(std::size_t elements, std::size_t& counter)
      : data(elements, 0.0f), counted(elements * sizeof(float), counter) {}
  std::vector<float> data;
  CountedBytes counted;
};

}  // namespace braid::train
