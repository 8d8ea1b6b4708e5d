// Calibration: braid's predicted throughput for published Megatron-LM runs, each
// evaluated as published (its TP, PP and settings), against the published figure.
//  - the ten GPT runs of Megatron-LM's SC'21 weak-scaling table on A100 (TFLOP/s per GPU);
//  - seven Megatron-Core runs of NeMo 24.07's DGX-H100 FP8 table (tokens/s per GPU);
//  - five Megatron-Core GPT-3 175B runs of NVIDIA/dgxc-benchmarking on DGX-H100, BF16 (tokens/s per GPU).
// Goal: every row within +-10%. The tables are printed.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/orchestrate/planning.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

// The data rows of a published.csv (comment lines and the header skipped), as cells.
std::vector<std::vector<std::string>> csv_rows(const std::string& path) {
  std::ifstream in(test::source_path(path));
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (header) {
      header = false;
      continue;
    }
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    rows.push_back(std::move(f));
  }
  return rows;
}

struct Row {
  std::string params, run;
  int tp, pp, gpus;
  double published;
};

std::vector<Row> published_rows() {
  std::vector<Row> rows;
  for (const auto& f : csv_rows("configs/runs/megatron-sc21/published.csv")) {
    std::string p = f[0];
    if (p.find('.') != std::string::npos) {  // 1.7 -> 1.7, 1008.0 -> 1008
      while (p.back() == '0') p.pop_back();
      if (p.back() == '.') p.pop_back();
    }
    rows.push_back({f[0], "megatron-sc21/gpt-" + p + "b.yaml", std::stoi(f[4]), std::stoi(f[5]), std::stoi(f[6]),
                    std::stod(f[8])});
  }
  return rows;
}

TEST(Calibration, MegatronSc21WeakScalingWithin10Percent) {
  auto rows = published_rows();
  ASSERT_EQ(rows.size(), 10u);
  std::printf("\n  %-9s %4s %4s %6s %10s %10s %8s\n", "params(B)", "tp", "pp", "gpus", "published", "predicted",
              "error");
  double worst = 0;
  for (const auto& r : rows) {
    auto run = test::load(r.run);
    ASSERT_EQ(run.devices(), r.gpus) << r.run;
    cost::CostModel cost(run);
    auto result = orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::megatron, {r.tp, r.pp, 0}, {}});
    double predicted = result.best.estimate.tflops_per_device;
    double error = predicted / r.published - 1;
    worst = std::max(worst, std::abs(error));
    std::printf("  %-9s %4d %4d %6d %10.1f %10.1f %+7.1f%%\n", r.params.c_str(), r.tp, r.pp, r.gpus, r.published,
                predicted, 100 * error);
    EXPECT_LE(std::abs(error), 0.10) << r.run << ": predicted " << predicted << " TFLOP/s, published " << r.published;
  }
  std::printf("  worst error %.1f%% (TFLOP/s per GPU, recomputation included, as the paper counts)\n\n", 100 * worst);
}

struct H100Row {
  std::string model, run;
  int gpus, tp, pp, vp, seq;
  double tokens, model_tflops;  // published per GPU
};

// The rows of one of configs/runs/megatron-core-h100's CSVs (same columns); each row's run file is
// <model>-<gpus>gpu<suffix>.yaml.
std::vector<H100Row> h100_rows(const std::string& csv, const std::string& suffix) {
  std::vector<H100Row> rows;
  for (const auto& f : csv_rows("configs/runs/megatron-core-h100/" + csv)) {
    rows.push_back({f[0], "megatron-core-h100/" + f[0] + "-" + f[1] + "gpu" + suffix + ".yaml", std::stoi(f[1]),
                    std::stoi(f[5]), std::stoi(f[6]), std::stoi(f[8]), std::stoi(f[4]), std::stod(f[9]),
                    std::stod(f[10])});
  }
  return rows;
}

// Compared on tokens/s per GPU, the quantity NeMo measures; the model TFLOP/s column is
// printed as published next to braid's tokens scaled by the source's own FLOPs per token.
void check_h100(const std::vector<H100Row>& rows, bool fp8) {
  std::printf("\n  %-10s %5s %3s %3s %3s %11s %11s %8s %12s\n", "model", "gpus", "tp", "pp", "vp", "published",
              "predicted", "error", "model TFLOP/s");
  double worst = 0;
  for (const auto& r : rows) {
    auto run = test::load(r.run);
    ASSERT_EQ(run.devices(), r.gpus) << r.run;
    ASSERT_EQ(run.training.virtual_stages, r.vp) << r.run;
    ASSERT_EQ(run.training.fp8, fp8) << r.run;
    cost::CostModel cost(run);
    auto result = orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::megatron, {r.tp, r.pp, 0}, {}});
    const double predicted = result.best.estimate.samples_per_s * r.seq / r.gpus;
    const double error = predicted / r.tokens - 1;
    worst = std::max(worst, std::abs(error));
    std::printf("  %-10s %5d %3d %3d %3d %11.0f %11.0f %+7.1f%% %5.0f / %4.0f\n", r.model.c_str(), r.gpus, r.tp, r.pp,
                r.vp, r.tokens, predicted, 100 * error, r.model_tflops, r.model_tflops * predicted / r.tokens);
    EXPECT_LE(std::abs(error), 0.10) << r.run << ": predicted " << predicted << " tokens/s/GPU, published " << r.tokens;
  }
  std::printf(
      "  worst error %.1f%% (tokens/s per GPU; model TFLOP/s published / braid at the source's FLOPs per token)\n\n",
      100 * worst);
}

// NeMo 24.07's DGX-H100 table, FP8 (configs/runs/megatron-core-h100/published.csv).
TEST(Calibration, MegatronCoreH100Within10Percent) {
  auto rows = h100_rows("published.csv", "");
  ASSERT_EQ(rows.size(), 7u);
  check_h100(rows, true);
}

// NVIDIA/dgxc-benchmarking's GPT-3 175B, NeMo 24.12, DGX-H100, BF16
// (configs/runs/megatron-core-h100/published-bf16.csv).
TEST(Calibration, MegatronCoreH100Bf16Within10Percent) {
  auto rows = h100_rows("published-bf16.csv", "-bf16");
  ASSERT_EQ(rows.size(), 5u);
  check_h100(rows, false);
}

}  // namespace
}  // namespace braid
