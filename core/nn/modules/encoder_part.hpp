// Which part of a CLIP encoder (image or text) a pipeline stage runs, and the even split of
// an encoder's blocks into stages: the decoder's rule (split_decoder), worded for encoders.
#pragma once

#include <string>
#include <vector>

#include "core/nn/tensor.hpp"

namespace braid::nn {

// Blocks [first, last) of an encoder for one pipeline stage; the part with first == 0 also
// embeds (patches + position tables / tokens + positions), the one with last == layers also
// applies the final norm and the pooling.
struct EncoderPart {
  int first = 0, last = 0;
};

// The parts of an even split into `stages` (earlier stages get the extra block); throws
// Error(invalid_argument) when stages < 1 or > layers.
std::vector<EncoderPart> split_encoder(int layers, int stages);

// Throws Error(invalid_argument) naming `module` unless 0 <= first <= last <= layers.
void check_encoder_part(const EncoderPart& part, int layers, const std::string& module);
// Throws Error(invalid_argument) unless `cache_part` (the part whose forward filled a cache)
// is `part`.
void check_encoder_cache(const EncoderPart& part, const EncoderPart& cache_part, const std::string& module);
// A part that does not pool takes the gradient of its output hidden in `d_tokens` and no
// `d_pooled`; throws Error(invalid_argument) naming `module` otherwise.
void check_middle_part_gradients(const EncoderPart& part, const std::string& module, const Tensor* d_tokens,
                                 const Tensor* d_pooled);

}  // namespace braid::nn
