#include "core/train/token_store.hpp"

#include <string>

#include "core/common/error.hpp"

namespace braid::train {

void TokenStore::reset(std::vector<std::vector<std::int64_t>> floats) {
  floats_ = std::move(floats);
  tokens_.assign(floats_.size(), {});
  grads_.assign(floats_.size(), {});
  for (std::size_t i = 0; i < floats_.size(); ++i) {
    tokens_[i].assign(floats_[i].size(), {});
    grads_[i].assign(floats_[i].size(), {});
  }
}

std::vector<float>& TokenStore::at(Rows& rows, int microbatch, std::size_t q) {
  if (microbatch < 0 || microbatch >= microbatches() || q >= samples(microbatch))
    throw Error(Status::internal,
                "token store: no sample " + std::to_string(q) + " in microbatch " + std::to_string(microbatch));
  return rows[static_cast<std::size_t>(microbatch)][q];
}

bool TokenStore::has(int microbatch, std::span<const std::size_t> positions, bool grads) const {
  const auto& rows = (grads ? grads_ : tokens_)[static_cast<std::size_t>(microbatch)];
  for (std::size_t q : positions)
    if (rows[q].empty()) return false;
  return true;
}

HostBuffer TokenStore::pack(int microbatch, std::span<const std::size_t> positions, bool grads) const {
  const auto& rows = (grads ? grads_ : tokens_)[static_cast<std::size_t>(microbatch)];
  HostBuffer out;
  for (std::size_t q : positions) {
    if (rows[q].empty())
      throw Error(Status::internal, std::string("token store: the ") + (grads ? "gradient" : "tokens") + " of sample " +
                                        std::to_string(q) + " of microbatch " + std::to_string(microbatch) +
                                        " are not there yet");
    out.insert(out.end(), rows[q].begin(), rows[q].end());
  }
  return out;
}

std::vector<float> TokenStore::buffer(int microbatch, std::span<const std::size_t> positions) const {
  std::int64_t n = 0;
  for (std::size_t q : positions) n += floats_[static_cast<std::size_t>(microbatch)][q];
  return std::vector<float>(static_cast<std::size_t>(n));
}

void TokenStore::unpack(int microbatch, std::span<const std::size_t> positions, const std::vector<float>& message,
                        bool grads) {
  auto& rows = (grads ? grads_ : tokens_)[static_cast<std::size_t>(microbatch)];
  const std::size_t expected = buffer(microbatch, positions).size();
  if (expected != message.size())
    throw Error(Status::internal, "token store: a message of " + std::to_string(message.size()) + " floats for " +
                                      std::to_string(expected));
  std::size_t at = 0;
  for (std::size_t q : positions) {
    const auto n = static_cast<std::size_t>(floats_[static_cast<std::size_t>(microbatch)][q]);
    rows[q].assign(message.begin() + static_cast<std::ptrdiff_t>(at),
                   message.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
}

}  // namespace braid::train
