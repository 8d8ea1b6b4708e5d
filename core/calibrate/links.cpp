#include "core/calibrate/links.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <span>

#include "core/calibrate/measure.hpp"
#include "core/cost/comm.hpp"
#include "core/nn/blas.hpp"

namespace braid::calibrate {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<double> message_sizes(bool quick) {
  std::vector<double> sizes;  // bytes, multiples of 8 so that floats and pieces of 8 fill them
  for (double b = 8; b <= (quick ? 262144.0 : 4194304.0); b *= 8) sizes.push_back(b);
  return sizes;
}

// Repetitions of one case: every process must run the same count (no time-based loops,
// or the ranks would disagree), enough to fill milliseconds at small sizes.
int repetitions(double bytes, bool quick) {
  double reps = (quick ? 2e5 : 2e6) / (bytes + 4096.0);
  return static_cast<int>(std::clamp(reps, 3.0, quick ? 50.0 : 400.0));
}

template <typename F>
double timed(runtime::Communicator& world, int reps, F&& run) {
  std::vector<double> batches;
  run();  // warm: connections, registration of buffers
  for (int b = 0; b < 3; ++b) {
    world.barrier();
    const auto start = Clock::now();
    for (int i = 0; i < reps; ++i) run();
    double t[1] = {std::chrono::duration<double>(Clock::now() - start).count() / reps};
    world.allreduce(std::span<double>(t), runtime::ReduceOp::max);
    batches.push_back(t[0]);
  }
  return median(std::move(batches));
}

// The gaps of compute the all-reduces are timed after (a tiny run's step computes for 20 ms
// between its gradient reductions, a microbatch's backward for a few), and their sizes.
std::vector<double> compute_gaps(bool quick) {
  return quick ? std::vector<double>{2e-3, 8e-3} : std::vector<double>{1e-3, 4e-3, 16e-3};
}
std::vector<double> after_compute_sizes(bool quick) {
  return quick ? std::vector<double>{4096, 262144} : std::vector<double>{4096, 32768, 262144, 2097152};
}

// GEMMs of 256 x 256 floats for `seconds`, as a backward keeps a core busy.
void compute_for(double seconds) {
  constexpr int kSide = 256;
  static thread_local std::vector<float> a(kSide * kSide, 0.5f), b(kSide * kSide, 0.25f), c(kSide * kSide);
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end)
    nn::gemm(false, false, kSide, kSide, kSide, 1, a.data(), kSide, b.data(), kSide, 0, c.data(), kSide);
}

// One call of `run` after `gap` of compute, as the member that entered last saw it (per call,
// the least time any member spent in it: the others waited for that one), the median of `reps`
// calls (one call's time swings 2x here: the median, not a mean).
template <typename F>
double timed_after_compute(runtime::Communicator& world, int reps, double gap, bool member, F&& run) {
  std::vector<double> calls(static_cast<std::size_t>(reps), std::numeric_limits<double>::infinity());
  for (int i = 0; i < reps && member; ++i) {
    compute_for(gap);
    const auto start = Clock::now();
    run();
    calls[static_cast<std::size_t>(i)] = std::chrono::duration<double>(Clock::now() - start).count();
  }
  world.allreduce(std::span<double>(calls), runtime::ReduceOp::min);
  return median(std::move(calls));
}

// One process's side of the three cases, with its buffers: through the world's
// communicators on host memory, or a device plugin's communicators on device memory.
class Endpoint {
 public:
  virtual ~Endpoint() = default;
  // For the pair's members: send then receive (`first`), or receive then send.
  virtual void ping(std::size_t bytes, bool first) = 0;
  // For the group's members, made once the p2p cases are done.
  virtual void join_group() = 0;
  virtual void allreduce(std::size_t bytes) = 0;
  virtual void allgather(std::size_t piece) = 0;  // receives size() * piece
};

class HostEndpoint : public Endpoint {
 public:
  HostEndpoint(runtime::World& world, std::vector<int> pair, std::vector<int> group)
      : world_(world), pair_(std::move(pair)), group_(std::move(group)) {}
  void ping(std::size_t bytes, bool first) override {
    buffer_.resize(bytes);
    runtime::Communicator& all = world_.communicator();
    const int peer = first ? pair_[1] : pair_[0];
    if (first) {
      all.send(buffer_, peer, 7);
      all.recv(buffer_, peer, 8);
    } else {
      all.recv(buffer_, peer, 7);
      all.send(buffer_, peer, 8);
    }
  }
  void join_group() override { sub_.emplace(world_.group(group_)); }
  // Floats, as the trainer sums its gradients: Open MPI's non-blocking sum of 2 MiB of floats
  // takes 1.2x the time of the same bytes of doubles (twice the elements).
  void allreduce(std::size_t bytes) override {
    sums_.resize(bytes / sizeof(float));  // zeros: repeated sums stay finite
    sub_->allreduce(std::span<float>(sums_));
  }
  void allgather(std::size_t piece) override {
    buffer_.resize(piece);
    gathered_.resize(piece * group_.size());
    sub_->allgather(buffer_, gathered_);
  }

