#include "core/train/as_trained.hpp"

namespace braid::train {
namespace {

const char* on_off(bool b) { return b ? "true" : "false"; }

}  // namespace

AsTrained as_trained(const spec::RunSpec& run) {
  AsTrained t{run, {}};
  spec::TrainingSpec& training = t.run.training;
  auto set = [&](const char* field, std::string trained, std::string written) {
    if (trained != written) t.changed.push_back(std::string(field) + " " + trained + " (the run says " + written + ")");
  };
  set("precision", spec::precision_name(spec::Precision::fp32), spec::precision_name(training.precision));
  training.precision = spec::Precision::fp32;
  set("attention", spec::attention_name(spec::Attention::standard), spec::attention_name(training.attention));
  training.attention = spec::Attention::standard;
  for (auto [field, value] :
       {std::pair{"overlap_grad_reduce", &training.overlap_grad_reduce},
        std::pair{"overlap_param_gather", &training.overlap_param_gather},
        std::pair{"tp_comm_overlap", &training.tp_comm_overlap}, std::pair{"fp8", &training.fp8}}) {
    set(field, on_off(false), on_off(*value));
    *value = false;
  }
  return t;
}

}  // namespace braid::train
