// braid calibrate's fits: the alpha-beta fit recovers the latency and bandwidth behind
// timings the cost model's own formulas made, and a cluster file written from timings
// prices the measured cases as they were measured once the cost model reads it back.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <tuple>

#include "core/calibrate/cluster_file.hpp"
#include "core/cost/comm.hpp"
#include "core/cost/cost_model.hpp"
#include "core/cost/device.hpp"
#include "core/cost/transformer.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/orchestrate/program.hpp"
#include "core/sim/simulator.hpp"
#include "core/spec/cluster.hpp"
#include "core/train/layout.hpp"
#include "core/train/trainer.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using calibrate::LinkOp;
using calibrate::LinkTiming;

spec::ClusterSpec one_link(double bandwidth, double latency) {
  spec::ClusterSpec c;
  c.devices_per_node = 64;
  c.intra_node = spec::LinkSpec{bandwidth, latency, 1, 0};
  c.inter_node = spec::LinkSpec{bandwidth / 10, latency * 5, 1, 1};
  return c;
}

std::vector<LinkTiming> timings_of(const spec::ClusterSpec& c, int members) {
  const cost::CommModel comm(c);
  const cost::GroupShape g{members, members, 1};
  std::vector<LinkTiming> t;
  for (double bytes = 8; bytes <= 4e6; bytes *= 8) {
    t.push_back({LinkOp::p2p, 2, bytes, comm.p2p(bytes, false)});
    t.push_back({LinkOp::all_reduce, members, bytes, comm.all_reduce(bytes, g)});
    t.push_back({LinkOp::all_gather, members, bytes, comm.all_gather(bytes, g)});
  }
  return t;
}

TEST(Calibrate, LinkFitRecoversTheAlphaBetaBehindTheTimings) {
  for (int members : {2, 4}) {
    const auto points = timings_of(one_link(3e9, 2e-6), members);
    const calibrate::LinkFit f = calibrate::fit_link(points, false);
    EXPECT_NEAR(f.bandwidth / 3e9, 1, 0.06) << members << " members";
    EXPECT_NEAR(f.latency / 2e-6, 1, 0.06) << members << " members";
    EXPECT_LT(f.worst_error, 0.06);
    EXPECT_EQ(f.points, static_cast<int>(points.size()));
    EXPECT_EQ(f.reduce_bandwidth, 0) << "no summing step in these timings";
  }
}

TEST(Calibrate, LinkFitFindsTheAllReducesSumming) {
  // All-reduces that sum after their transfer, as MPI does on a host: the transfers fix the
  // link, the all-reduces the reduce bandwidth, and the cluster prices them as measured.
  spec::ClusterSpec link = one_link(3e9, 2e-6);
  link.intra_node.reduce_bandwidth = 1.5e9;
  const auto points = timings_of(link, 4);
  const calibrate::LinkFit f = calibrate::fit_link(points, false);
  EXPECT_NEAR(f.bandwidth / 3e9, 1, 0.06);
  EXPECT_NEAR(f.reduce_bandwidth / 1.5e9, 1, 0.06);
  EXPECT_LT(f.worst_error, 0.06);
  const cost::CommModel comm(link);
  const cost::GroupShape g{4, 4, 1};
  EXPECT_NEAR(comm.all_reduce(1 << 20, g) - comm.all_gather(1 << 20, g) * 2, 0.75 * (1 << 20) / 1.5e9, 1e-9);
  EXPECT_NEAR(comm.reduce_scatter(1 << 20, g) - comm.all_gather(1 << 20, g), 0.75 * (1 << 20) / 1.5e9, 1e-12);
}

TEST(Calibrate, LinkFitTakesTheSummingFromTheAllReducesBandwidthBinds) {
  // braid calibrate's link timings on 2 processes of a 2-core host (2026-11-30, seconds),
  // 8 B to 2 MiB: its small all-reduces stray from the alpha-beta line (4 KiB at 3x), and
  // fitted over them the summing was dropped, pricing 2 MiB at 0.6x its time.
  const std::vector<double> bytes = {8, 64, 512, 4096, 32768, 262144, 2097152};
  const std::vector<double> p2p = {9.45e-7, 1.053e-6, 1.703e-6, 5.627e-6, 8.842e-6, 3.185e-5, 2.226e-4};
  const std::vector<double> all_reduce = {1.987e-6, 2.101e-6, 2.927e-6, 1.233e-5, 2.308e-5, 8.755e-5, 6.074e-4};
  const std::vector<double> all_gather = {1.358e-6, 1.459e-6, 1.508e-6, 2.494e-6, 9.886e-6, 2.023e-5, 2.414e-4};
  std::vector<LinkTiming> points;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    points.push_back({LinkOp::p2p, 2, bytes[i], p2p[i]});
    points.push_back({LinkOp::all_reduce, 2, bytes[i], all_reduce[i]});
    points.push_back({LinkOp::all_gather, 2, i == 0 ? 16 : bytes[i], all_gather[i]});
  }
  calibrate::LinkFit f = calibrate::fit_link(points, false);
  ASSERT_GT(f.reduce_bandwidth, 0);
  EXPECT_EQ(f.reduce_points, 2);  // 256 KiB and 2 MiB
  spec::ClusterSpec c = one_link(f.bandwidth, f.latency);
  c.intra_node.reduce_bandwidth = f.reduce_bandwidth;
  const cost::CommModel comm(c);
  for (std::size_t i = 5; i < bytes.size(); ++i)  // the bandwidth-bound ones, within 15%
    EXPECT_NEAR(comm.all_reduce(bytes[i], {2, 2, 1}) / all_reduce[i], 1, 0.15) << bytes[i] << " B";
  // All-reduces of 4 KiB and less are latency-bound here: nothing to fit it on, and the fit
  // says so.
  std::erase_if(points, [](const LinkTiming& p) { return p.op == LinkOp::all_reduce && p.bytes > 4096; });
  f = calibrate::fit_link(points, false);
  EXPECT_EQ(f.reduce_points, 0);
  EXPECT_EQ(f.reduce_bandwidth, 0);
}