 private:
  runtime::World& world_;
  std::vector<int> pair_, group_;
  std::optional<runtime::Communicator> sub_;
  std::vector<std::byte> buffer_, gathered_;
  std::vector<float> sums_;
};

class DeviceEndpoint : public Endpoint {
 public:
  // A deadline far past any case's time: a rank that died surfaces as an error, not a hang.
  static constexpr double kDeadlineSeconds = 600.0;

  DeviceEndpoint(const LinkPath& path, const std::vector<int>& pair, std::vector<int> group, bool in_pair)
      : path_(path), group_(std::move(group)) {
    if (in_pair) pair_comm_.emplace(*path.plugin, pair);
  }
  void ping(std::size_t bytes, bool first) override {
    float* data = buffer(send_, bytes);
    const int peer = first ? 1 : 0;  // group ranks of the pair's communicator
    if (first) {
      pair_comm_->send(data, bytes, peer, nullptr, kDeadlineSeconds);
      pair_comm_->recv(data, bytes, peer, nullptr, kDeadlineSeconds);
    } else {
      pair_comm_->recv(data, bytes, peer, nullptr, kDeadlineSeconds);
      pair_comm_->send(data, bytes, peer, nullptr, kDeadlineSeconds);
    }
  }
  void join_group() override { sub_.emplace(*path_.plugin, group_); }
  void allreduce(std::size_t bytes) override {
    sub_->allreduce_sum(buffer(send_, bytes), bytes / sizeof(float), nullptr, kDeadlineSeconds);
  }
  void allgather(std::size_t piece) override {
    sub_->allgather(buffer(send_, piece), buffer(recv_, piece * group_.size()), piece, nullptr, kDeadlineSeconds);
  }

 private:
  // `t` as a device buffer of at least `bytes` (whole floats), made again only when it grows.
  float* buffer(nn::Tensor& t, std::size_t bytes) {
    const auto floats = static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float));
    if (t.numel() < floats) t = path_.backend->zeros({floats});
    return t.ptr();
  }
  LinkPath path_;
  std::vector<int> group_;
  std::optional<runtime::DeviceCommunicator> pair_comm_, sub_;
  nn::Tensor send_, recv_;
};

// Per gap, what the all-reduces timed after it took beyond their price, as fixed + factor x
// price: least squares relative to their times (a 4 KiB and a 2 MiB case weigh alike), neither
// term below zero.
template <typename Model>
std::vector<spec::LinkSpec::AfterCompute> fit_after_compute(const std::vector<LinkTiming>& points, Model&& price) {
  auto timed_after = [](const LinkTiming& p) { return p.after_compute > 0 && p.seconds > 0 && p.members >= 2; };
  std::vector<double> gaps;
  for (const auto& p : points)
    if (timed_after(p)) gaps.push_back(p.after_compute);
  std::sort(gaps.begin(), gaps.end());
  gaps.erase(std::unique(gaps.begin(), gaps.end()), gaps.end());
  std::vector<spec::LinkSpec::AfterCompute> rows;
  for (double gap : gaps) {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;  // weighted sums of price x and extra y
    for (const auto& p : points) {
      if (!timed_after(p) || p.after_compute != gap) continue;
      const double x = price(p), y = p.seconds - x, w = 1 / (p.seconds * p.seconds);
      sw += w;
      sx += w * x;
      sy += w * y;
      sxx += w * x * x;
      sxy += w * x * y;
    }
    const double det = sw * sxx - sx * sx;  // 0 up to rounding for a single size
    double factor = det > 1e-9 * sw * sxx ? (sw * sxy - sx * sy) / det : 0, fixed = (sy - factor * sx) / sw;
    if (fixed < 0) {  // through the origin
      fixed = 0;
      factor = sxx > 0 ? sxy / sxx : 0;
    }
    if (factor < 0) {
      factor = 0;
      fixed = sy / sw;
    }
    rows.push_back({gap, std::max(0.0, fixed), std::max(0.0, factor)});
  }
  return rows;
}

}  // namespace

