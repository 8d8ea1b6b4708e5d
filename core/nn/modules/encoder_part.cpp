#include "core/nn/modules/encoder_part.hpp"

#include <string>

#include "core/common/error.hpp"
#include "core/nn/modules/decoder.hpp"

namespace braid::nn {

namespace {
std::string range(const EncoderPart& part) {
  return "[" + std::to_string(part.first) + ", " + std::to_string(part.last) + ")";
}
}  // namespace

std::vector<EncoderPart> split_encoder(int layers, int stages) {
  // Checked here so that the message names encoders; the split itself is the decoder's.
  if (stages < 1)
    throw Error(Status::invalid_argument,
                "split_encoder: needs at least one pipeline stage, got " + std::to_string(stages));
  if (stages > layers)
    throw Error(Status::invalid_argument, "split_encoder: " + std::to_string(stages) + " pipeline stages do not fit " +
                                              std::to_string(layers) +
                                              " encoder layers (each stage needs at least one block)");
  std::vector<EncoderPart> parts;
  for (const DecoderPart& p : split_decoder(layers, stages)) parts.push_back({p.first, p.last});
  return parts;
}

void check_encoder_part(const EncoderPart& part, int layers, const std::string& module) {
  if (part.first < 0 || part.first > part.last || part.last > layers)
    throw Error(Status::invalid_argument,
                module + ": part " + range(part) + " is not a range of its " + std::to_string(layers) + " blocks");
}

void check_encoder_cache(const EncoderPart& part, const EncoderPart& cache_part, const std::string& module) {
  if (part.first != cache_part.first || part.last != cache_part.last)
    throw Error(Status::invalid_argument,
                module + ": the backward of part " + range(part) + " got the cache of part " + range(cache_part));
}

void check_middle_part_gradients(const EncoderPart& part, const std::string& module, const Tensor* d_tokens,
                                 const Tensor* d_pooled) {
  if (d_pooled || !d_tokens)
    throw Error(Status::invalid_argument, module + ": part [" + std::to_string(part.first) + ", " +
                                              std::to_string(part.last) +
                                              ") does not pool: its backward takes the gradient of its output "
                                              "hidden in d_tokens, and no d_pooled");
}

}  // namespace braid::nn
