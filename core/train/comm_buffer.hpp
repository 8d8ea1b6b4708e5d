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

// A collective's buffer of `elements` floats, counted in `counter` while it lives.
struct CommBuffer {
  CommBuffer(std::size_t elements, std::size_t& counter) : data(elements, 0.0f), in_flight(counter) {
    in_flight += data.size() * sizeof(float);
  }
  ~CommBuffer() { in_flight -= data.size() * sizeof(float); }
  CommBuffer(const CommBuffer&) = delete;
  CommBuffer& operator=(const CommBuffer&) = delete;
  std::vector<float> data;
  std::size_t& in_flight;
};

}  // namespace braid::train
