// Optimus' published bubble-exploitation shares (Feng et al., ATC'25, arXiv 2408.03505),
// ViT-22B + GPT-175B at global batch 1536: the share its coarse and fine passes exploit,
// per GPU count. Printed beside braid's own figures (Report::encoder_hidden), never used
// to compute anything. Taken from a secondary note of the paper: the metric's exact
// definition is not quoted here (docs/bubble-scheduler.md says what braid compares).
#pragma once

#include <optional>
#include <string>

namespace braid::bubble {

struct PublishedShare {
  int gpus = 0;
  int microbatches = 0;  // per pipeline, as published
  double coarse = 0, fine = 0;
};

inline constexpr PublishedShare kOptimusPublished[] = {
    {1536, 32, 0.343, 0.575},
    {2048, 24, 0.458, 0.693},
    {3072, 16, 0.687, 0.850},
};

// The published row for a run of model `model` (its name) on `gpus` devices at global
// batch `global_batch`, when the paper has one.
inline std::optional<PublishedShare> optimus_published(const std::string& model, int gpus, long long global_batch) {
  if (model != "vit22b-gpt175b" || global_batch != 1536) return std::nullopt;
  for (const auto& p : kOptimusPublished)
    if (p.gpus == gpus) return p;
  return std::nullopt;
}

}  // namespace braid::bubble