TEST(Calibrate, LinkFitReportsHowFarTheWorstPointIs) {
  auto points = timings_of(one_link(3e9, 2e-6), 4);
  points[4].seconds *= 10;  // one all-reduce far slower than the rest say
  const calibrate::LinkFit f = calibrate::fit_link(points, false);
  // Measured / model, not model / measured (which stays below 1 however slow the point).
  EXPECT_GT(f.worst_error, 3.0);
}

// Timings of a made-up machine: GEMMs at efficiencies that grow with size, element-wise
// kernels at rates that fall with size, attention, links.
calibrate::Calibration made_up() {
  calibrate::Calibration c;
  c.host = "testhost";
  c.cpu = "Test CPU";
  c.when_utc = "2026-01-01T00:00:00Z";
  c.communication = "mpi plugin (test)";
  c.processes = 2;
  c.per_node = 2;
  c.cores = 4;
  c.per_turn = 2;
  c.memory_per_process_bytes = 8.0 * (1 << 30);
  c.reserved_bytes = 20.0 * (1 << 20);
  const double peak = 80e9;
  for (double w : {16.0, 64.0, 256.0}) {
    const double work = 6 * 256 * w * w, eff = 0.2 + 0.8 * w / 256;
    c.gemms.push_back({"gemm", work, work / (peak * eff)});
  }
  for (double n : {4096.0, 65536.0, 1048576.0}) {  // backwards slower per byte than forwards
    const double work = 16 * n, rate = 6e9 - 1e3 * n;
    const std::string size = " " + std::to_string(static_cast<long>(n)) + " floats";  // named as measured
    c.elementwise.push_back({calibrate::kElementwiseForward + size, work, work / rate});
    c.elementwise.push_back({calibrate::kElementwiseBackward + size, 2 * work, 2 * work / (0.6 * rate)});
    c.elementwise.push_back({calibrate::kOptimizerStep + size, 2 * work, 2 * work / (1.5 * rate)});
    c.elementwise.push_back({calibrate::kStreamingAdd + size, 12 * n, 12 * n / (4 * rate)});
  }
  c.memory = {"triad", 3 * 4 * 1e8, 3 * 4 * 1e8 / 15e9};
  // Two shapes (s16 d16 and s512 d64), per head of a sample, efficiency rising with size.
  for (const auto& [flops, forward, backward] : {std::tuple{16384.0, 0.2, 0.5}, {67108864.0, 0.6, 0.8}}) {
    c.attention.push_back({"attention forward", flops, flops / (forward * peak)});
    c.attention.push_back({"attention backward", 2.5 * flops, 2.5 * flops / (backward * peak)});
  }
  c.intra = timings_of(one_link(2e9, 1e-6), 2);
  for (int side : {16, 32, 64}) {  // 3 us + 5 ns a pixel
    const double pixels = double(side) * side;
    c.samples.push_back(
        {std::string(calibrate::kRenderSample) + " " + std::to_string(side), pixels, 3e-6 + 5e-9 * pixels});
  }
  c.samples.push_back({calibrate::kDescribeSample, 1, 1e-6});
  c.probe_shape = {1024, 128};
  c.probe_seconds = 1.25e-3;
  return c;
}