const char* link_op_name(LinkOp op) {
  switch (op) {
    case LinkOp::p2p:
      return "p2p";
    case LinkOp::all_reduce:
      return "all-reduce";
    case LinkOp::all_gather:
      return "all-gather";
  }
  return "?";
}

int link_case_count(bool quick, bool compute_on_host) {
  const std::size_t after = compute_on_host ? compute_gaps(quick).size() * after_compute_sizes(quick).size() : 0;
  return static_cast<int>(3 * message_sizes(quick).size() + after);
}

std::vector<LinkTiming> measure_links(runtime::World& world, const std::vector<int>& pair,
                                      const std::vector<int>& group, bool quick, const CaseHook& between,
                                      const LinkPath& path) {
  runtime::Communicator& all = world.communicator();
  const int me = world.rank();
  const bool in_pair = me == pair[0] || me == pair[1];
  const bool member = std::binary_search(group.begin(), group.end(), me);
  std::unique_ptr<Endpoint> end;
  if (path.plugin)
    end = std::make_unique<DeviceEndpoint>(path, pair, group, in_pair);
  else
    end = std::make_unique<HostEndpoint>(world, pair, group);
  const auto sizes = message_sizes(quick);
  const int cases = link_case_count(quick, path.times_after_compute());
  std::vector<LinkTiming> out;
  int index = 0;
  for (double bytes : sizes) {
    between(index++, cases, "p2p " + std::to_string(static_cast<long long>(bytes)) + " B");
    const double round_trip = timed(all, repetitions(bytes, quick), [&] {
      if (in_pair) end->ping(static_cast<std::size_t>(bytes), me == pair[0]);
    });
    out.push_back({LinkOp::p2p, 2, bytes, round_trip / 2});
  }
  if (member) end->join_group();
  const int n = static_cast<int>(group.size());
  for (double bytes : sizes) {
    between(index++, cases, "all-reduce " + std::to_string(static_cast<long long>(bytes)) + " B");
    const double t = timed(all, repetitions(bytes, quick), [&] {
      if (member) end->allreduce(static_cast<std::size_t>(bytes));
    });
    out.push_back({LinkOp::all_reduce, n, bytes, t});
  }
  for (double bytes : sizes) {
    between(index++, cases, "all-gather " + std::to_string(static_cast<long long>(bytes)) + " B");
    // The gathered output is `bytes`, rounded down to whole pieces of 8 bytes per member.
    const std::size_t piece = std::max<std::size_t>(8, static_cast<std::size_t>(bytes) / n / 8 * 8);
    const double t = timed(all, repetitions(bytes, quick), [&] {
      if (member) end->allgather(piece);
    });
    out.push_back({LinkOp::all_gather, n, static_cast<double>(piece) * n, t});
  }
  if (!path.times_after_compute()) return out;
  for (double gap : compute_gaps(quick))
    for (double bytes : after_compute_sizes(quick)) {
      between(index++, cases,
              "all-reduce " + std::to_string(static_cast<long long>(bytes)) + " B after " +
                  std::to_string(static_cast<int>(std::lround(gap * 1e3))) + " ms of compute");
      if (member) end->allreduce(static_cast<std::size_t>(bytes));  // its buffer made before the first gap
      const double t = timed_after_compute(all, quick ? 5 : 15, gap, member,
                                           [&] { end->allreduce(static_cast<std::size_t>(bytes)); });
      out.push_back({LinkOp::all_reduce, n, bytes, t, gap});
    }
  return out;
}

