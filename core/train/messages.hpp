// Point-to-point traffic of the executor: message tags, and non-blocking sends whose
// buffers stay alive until they complete (the step's end waits for those still out).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/common/error.hpp"
#include "core/common/host_buffer.hpp"
#include "core/runtime/communicator.hpp"

namespace braid::train {

// Tags must stay in 0..32767 on every backend: 8 kinds x 256 microbatches x 16 groups.
inline constexpr int kMaxMicrobatches = 256;
inline constexpr int kMaxGroups = 16;  // image sides in one microbatch
enum class Message {
  encoder_tokens = 0,       // MLLM: encoder -> llm stage 0
  encoder_token_grads = 1,  // MLLM: llm stage 0 -> encoder
  llm_hidden = 2,
  llm_hidden_grads = 3,
  image_hidden = 4,  // CLIP tower pipelines
  text_hidden = 5,
  image_hidden_grads = 6,
  text_hidden_grads = 7,
};
// Error(unsupported) past those bounds: tags of other messages would collide.
inline int message_tag(Message kind, int microbatch, int group = 0) {
  if (microbatch < 0 || microbatch >= kMaxMicrobatches || group < 0 || group >= kMaxGroups)
    throw Error(Status::unsupported, "the CPU trainer's messages tag at most " + std::to_string(kMaxMicrobatches) +
                                         " microbatches per replica and " + std::to_string(kMaxGroups) +
                                         " image sides per microbatch (microbatch " + std::to_string(microbatch) +
                                         ", group " + std::to_string(group) + ")");
  return (static_cast<int>(kind) * kMaxMicrobatches + microbatch) * kMaxGroups + group;
}

class PendingSends {
 public:
  // Posts the send after freeing the buffers of earlier sends that completed: a pipeline
  // stage's copies of the activations its peer already took do not pile up until the step's
  // end (GPipe's first stage sent every microbatch's before it waited for any).
  void isend(runtime::Communicator& comm, HostBuffer data, int peer, int tag) {
    release_completed();
    auto buffer = std::make_unique<HostBuffer>(std::move(data));
    runtime::Request request = comm.isend(std::as_bytes(std::span<const float>(*buffer)), peer, tag);
    sends_.push_back({std::move(buffer), std::move(request)});
  }
  // Frees the buffers of the sends that completed (tested, not waited for). Every send is
  // tested before any moves, so a test that throws leaves the list as it was.
  void release_completed() {
    std::vector<bool> done;
    for (Send& s : sends_) done.push_back(s.request.test());
    std::size_t kept = 0;
    for (std::size_t i = 0; i < sends_.size(); ++i)
      if (!done[i]) {
        if (kept != i) sends_[kept] = std::move(sends_[i]);
        ++kept;
      }
    sends_.resize(kept);
  }
  // Bytes of the sends posted and not yet seen complete (their buffers are alive until then).
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const Send& s : sends_) n += s.buffer->size() * sizeof(float);
    return n;
  }
  // Waits for every send; returns the seconds blocked.
  double wait_all() {
    double waited = 0;
    for (Send& s : sends_) waited += s.request.wait();
    sends_.clear();
    return waited;
  }

 private:
  struct Send {
    std::unique_ptr<HostBuffer> buffer;
    runtime::Request request;  // declared after: dropped unfinished, it waits before its buffer goes
  };
  std::vector<Send> sends_;
};

}  // namespace braid::train