TEST(Calibrate, TheClusterFilePricesTheMeasuredCasesAsMeasured) {
  const calibrate::Calibration c = made_up();
  const calibrate::Fitted f = calibrate::fit(c);
  EXPECT_DOUBLE_EQ(f.peak_flops, 80e9);
  const std::string yaml = calibrate::cluster_yaml(c, f, "made-up");
  EXPECT_NE(yaml.find("# Measured by `braid calibrate` on testhost at 2026-01-01T00:00:00Z"), std::string::npos);
  const spec::ClusterSpec cluster = spec::parse_cluster(spec::parse_document(yaml, "<calibrated>"));
  EXPECT_EQ(cluster.name, "made-up");
  EXPECT_EQ(cluster.devices_per_node, 2);
  // The probe braid train repeats, as timed.
  EXPECT_EQ(cluster.probe.rows, 1024);
  EXPECT_EQ(cluster.probe.width, 128);
  EXPECT_DOUBLE_EQ(cluster.probe.seconds, 1.25e-3);
  std::string bad = yaml;
  bad.replace(bad.find("seconds: 0.00125"), 16, "seconds: 0");
  test::expect_error([&] { spec::parse_cluster(spec::parse_document(bad, "<calibrated>")); }, Status::bad_config,
                     {"<calibrated>:", "probe.seconds: must be positive"});
  // A probe braid train could not allocate (it died with std::bad_alloc) is named at its field.
  for (const auto& [shape, message] : std::vector<std::pair<std::string, std::string>>{
           {"rows: 100000000, width: 100000", "probe.rows: rows x width is past 2^26 floats (100000000 x 100000)"},
           {"rows: 1, width: 100000", "probe.width: a 100000 x 100000 weight is past 2^26 floats"}}) {
    bad = yaml;
    bad.replace(bad.find("rows: 1024, width: 128"), 22, shape);
    test::expect_error([&] { spec::parse_cluster(spec::parse_document(bad, "<calibrated>")); }, Status::bad_config,
                       {"<calibrated>:", message});
  }
  // A measured attention of one pass alone would be dropped unsaid: refused at the one given.
  bad = yaml;
  const std::size_t backward = bad.find("  attention_backward:\n");
  std::size_t end = backward + std::string("  attention_backward:\n").size();
  while (bad.compare(end, 6, "    - ") == 0) end = bad.find('\n', end) + 1;
  bad.erase(backward, end - backward);
  test::expect_error([&] { spec::parse_cluster(spec::parse_document(bad, "<calibrated>")); }, Status::bad_config,
                     {"<calibrated>:", "efficiency.attention_forward: needs attention_backward too"});
  const cost::DeviceModel device(cluster, spec::Precision::bf16);
  // Each GEMM case is three GEMMs of rows x width x width (the linear op's forward and backward).
  for (std::size_t i = 0; i < c.gemms.size(); ++i) {
    const double w = std::sqrt(c.gemms[i].work / 6 / 256);
    EXPECT_NEAR(3 * device.gemm_seconds(256, w, w) / c.gemms[i].seconds, 1, 0.01) << "width " << w;
  }
  // An element-wise case is layer norm and GELU one way: two kernels whose bytes, as the cost
  // model counts them, sum to the case's work at the case's rate; a backward call (charged
  // twice its forward's bytes) at the backward cases' rate.
  for (const auto& t : c.elementwise) {
    if (t.what.rfind(calibrate::kOptimizerStep, 0) == 0) {  // an optimizer step of that many bytes, as measured
      EXPECT_NEAR(device.optimizer_memory_seconds(t.work) / t.seconds, 1, 0.01);
      continue;
    }
    if (t.what.rfind(calibrate::kStreamingAdd, 0) == 0) {  // a residual add over n floats: 12 n bytes
      EXPECT_NEAR(device.streaming_seconds(t.work) / t.seconds, 1, 0.01) << t.what;
      continue;
    }
    const bool backward = t.what.rfind(calibrate::kElementwiseBackward, 0) == 0;
    const double call_bytes = t.work / 2;  // a norm's or GELU's call: 8 n bytes forward, 16 n backward
    const double seconds = backward ? device.backward_memory_seconds(call_bytes) : device.memory_seconds(call_bytes);
    EXPECT_NEAR(call_bytes / seconds / (t.work / t.seconds), 1, 0.01) << t.what;
  }
  // Each shape at its own time, forward and backward, per head of a call of 64 heads (as
  // calibrate's quick cases run them: one head alone would take less than a kernel's launch).
  for (const auto& t : c.attention)
    EXPECT_NEAR(
        device.flash_attention_seconds(64 * t.work, t.what.find("backward") != std::string::npos, 64) / t.seconds, 64,
        64e-4)
        << t.what << " " << t.work;
  const cost::CommModel comm(cluster);
  for (const auto& t : c.intra) {
    if (t.op != LinkOp::p2p) continue;
    EXPECT_NEAR(comm.p2p(t.bytes, false) / t.seconds, 1, 0.1) << t.bytes << " bytes";
  }
}