LinkFit fit_link(const std::vector<LinkTiming>& points, bool cross_node) {
  spec::ClusterSpec cluster;
  cluster.devices_per_node = cross_node ? 1 : 1 << 20;
  // The link not being fitted is made free, so the formulas see only the one that is.
  spec::LinkSpec& link = cross_node ? cluster.inter_node : cluster.intra_node;
  spec::LinkSpec& other = cross_node ? cluster.intra_node : cluster.inter_node;
  other = spec::LinkSpec{1e18, 0, 1, 1};
  link.efficiency = 1;
  link.nics_per_node = 1;
  const cost::CommModel comm(cluster);  // reads `link` as the search below sets it
  auto model = [&](const LinkTiming& p) {
    const cost::GroupShape g =
        cross_node ? cost::GroupShape{p.members, 1, p.members} : cost::GroupShape{p.members, p.members, 1};
    switch (p.op) {
      case LinkOp::p2p:
        return comm.p2p(p.bytes, cross_node);
      case LinkOp::all_reduce:
        return comm.all_reduce(p.bytes, g);
      case LinkOp::all_gather:
        return comm.all_gather(p.bytes, g);
    }
    return 0.0;
  };
  // Squared log error over the points `use` selects (all of them for `worst`).
  auto error = [&](bool (*use)(LinkOp), double* worst) {
    double sum = 0;
    for (const auto& p : points) {
      if (p.seconds <= 0 || p.after_compute > 0 || (p.op != LinkOp::p2p && p.members < 2) || !use(p.op)) continue;
      double r = std::log(model(p) / p.seconds);
      sum += r * r;
      // Off by the larger of the two ratios: a point 15x slower than the model is off by
      // 1400%, not 93% (model / measured cannot fall below 0).
      if (worst) *worst = std::max(*worst, std::exp(std::abs(r)) - 1);
    }
    return sum;
  };
  const bool transfers_measured = std::any_of(
      points.begin(), points.end(), [](const LinkTiming& p) { return p.op != LinkOp::all_reduce && p.seconds > 0; });
  // Without p2p or all-gather timings the all-reduces fix the transfer too, with no reduction.
  auto transfer =
      transfers_measured ? +[](LinkOp op) { return op != LinkOp::all_reduce; } : +[](LinkOp) { return true; };
  // A log grid (5% steps) from 10 ns to 10 ms and from 10 MB/s to 10 TB/s.
  LinkFit best;
  double best_error = -1;
  link.reduce_bandwidth = 0;
  for (double latency = 1e-8; latency <= 1e-2; latency *= 1.05)
    for (double bandwidth = 1e7; bandwidth <= 1e13; bandwidth *= 1.05) {
      link.bandwidth = bandwidth;
      link.latency = latency;
      double e = error(transfer, nullptr);
      if (best_error < 0 || e < best_error) {
        best_error = e;
        best.bandwidth = bandwidth;
        best.latency = latency;
      }
    }
  link.bandwidth = best.bandwidth;
  link.latency = best.latency;
  if (transfers_measured) {
    // The summing is a cost per byte: it is fitted to the all-reduces whose transfer is
    // bandwidth-bound (its bytes' time at least 4x its latency), where it shows. Small ones
    // stray from the alpha-beta line at the MPI library's protocol switches (on a 2-core
    // host a 4 KiB all-reduce took 3x the transfer model's time, 256 KiB and 2 MiB ones
    // 1.6-2x); fitted over them too, calibrations minutes apart priced a 2 MiB all-reduce
    // at 1.3x and at 0.6x its measured time, the rate kept in one and dropped in the other.
    std::vector<LinkTiming> large;
    for (const auto& p : points) {
      if (p.op != LinkOp::all_reduce || p.members < 2 || p.seconds <= 0 || p.after_compute > 0) continue;
      const double whole = model(p);
      link.latency = 0;  // the bytes' time alone, of the algorithm the model picks at this size
      const double bytes_time = model(p);
      link.latency = best.latency;
      if (bytes_time >= 4 * (whole - bytes_time)) large.push_back(p);
    }
    best.reduce_points = static_cast<int>(large.size());
    // A reduction term is kept only when those all-reduces run slower than the transfer
    // model says by more than the grid's 5% step (on average, in log time) and it explains
    // most of what that model misses (half its squared log error or more), not grid noise.
    auto large_error = [&] {
      double sum = 0;
      for (const auto& p : large) sum += std::pow(std::log(model(p) / p.seconds), 2);
      return sum;
    };
    double slower = 0;
    for (const auto& p : large) slower += std::log(p.seconds / model(p)) / static_cast<double>(large.size());
    if (slower <= std::log(1.05)) large.clear();
    const double without = large_error();
    double reduce_error = without;
    double rate_found = 0;
    for (double rate = 1e7; rate <= 1e13 && !large.empty(); rate *= 1.05) {
      link.reduce_bandwidth = rate;
      const double e = large_error();
      if (e < reduce_error) {
        reduce_error = e;
        rate_found = rate;
      }
    }
    best.reduce_bandwidth = reduce_error <= 0.5 * without ? rate_found : 0;
    link.reduce_bandwidth = best.reduce_bandwidth;
  }
  best.worst_error = 0;
  error(
      +[](LinkOp) { return true; }, &best.worst_error);
  best.points = static_cast<int>(
      std::count_if(points.begin(), points.end(), [](const LinkTiming& p) { return p.after_compute <= 0; }));
  best.after_compute = fit_after_compute(points, model);
  return best;
}

}  // namespace braid::calibrate