TEST(Calibrate, AllReducesAfterComputeAddWhatTheyTookBeyondTheirPrice) {
  // Back-to-back timings fix the link; all-reduces timed after 1 and 16 ms of compute took
  // their price + fixed + factor x price (this host after 16 ms: about +150 us and +50%).
  const spec::ClusterSpec link = one_link(3e9, 2e-6);
  auto points = timings_of(link, 2);
  const std::size_t back_to_back = points.size();
  const cost::CommModel comm(link);
  const std::vector<spec::LinkSpec::AfterCompute> truth = {{1e-3, 40e-6, 0}, {16e-3, 150e-6, 0.5}};
  for (const auto& row : truth)
    for (double bytes : {4096.0, 32768.0, 262144.0, 2097152.0}) {
      const double price = comm.all_reduce(bytes, {2, 2, 1});
      points.push_back({LinkOp::all_reduce, 2, bytes, price + row.fixed + row.factor * price, row.gap});
    }
  const calibrate::LinkFit f = calibrate::fit_link(points, false);
  EXPECT_NEAR(f.bandwidth / 3e9, 1, 0.06) << "the back-to-back timings alone fix the link";
  EXPECT_LT(f.worst_error, 0.06);
  EXPECT_EQ(f.points, static_cast<int>(back_to_back));
  ASSERT_EQ(f.after_compute.size(), truth.size());
  for (std::size_t i = 0; i < truth.size(); ++i) {
    EXPECT_DOUBLE_EQ(f.after_compute[i].gap, truth[i].gap);
    EXPECT_NEAR(f.after_compute[i].fixed, truth[i].fixed, 0.1 * truth[i].fixed) << truth[i].gap;
    EXPECT_NEAR(f.after_compute[i].factor, truth[i].factor, 0.06) << truth[i].gap;
  }
  // Written to the cluster file and read back, they price a 2 MiB all-reduce after 16 ms as timed.
  calibrate::Calibration c = made_up();
  c.intra = points;
  const std::string yaml = calibrate::cluster_yaml(c, calibrate::fit(c), "made-up");
  const spec::ClusterSpec cluster = spec::parse_cluster(spec::parse_document(yaml, "<calibrated>"));
  ASSERT_EQ(cluster.intra_node.after_compute.size(), 2u);
  ASSERT_EQ(cluster.inter_node.after_compute.size(), 2u) << "one host: the intra-host figures between hosts";
  const double price = cost::CommModel(cluster).all_reduce(2097152, {2, 2, 1});
  EXPECT_NEAR(cluster.intra_node.after_compute_seconds(price, 16e-3) / points.back().seconds, 1, 0.1);
  EXPECT_EQ(cluster.intra_node.after_compute_seconds(price, 0), price);
  // Rows out of order are named at their field.
  std::string bad = yaml;
  bad.replace(bad.find("      - [16,"), 12, "      - [0.5,");
  test::expect_error([&] { spec::parse_cluster(spec::parse_document(bad, "<calibrated>")); }, Status::bad_config,
                     {"<calibrated>:", "after_compute rows must be sorted by increasing gap"});
}

TEST(Calibrate, TheFileSaysWhatWasMeasured) {
  calibrate::Calibration c = made_up();
  // A name from the command line with a line break and a tab reads back as given.
  const std::string name = "two\nlines\tand \"quotes\"";
  const std::string yaml = calibrate::cluster_yaml(c, calibrate::fit(c), name);
  EXPECT_EQ(spec::parse_cluster(spec::parse_document(yaml, "<calibrated>")).name, name);
  EXPECT_NE(yaml.find("between\n    # processes on one host"), std::string::npos);
  // One process per host: the links within a host were never measured, and the file says so.
  c.nodes = 2;
  c.per_node = 1;
  c.processes = 2;
  c.inter = c.intra;
  const std::string hosts = calibrate::cluster_yaml(c, calibrate::fit(c), "two-hosts");
  EXPECT_NE(hosts.find("Not measured (one process per host): the fit between hosts below."), std::string::npos);
  EXPECT_EQ(hosts.find("processes on one host"), std::string::npos);
}

TEST(Calibrate, SamplesArePricedAtTheMeasuredRatesWhenNoCoreIsLeftForTheWorkers) {
  const calibrate::Calibration c = made_up();
  const calibrate::Fitted f = calibrate::fit(c);
  EXPECT_NEAR(f.render_sample_s, 3e-6, 1e-9);
  EXPECT_NEAR(f.render_pixel_s, 5e-9, 1e-12);
  EXPECT_DOUBLE_EQ(f.describe_sample_s, 1e-6);
  spec::RunSpec run = test::load("tiny-clip.yaml");
  run.cluster = spec::parse_cluster(spec::parse_document(calibrate::cluster_yaml(c, f, "made-up"), "<calibrated>"));
  const cost::CostModel cost(run);
  // Two rendered (16 and 32 px) and three described.
  EXPECT_NEAR(cost.data_seconds({16, 32}, 3), 2 * 3e-6 + 5e-9 * (256 + 1024) + 3e-6, 1e-10);
  // Made in the step's time, the samples delay their rank's first instruction, and its step.
  const plan::Plan plan =
      orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::megatron, plan::Constraints{1, 1, 2}, {}}).best;
  pipeline::Program program = orchestrate::build_program(cost, plan);
  const double without = sim::simulate(program).step_time_s;
  program.stages[0].data_s.assign(static_cast<std::size_t>(program.stages[0].replicas), 0.0);
  program.stages[0].data_s[1] = 2e-3;  // the second replica's samples
  EXPECT_NEAR(sim::simulate(program).step_time_s - without, 2e-3, 1e-3);
  EXPECT_GE(sim::simulate(program).step_time_s, without + 2e-3 - 1e-9);
  // A file without the section prices samples at nothing.
  spec::RunSpec unmeasured = test::load("tiny-clip.yaml");
  const cost::CostModel free_samples(unmeasured);
  EXPECT_EQ(free_samples.data_seconds({32, 32}, 10), 0);
}

TEST(Calibrate, BackwardsArePricedAtTheirOwnElementwiseRate) {
  const calibrate::Calibration c = made_up();
  const std::string yaml = calibrate::cluster_yaml(c, calibrate::fit(c), "made-up");
  spec::ClusterSpec measured = spec::parse_cluster(spec::parse_document(yaml, "<calibrated>"));
  ASSERT_EQ(measured.efficiency.elementwise_backward.size(), 3u);
  // A layer's backward takes longer on the backward table (0.6x the forward's rate) than on
  // the forward one, and its forward is the same either way.
  spec::RunSpec run = test::load("tiny-clip.yaml"), before = run;  // the model keeps a pointer
  run.cluster = before.cluster = measured;
  before.cluster.efficiency.elementwise_backward.clear();  // a file from before: one table
  const cost::CostModel apart(run), together(before);
  const cost::ModuleCost& a = apart.module(0, 1, 8);
  const cost::ModuleCost& t = together.module(0, 1, 8);
  EXPECT_DOUBLE_EQ(a.layer.forward_s, t.layer.forward_s);
  EXPECT_GT(a.layer.backward_s, t.layer.backward_s);
  const cost::DeviceModel one_table(before.cluster, spec::Precision::fp32);
  EXPECT_DOUBLE_EQ(one_table.backward_memory_seconds(1 << 20), one_table.memory_seconds(1 << 20));
  // The optimizer's own table prices its step (32 bytes a float32 parameter); without it, the
  // element-wise one does.
  const cost::DeviceModel measured_device(run.cluster, spec::Precision::fp32);
  EXPECT_DOUBLE_EQ(apart.optimizer_seconds(0, 1e6, 1), measured_device.optimizer_memory_seconds(32e6));
  spec::RunSpec no_optimizer = run;
  no_optimizer.cluster.efficiency.optimizer.clear();
  const cost::CostModel elementwise_priced(no_optimizer);
  EXPECT_LT(apart.optimizer_seconds(0, 1e6, 1), elementwise_priced.optimizer_seconds(0, 1e6, 1));
  // Residual adds at the measured streaming rate: the attention half's norm + residual kernel
  // holds the add at that rate where the file from before holds it at the triad's (the norm
  // is priced on the element-wise table either way).
  const double rows = apart.tokens(0) * 8, width = run.model.modules[0].hidden;
  const double residual_bytes = 3 * rows * width * apart.element_bytes();  // two arrays read, one written
  spec::RunSpec triad = run;
  triad.cluster.efficiency.streaming.clear();
  const cost::CostModel triad_priced(triad);
  const auto norm_and_add = [](const cost::CostModel& m) { return m.layer_kernels(0, 1, 8)[0].cost.forward_s; };
  EXPECT_NEAR((norm_and_add(apart) - norm_and_add(triad_priced)) /
                  (measured_device.streaming_seconds(residual_bytes) - measured_device.stream_seconds(residual_bytes)),
              1, 1e-9);
  // Without the table, with twice the memory bandwidth, the kernel loses exactly half its
  // add's time; with it, nothing.
  spec::RunSpec faster = triad, faster_measured = run;
  faster.cluster.memory_bandwidth *= 2;
  faster_measured.cluster.memory_bandwidth *= 2;
  const cost::CostModel doubled(faster), doubled_measured(faster_measured);
  EXPECT_NEAR((norm_and_add(triad_priced) - norm_and_add(doubled)) /
                  (residual_bytes / (2 * run.cluster.memory_bandwidth * run.cluster.efficiency.memory)),
              1, 1e-9);
  EXPECT_DOUBLE_EQ(norm_and_add(apart), norm_and_add(doubled_measured));
  // Fills and scalings are contiguous streams too; rows gathered or scattered (a call per row)
  // and squared norms (a reduction) keep the triad's rate.
  const cost::BlockContext ctx = apart.kernel_context();
  const double E = apart.element_bytes();
  EXPECT_DOUBLE_EQ(cost::zero_seconds(1e5, ctx), measured_device.streaming_seconds(1e5 * E));
  EXPECT_DOUBLE_EQ(cost::scale_seconds(1e5, ctx), measured_device.streaming_seconds(2e5 * E));
  EXPECT_DOUBLE_EQ(cost::rows_copy_seconds(100, 64, ctx), measured_device.stream_seconds(2 * 100 * 64 * E));
  EXPECT_DOUBLE_EQ(cost::squared_norm_seconds(1e5, ctx), measured_device.stream_seconds(1e5 * E));
  EXPECT_LT(measured_device.streaming_seconds(1e5 * E), measured_device.stream_seconds(1e5 * E));
  // Rows out of order are refused, naming the table.
  std::string bad = yaml;
  const std::size_t at = bad.find("elementwise_backward:\n");
  ASSERT_NE(at, std::string::npos);
  const std::size_t first = bad.find("- [", at), second = bad.find("- [", first + 3);
  const std::size_t end = bad.find('\n', second);
  const std::string row1 = bad.substr(first, bad.find('\n', first) - first), row2 = bad.substr(second, end - second);
  bad.replace(second, row2.size(), row1);
  test::expect_error([&] { spec::parse_cluster(spec::parse_document(bad, "<calibrated>")); }, Status::bad_config,
                     {"elementwise_backward"});
}

TEST(Calibrate, AttentionIsTimedPerHeadOfASample) {
  calibrate::ComputeOptions o;
  o.quick = true;
  int cases = 0;
  const auto timings = calibrate::measure_attention(o, [&](int, int, const std::string&) { ++cases; });
  ASSERT_EQ(timings.size(), 6u);  // 3 shapes, each way
  EXPECT_EQ(cases, 6);
  // The first quick shape: 16 samples of 4 heads of 4 positions, 16 wide. Its work is one
  // head's (4 s^2 d), not the call's 64 heads'; the backward's 2.5x that.
  EXPECT_EQ(timings[0].what, "attention forward b16 s4 h4 d16");
  EXPECT_DOUBLE_EQ(timings[0].work, 4.0 * 4 * 4 * 16);
  EXPECT_EQ(timings[1].what, "attention backward b16 s4 h4 d16");
  EXPECT_DOUBLE_EQ(timings[1].work, 2.5 * 4.0 * 4 * 4 * 16);
  for (const auto& t : timings) EXPECT_GT(t.seconds, 0) << t.what;
}

// Ops too small to cover a kernel's launch cost the quickest call calibrate timed; ops that do
// not run cost nothing; a file without the figure prices them by their bytes alone.
TEST(Calibrate, EveryCallCostsAtLeastTheQuickestKernel) {
  const calibrate::Calibration c = made_up();
  const calibrate::Fitted f = calibrate::fit(c);
  double quickest = 1;
  for (const auto& t : c.elementwise)
    if (t.what.rfind(calibrate::kStreamingAdd, 0) == 0) quickest = std::min(quickest, t.seconds);
  EXPECT_DOUBLE_EQ(f.launch_seconds, quickest);
  const std::string yaml = calibrate::cluster_yaml(c, f, "made-up");
  const spec::ClusterSpec cluster = spec::parse_cluster(spec::parse_document(yaml, "<calibrated>"));
  EXPECT_NEAR(cluster.launch_seconds / quickest, 1, 1e-3);  // 4 significant digits
  const cost::DeviceModel device(cluster, spec::Precision::fp32);
  EXPECT_DOUBLE_EQ(device.stream_seconds(4), cluster.launch_seconds);
  EXPECT_DOUBLE_EQ(device.gemm_seconds(2, 2, 2), cluster.launch_seconds);
  EXPECT_DOUBLE_EQ(device.flash_attention_seconds(64, false), cluster.launch_seconds);
  EXPECT_DOUBLE_EQ(device.gemm_seconds(0, 2, 2), 0);
  EXPECT_GT(device.stream_seconds(1e9), 100 * cluster.launch_seconds);  // large calls as before
  spec::ClusterSpec unlaunched = cluster;
  unlaunched.launch_seconds = 0;
  EXPECT_DOUBLE_EQ(cost::DeviceModel(unlaunched, spec::Precision::fp32).stream_seconds(4),
                   4 / (cluster.memory_bandwidth * cluster.efficiency.memory));
  std::string bad = yaml;
  const std::size_t at = bad.find("launch_us: ");
  bad.replace(at, bad.find('\n', at) - at, "launch_us: -1");
  test::expect_error([&] { spec::parse_cluster(spec::parse_document(bad, "<calibrated>")); }, Status::bad_config,
                     {"<calibrated>:", "device.launch_us: must not be negative"});
}

// A device's calls run back to back between waits, as a step's ops do; the host's alone.
TEST(Calibrate, DeviceCasesWaitOncePerGroupOfCalls) {
  int calls = 0, waits = 0;
  const auto run = [&] { ++calls; };
  EXPECT_GE(calibrate::time_call(
                run, 0.0, 3, [&] { ++waits; }, 16),
            0.0);
  EXPECT_EQ(calls, 1 + 3 * 16);  // one warm call, then a group per batch (no time asked)
  EXPECT_EQ(waits, 1 + 3);
  calls = 0;
  calibrate::time_call(run, 0.0, 3);
  EXPECT_EQ(calls, 1 + 3);
}

TEST(Calibrate, BraidsAttentionIsPricedBySize) {
  const calibrate::Calibration c = made_up();
  const std::string yaml = calibrate::cluster_yaml(c, calibrate::fit(c), "made-up");
  spec::RunSpec run = test::load("tiny-clip.yaml");
  run.cluster = spec::parse_cluster(spec::parse_document(yaml, "<calibrated>"));
  ASSERT_EQ(run.cluster.efficiency.attention_forward.size(), 2u);
  spec::RunSpec untimed = run;  // a file from before the tables: one figure each way, for flash
  untimed.cluster.efficiency.attention_forward.clear();
  untimed.cluster.efficiency.attention_backward.clear();
  const cost::CostModel reference(run, {}, cost::Kernels::reference), megatron(run),
      reference_untimed(untimed, {}, cost::Kernels::reference), megatron_untimed(untimed);
  // braid's own op (the trainer's reference kernels) at a timed shape: the time calibrate took
  // for each of its heads, whatever the count of heads and samples, causal or not (its GEMMs
  // compute every score); the file holds 4 significant digits.
  for (bool causal : {false, true}) {
    for (double heads : {4.0 * 16, 4.0 * 3}) {
      const cost::BlockCost core = cost::attention_core(16, 16, 16, heads, causal, false, reference.kernel_context());
      EXPECT_NEAR(core.forward_s / (heads * c.attention[0].seconds), 1, 1e-4);
      EXPECT_NEAR(core.backward_s / (heads * c.attention[1].seconds), 1, 1e-4);
    }
  }
  // Between the shapes, an efficiency between theirs: slower per FLOP than the large one.
  const cost::BlockCost mid = cost::attention_core(64, 64, 32, 4 * 8, false, false, reference.kernel_context());
  const double mid_flops = 4.0 * 64 * 64 * 32 * 4 * 8;
  EXPECT_GT(mid.forward_s, mid_flops / (0.6 * 80e9));
  EXPECT_LT(mid.forward_s, mid_flops / (0.2 * 80e9));
  // Megatron's kernels (the planner) keep their GEMMs and softmax; so does braid's op on a
  // cluster without the tables.
  auto core_of = [](const cost::CostModel& m) {
    return cost::attention_core(16, 16, 16, 4 * 16, false, false, m.kernel_context()).forward_s;
  };
  EXPECT_DOUBLE_EQ(core_of(megatron), core_of(megatron_untimed));
  EXPECT_DOUBLE_EQ(core_of(reference_untimed), core_of(megatron_untimed));
  EXPECT_NE(core_of(reference), core_of(reference_untimed));
  // A table out of order is refused, naming it.
  std::string bad = yaml;
  const std::size_t at = bad.find("attention_backward:\n");
  ASSERT_NE(at, std::string::npos);
  const std::size_t first = bad.find("- [", at), second = bad.find("- [", first + 3);
  bad.replace(second, bad.find('\n', second) - second, bad.substr(first, bad.find('\n', first) - first));
  test::expect_error([&] { spec::parse_cluster(spec::parse_document(bad, "<calibrated>")); }, Status::bad_config,
                     {"attention_backward"});
}

TEST(Calibrate, TheJsonCarriesEveryTimingAndFit) {
  const calibrate::Calibration c = made_up();
  const auto j = calibrate::to_json(c, calibrate::fit(c));
  EXPECT_EQ(j["timings"]["gemm"].size(), c.gemms.size());
  EXPECT_DOUBLE_EQ(j["timings"]["probe"]["seconds"].get<double>(), 1.25e-3);
  EXPECT_EQ(j["timings"]["intra_node"].size(), c.intra.size());
  EXPECT_DOUBLE_EQ(j["fitted"]["peak_flops"].get<double>(), 80e9);
  EXPECT_FALSE(j["fitted"].contains("inter_node"));  // one host
  // And what the file takes from the host, not a fit.
  EXPECT_DOUBLE_EQ(j["memory_per_process_bytes"].get<double>(), 8.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(j["memory_reserved_bytes"].get<double>(), 20.0 * (1 << 20));
}

TEST(Calibrate, ProcessesSharingTheCoresAreSimulatedSharingThem) {
  // Enough cores: the file records them (what the data workers get), without a sharing
  // efficiency; every device computes on its own.
  calibrate::Calibration c = made_up();
  auto cluster_of = [](const calibrate::Calibration& k) {
    const std::string yaml = calibrate::cluster_yaml(k, calibrate::fit(k), "made-up");
    return std::make_pair(yaml, spec::parse_cluster(spec::parse_document(yaml, "<calibrated>")));
  };
  auto [roomy_yaml, roomy] = cluster_of(c);
  EXPECT_EQ(roomy.cores_per_node, 4);
  EXPECT_EQ(roomy_yaml.find("time that turns into work"), std::string::npos);
  EXPECT_EQ(roomy.shared_core_efficiency, 1);
  EXPECT_TRUE(roomy.spare_core_for_data());  // 2 processes of 1 thread on 4 cores
  c.per_node = 4;
  EXPECT_FALSE(cluster_of(c).second.spare_core_for_data());  // 4 on 4: none left
  c.per_node = 2;
  // Four processes on two cores: they measured two at a time, and the file says so.
  c.processes = c.per_node = 4;
  c.cores = c.per_turn = 2;
  c.shared = true;
  auto [shared_yaml, shared] = cluster_of(c);
  EXPECT_NE(shared_yaml.find("measuring compute 2 at a time per host (2 cores)"), std::string::npos);
  EXPECT_EQ(shared.cores_per_node, 2);
  EXPECT_EQ(shared.threads_per_device, 1);
  // The programs of a run priced on it carry the sharing, and their simulated step is
  // slower than on cores of their own, by at most the oversubscription.
  spec::RunSpec run = test::load("tiny-mllm.yaml");
  shared.nodes = 1;
  run.cluster = shared;
  const cost::CostModel cost(run);
  const plan::Plan plan =
      orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::megatron, plan::Constraints{1, 2, 2}, {}}).best;
  pipeline::Program program = orchestrate::build_program(cost, plan);
  EXPECT_EQ(program.cores_per_node, 2);
  EXPECT_EQ(program.devices_per_node, 4);
  const double on_shared = sim::simulate(program).step_time_s;
  program.cores_per_node = 0;
  const double alone = sim::simulate(program).step_time_s;
  EXPECT_GT(on_shared, 1.2 * alone);
  EXPECT_LE(on_shared, 2 * alone * (1 + 1e-6));
  // A core count of zero is refused, naming the field.
  std::string bad = shared_yaml;
  bad.replace(bad.find("cores_per_node: 2"), 17, "cores_per_node: 0");
  test::expect_error([&] { spec::parse_cluster(spec::parse_document(bad, "<calibrated>")); }, Status::bad_config,
                     {"shared_cores.cores_per_node"});
}

TEST(Calibrate, TrainAsksThePlannerForLayoutsTheTrainerRuns) {
  // The CPU trainer runs an MLLM's encoder and projector in one pipeline stage: `braid
  // train`'s request says so, so every strategy's plan is one layout_for accepts. On
  // ViT-22B + GPT-175B run the unconstrained searches pipeline the encoder.
  const spec::RunSpec run = test::load("vit22b-gpt175b-1536gpu.yaml");
  const cost::CostModel cost(run);
  bool pipelined_without = false;
  for (plan::Strategy s : {plan::Strategy::disttrain, plan::Strategy::optimus}) {
    SCOPED_TRACE(plan::strategy_name(s));
    auto non_llm_pp = [&](const plan::Plan& p) {
      int most = 1;
      for (const auto& m : p.modules)
        if (m.role != spec::Role::llm) most = std::max(most, m.pp);
      return most;
    };
    pipelined_without |= non_llm_pp(orchestrate::make_plan(cost, plan::PlanRequest{s, {}, {}}).best) > 1;
    const plan::Constraints asked = train::trainable(run.model, {});
    EXPECT_EQ(asked.encoder_pp, 1);
    EXPECT_EQ(non_llm_pp(orchestrate::make_plan(cost, plan::PlanRequest{s, asked, {}}).best), 1);
  }
  EXPECT_TRUE(pipelined_without);
  EXPECT_EQ(train::trainable(test::load("tiny-clip.yaml").model, {}).encoder_pp, 0);  // CLIP towers pipeline
  // The trainer's batch-sync pairs the towers' TP ranks, so it asks DistMM for towers of one
  // tp; on 1024 GPUs the unconstrained search gives the image tower tp 2 and the text tower 1.
  spec::RunSpec clip = test::load("clip-vit-l14-64gpu.yaml");
  clip.cluster.nodes = 128;
  const cost::CostModel clip_cost(clip);
  auto tps = [&](const plan::Constraints& c) {
    std::set<int> out;
    for (const auto& m :
         orchestrate::make_plan(clip_cost, plan::PlanRequest{plan::Strategy::distmm, c, {}}).best.modules)
      out.insert(m.tp);
    return out.size();
  };
  EXPECT_GT(tps({}), 1u);
  const plan::Constraints asked = train::trainable(clip.model, {});
  EXPECT_TRUE(asked.towers_share_tp);
  EXPECT_EQ(tps(asked), 1u);
}

TEST(Calibrate, TrainAsksForPlansOfEveryRank) {
  // Each rank of braid train is one device: a plan that leaves one out has a rank with nothing
  // to run, which the trainer refused after the planner had picked it.
  for (const char* name : {"tiny-mllm.yaml", "tiny-clip.yaml"}) {
    const spec::RunSpec loaded = test::load(name);
    const plan::Strategy strategy =
        loaded.model.topology == spec::Topology::contrastive ? plan::Strategy::distmm : plan::Strategy::disttrain;
    for (int world : {2, 3, 4, 8}) {
      const spec::RunSpec run = train::fit_cluster_to_world(loaded, world);
      const cost::CostModel cost(run);
      plan::Constraints whole;  // braid train's default: whole modules
      whole.tp = whole.pp = 1;
      const plan::Constraints asked = train::trainable(run.model, whole);
      EXPECT_TRUE(asked.all_devices);
      const plan::Plan free = orchestrate::make_plan(cost, plan::PlanRequest{strategy, whole, {}}).best;
      if (world != 3) {
        EXPECT_EQ(orchestrate::make_plan(cost, plan::PlanRequest{strategy, asked, {}}).best.devices, world);
        continue;
      }
      // 3 devices on one node: modules take 1 or 3 of them, so no split uses all three.
      EXPECT_EQ(free.devices, 2);
      test::expect_error(
          [&] {
            orchestrate::make_plan(cost, plan::PlanRequest{strategy, asked, {}});
          },
          Status::infeasible, {"all 3 devices", "(a module takes a divisor of a node's 3 devices or whole nodes)"});
    }
  }
}

}  // namespace
}  // namespace braid
