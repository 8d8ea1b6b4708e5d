// braid calibrate: measures the machine it runs on (every process of an mpiexec launch) and
// writes a cluster file the planner, the simulator and `braid train --cluster` read.
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "core/calibrate/cluster_file.hpp"
#include "core/calibrate/turns.hpp"
#include "core/common/error.hpp"
#include "core/common/file.hpp"
#include "core/nn/blas.hpp"
#include "core/nn/device_backend.hpp"
#include "core/runtime/world.hpp"
#include "core/spec/run.hpp"
#include "core/train/device_collectives.hpp"
#include "tools/braid/commands.hpp"
#include "tools/braid/parse_options.hpp"
#include "tools/braid/rank_error.hpp"
#include "tools/braid/same_command.hpp"

namespace po = boost::program_options;

namespace braid::cli {
namespace {

const char* kCalibrateUsage =
    "usage: mpiexec -n N braid calibrate [--out FILE] [options]\n"
    "\n"
    "Measures the machine it runs on and writes a cluster file (the format of\n"
    "configs/clusters/*.yaml) that `braid plan`, `braid simulate` and `braid train` take with\n"
    "--cluster FILE. Every process of the launch measures at once, as they train:\n"
    "  - GEMMs: the linear op's forward and backward (OpenBLAS) at a ladder of shapes, as\n"
    "    the efficiency table by GEMM size and the best rate as the peak;\n"
    "  - memory bandwidth: a triad over arrays far larger than the caches (it also prices\n"
    "    rows copied and squared norms);\n"
    "  - element-wise kernels (layer norm, GELU), forward and backward timed apart, the\n"
    "    optimizer step (AdamW) and the residual add (it prices adds, fills and scalings),\n"
    "    at a ladder of sizes;\n"
    "  - attention: braid's attention op, forward and backward, at a ladder of shapes (it\n"
    "    prices braid train's attention by size, and runs that ask for attention: flash);\n"
    "  - samples of braid's dataset, rendered at a ladder of image sides and described, on one\n"
    "    host core as braid train's data workers make them (priced where a step makes them);\n"
    "  - a probe: one GEMM case that braid train times again before and after its steps, to\n"
    "    say how fast the host ran then against its calibration (priced nowhere);\n"
    "  - links: p2p ping-pong, all-reduce and all-gather through the communication plugin\n"
    "    (MPI), fitted to the cost model's alpha-beta formulas; between hosts too when the\n"
    "    launch spans several.\n"
    "The file says what was measured, when and on what. Links need two processes or more.\n"
    "With --device cuda the compute cases run on each process's GPU (cuBLAS and braid's\n"
    "kernels through the CUDA backend, GPU-sized ladders, a device copy for the bandwidth), and\n"
    "the links are timed through NCCL on GPU memory, as braid train's device collectives run,\n"
    "when every process has a GPU of its own (else through the MPI plugin on host memory, and\n"
    "the file says why). --device emulated runs that path on the host backend as an emulated\n"
    "device, its links through the MPI plugin's device interface.\n"
    "\n"
    "options";

struct Host {
  std::string name, cpu;
  double memory_bytes = 0, resident_bytes = 0;
};

// "key : value" lines of a /proc file: the value of the first line starting with `key`.
std::string proc_field(const char* path, const std::string& key) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    return value;
  }
  return "";
}

Host this_host() {
  Host h;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  h.name = name;
  h.cpu = proc_field("/proc/cpuinfo", "model name");
  if (h.cpu.empty()) h.cpu = "unknown CPU";
  h.cpu += " (" + std::to_string(std::thread::hardware_concurrency()) + " hardware threads)";
  h.memory_bytes = std::atof(proc_field("/proc/meminfo", "MemTotal").c_str()) * 1024;
  h.resident_bytes = std::atof(proc_field("/proc/self/status", "VmRSS").c_str()) * 1024;
  return h;
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Rank 0's progress: one bar rewritten in place where standard error is a terminal, a line
// per phase elsewhere (mpiexec pipes its ranks' standard error; the pseudo-terminal it gives
// their standard output is there even when its own output goes to a file).
class Progress {
 public:
  Progress(bool show, int total) : show_(show), live_(show && isatty(STDERR_FILENO)), total_(total) {}
  void step(const std::string& phase, const std::string& what) {
    ++done_;
    if (!show_) return;
    if (live_) {
      const int width = 30, filled = total_ > 0 ? width * done_ / total_ : width;
      std::fprintf(stderr, "\r\033[Kcalibrate [%s%s] %3d%% %s",
                   std::string(static_cast<std::size_t>(filled), '#').c_str(),
                   std::string(static_cast<std::size_t>(width - filled), '.').c_str(),
                   100 * done_ / std::max(1, total_), what.c_str());
    } else if (phase != phase_) {
      std::fprintf(stderr, "calibrate: %s (%d of %d measurements done)\n", phase.c_str(), done_ - 1, total_);
    }
    phase_ = phase;
  }
  void finish() {
    if (live_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool show_, live_;
  int total_, done_ = 0;
  std::string phase_;
};

// Each process's figures averaged over the world: what one process achieves while all run.
void average_seconds(runtime::Communicator& world, std::vector<calibrate::Timing>& timings) {
  std::vector<double> s;
  for (const auto& t : timings) s.push_back(t.seconds);
  world.allreduce(std::span<double>(s));
  for (std::size_t i = 0; i < s.size(); ++i) timings[i].seconds = s[i] / world.size();
}

}  // namespace

int run_calibrate(const std::vector<std::string>& args) {
  std::string out = "-", name, format = "table", device = "auto";
  int threads = 0;
  po::options_description opts(kCalibrateUsage);
  opts.add_options()("help,h", "show this help")("out,o", po::value(&out)->value_name("FILE"),
                                                 "write the cluster file here (default: - , standard output)")(
      "name", po::value(&name)->value_name("NAME"), "the cluster's name in the file (default: calibrated-<host>)")(
      "threads", po::value(&threads)->value_name("N"),
      "host threads per process, as braid train --threads (default: the host's cores / processes on it)")(
      "device", po::value(&device)->value_name("D"),
      "what runs the compute cases: auto (default: braid's host ops), host (the same through the device "
      "interface, libbraid-host.so), cuda (the GPU of each process: local rank modulo the node's GPUs), "
      "emulated (the host backend as an emulated device)")(
      "quick", "short ladders and timings (a rough file in seconds; for tests)")("quiet,q",
                                                                                 "no progress on standard error")(
      "format,f", po::value(&format)->value_name("FMT"),
      "the summary: table (default) | json (every timing and fitted figure)");
  po::variables_map vm;
  try {
    po::store(parse_options(args, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "braid calibrate: error: %s\n(see 'braid calibrate --help')\n", e.what());
    return kExitBadInput;
  }
  if (vm.count("help")) {
    std::cout << opts
              << "\nexamples:\n  mpiexec -n 4 braid calibrate --out my-cluster.yaml\n"
                 "  mpiexec -n 4 braid train --config configs/runs/tiny-clip.yaml --cluster my-cluster.yaml\n";
    return kExitOk;
  }
  std::string problem;
  if (format != "table" && format != "json") problem = "--format must be table or json, not '" + format + "'";
  if (problem.empty() && !spec::host_threads_problem(threads).empty())
    problem = "--threads " + spec::host_threads_problem(threads);
  if (problem.empty() && device != "auto" && device != "host" && device != "cuda" && device != "emulated")
    problem = "--device must be auto, host, cuda or emulated, got '" + device + "'";
  if (problem.empty() && out == "-" && format == "json")
    problem = "--format json prints to standard output: give the cluster file a place with --out FILE";
  if (!problem.empty()) {
    std::fprintf(stderr, "braid calibrate: error: %s\n(see 'braid calibrate --help')\n", problem.c_str());
    return kExitBadInput;
  }

  runtime::World world = runtime::World::from_plugin("mpi");
  if (const int code = agree_on_setup(world, [&] { require_same_command(world, args, {}); }); code != kExitOk)
    return code;
  runtime::Communicator& all = world.communicator();
  const int rank = world.rank(), size = world.size();
  try {
    if (size < 2)
      throw Error(Status::invalid_argument,
                  "one process measures no links: launch it with mpiexec -n 2 (or more), one process per device "
                  "as braid train runs");
    // Before minutes of measuring: the file must have a place to go (checked on rank 0, the
    // writer; every rank learns the answer, so all stop together without an abort).
    int writable[1] = {1};
    std::string why;
    if (rank == 0 && out != "-") {
      why = unwritable_reason(out);
      writable[0] = why.empty() ? 1 : 0;
    }
    all.broadcast(std::as_writable_bytes(std::span<int>(writable)), 0);
    if (!writable[0]) {
      if (rank == 0)
        report_error(static_cast<int>(Status::io), "cannot write the cluster file to '" + out + "': " + why);
      return kExitBadInput;
    }
    const Host host = this_host();
    // Which host each rank is on: hostnames over an all-gather, in fixed-size records.
    constexpr std::size_t kName = 256;
    std::vector<char> mine(kName, '\0'), names(kName * static_cast<std::size_t>(size));
    std::copy_n(host.name.begin(), std::min(host.name.size(), kName - 1), mine.begin());
    all.allgather(std::as_bytes(std::span<const char>(mine)), std::as_writable_bytes(std::span<char>(names)));
    std::map<std::string, std::vector<int>> ranks_on;
    std::vector<std::string> host_of;
    for (int r = 0; r < size; ++r) {
      host_of.emplace_back(names.data() + static_cast<std::size_t>(r) * kName);
      ranks_on[host_of.back()].push_back(r);
    }
    // One devices_per_node for every host: a launch of 2 + 1 processes would read as 2 x 2.
    const int uneven = agree_on_setup(world, [&] {
      const auto& [first_host, first_ranks] = *ranks_on.begin();
      for (const auto& [h, rs] : ranks_on)
        if (rs.size() != first_ranks.size())
          throw Error(Status::invalid_argument,
                      "the hosts run different numbers of processes (" + first_host + ": " +
                          std::to_string(first_ranks.size()) + ", " + h + ": " + std::to_string(rs.size()) +
                          "), but a cluster file has one count of devices per node: launch as many on every host "
                          "(Open MPI: --map-by ppr:N:node)");
    });
    if (uneven != kExitOk) return uneven;
    std::vector<int> firsts;  // the first rank of each host, ascending
    for (const auto& [h, rs] : ranks_on) firsts.push_back(rs.front());
    std::sort(firsts.begin(), firsts.end());
    const std::vector<int>& local = ranks_on[host_of[0]];

    calibrate::Calibration c;
    c.host = host.name;
    c.cpu = host.cpu;
    c.when_utc = utc_now();
    c.communication = world.bootstrap();
    c.processes = size;
    c.nodes = static_cast<int>(ranks_on.size());
    for (const auto& [h, rs] : ranks_on) c.per_node = std::max(c.per_node, static_cast<int>(rs.size()));
    c.threads =
        threads > 0
            ? threads
            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, world.local_size()));
    c.quick = vm.count("quick") > 0;
    c.memory_per_process_bytes = host.memory_bytes / std::max(1, world.local_size());
    double resident[1] = {host.resident_bytes};
    all.allreduce(std::span<double>(resident), runtime::ReduceOp::max);
    c.reserved_bytes = resident[0];

    // The device the compute cases run on; on GPUs the "cores" that turns share are the
    // node's GPUs, one process each at a time.
    std::shared_ptr<nn::DeviceBackend> backend;
    int gpus = 0;
    if (device == "host" || device == "emulated") {
      backend = nn::DeviceBackend::open_for_process(device, c.threads, world.local_rank());
      c.cpu += device == "host" ? ", ops through the host backend (device interface 2)"
                                : ", ops through the host backend as an emulated device";
    } else if (device == "cuda") {
      // Said once, every rank stopping alike (no abort), when a rank has no GPU.
      const int opened = agree_on_setup(world, [&] {
        try {
          backend = nn::DeviceBackend::open_for_process("cuda", 1, world.local_rank());
        } catch (const Error& e) {
          throw Error(e.status(), std::string("--device cuda: no GPU: ") + e.what());
        }
      });
      if (opened != kExitOk) return opened;
      gpus = backend->device_count();
      c.cpu = backend->info().name + " (" + std::to_string(gpus) +
              " per node; cuBLAS and braid's kernels, CUDA backend); host " + c.cpu;
      c.threads = 1;
      c.library = "cuBLAS";
      // Processes sharing a GPU (more of them on the host than GPUs) share its memory.
      const int sharing = (world.local_size() + std::max(1, gpus) - 1) / std::max(1, gpus);
      c.device_memory_bytes = backend->info().memory_bytes / std::max(1, sharing);
    }
    nn::set_blas_threads(c.threads);  // as braid train: its GEMMs on as many OpenBLAS threads
    // Turns on this host's cores: as many processes at once as its cores hold; every process
    // takes part in as many turns as the most crowded host needs, so the barriers match.
    c.cores = gpus > 0 ? gpus : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const std::vector<int>& mates = ranks_on[host_of[static_cast<std::size_t>(rank)]];
    const int here = static_cast<int>(mates.size());
    const int local_index = static_cast<int>(std::find(mates.begin(), mates.end(), rank) - mates.begin());
    calibrate::Turns turns = calibrate::Turns::on_host(all, local_index, here, c.cores, c.threads);
    c.per_turn = turns.per_turn();
    c.shared = turns.turns() > 1;
    const calibrate::ComputeOptions compute{c.threads, c.quick, backend};
    const int link_sets = (local.size() >= 2 ? 1 : 0) + (firsts.size() >= 2 ? 1 : 0);
    const bool on_host = !backend || backend->device().is_host();  // where the steps compute
    // A process waiting for its turn must hand its core over (BRAID_MPI_WAIT=sleep, read by the
    // MPI plugin at each wait); the links are then timed waiting as training waits.
    const bool wait_chosen = std::getenv("BRAID_MPI_WAIT") != nullptr;  // the user's choice stands
    if (c.shared && !wait_chosen) ::setenv("BRAID_MPI_WAIT", "sleep", 1);
    Progress progress(rank == 0 && !vm.count("quiet"), calibrate::compute_case_count(compute) +
                                                           calibrate::sample_case_count(compute) +
                                                           (c.shared ? calibrate::gemm_case_count(compute) : 0) +
                                                           link_sets * calibrate::link_case_count(c.quick, on_host));
    enum class Together { in_turns, everyone, no };
    auto hook = [&](const std::string& phase, Together together) {
      return [&, phase, together](int, int, const std::string& what) {
        if (together == Together::in_turns) turns.before_case();  // a turn's processes on one case at once
        if (together == Together::everyone) all.barrier();
        progress.step(phase, what);
      };
    };
    c.gemms = calibrate::measure_gemms(compute, hook("GEMMs", Together::in_turns));
    turns.end();
    // Taking turns measured a process with cores of its own; what crowding costs on top of
    // the time-slicing comes from the same ladder with everyone at once.
    if (c.shared)
      c.crowded_gemms = calibrate::measure_gemms(compute, hook("GEMMs, every process at once", Together::everyone));
    c.memory = calibrate::measure_memory_bandwidth(compute, hook("memory bandwidth", Together::in_turns));
    turns.end();
    c.elementwise = calibrate::measure_elementwise(compute, hook("element-wise kernels", Together::in_turns));
    turns.end();
    c.attention = calibrate::measure_attention(compute, hook("attention", Together::in_turns));
    turns.end();
    c.samples = calibrate::measure_samples(compute, hook("samples", Together::in_turns));
    turns.end();
    const calibrate::ComputeOptions probing{c.threads, true, backend};  // as braid train probes
    c.probe_shape = calibrate::probe_shape(probing);
    c.probe_seconds = calibrate::probe_linear(all, local_index, here, probing, c.probe_shape);
    if (c.shared && !wait_chosen) ::unsetenv("BRAID_MPI_WAIT");
    for (auto* timings : {&c.gemms, &c.crowded_gemms, &c.elementwise, &c.attention, &c.samples})
      average_seconds(all, *timings);
    std::vector<calibrate::Timing> memory = {c.memory};
    average_seconds(all, memory);
    c.memory = memory.front();
    // Links inside rank 0's host (its first two ranks; collectives over all of them), then
    // between hosts (their first ranks): on the device when the trainer's collectives would
    // run there (collective: every rank agrees on it).
    std::string why_not;
    const std::unique_ptr<train::DeviceCollectives> on_device = train::DeviceCollectives::open(backend, world, why_not);
    calibrate::LinkPath path{nullptr, nullptr, on_host};
    if (on_device) {
      path = {&on_device->plugin(), on_device->backend(), on_host};
      c.communication += "; links timed on the device's memory through the " + std::string(on_device->plugin().name()) +
                         " plugin's device interface";
    } else if (backend && !backend->device().is_host()) {
      c.communication += "; links timed on host memory: " + why_not;
    }
    if (local.size() >= 2)
      c.intra = calibrate::measure_links(world, {local[0], local[1]}, local, c.quick,
                                         hook("links within a host", Together::no), path);
    if (firsts.size() >= 2)
      c.inter = calibrate::measure_links(world, {firsts[0], firsts[1]}, firsts, c.quick,
                                         hook("links between hosts", Together::no), path);
    if (c.intra.empty()) c.intra = c.inter;  // one process per host: only the network was measured
    progress.finish();

    if (rank == 0) {
      const calibrate::Fitted fitted = calibrate::fit(c);
      const std::string yaml = calibrate::cluster_yaml(c, fitted, name.empty() ? "calibrated-" + c.host : name);
      if (out == "-") {
        std::cout << yaml << std::flush;
        std::cerr << calibrate::summary(c, fitted);
      } else {
        write_file_atomically(out, yaml, "cluster file");
        if (format == "json")
          std::cout << calibrate::to_json(c, fitted).dump(2) << "\n";
        else
          std::cout << calibrate::summary(c, fitted) << "wrote " << out << "\n";
      }
    }
    all.barrier();
    return kExitOk;
  } catch (const std::exception&) {
    return fail_rank(world, std::current_exception());
  }
}

}  // namespace braid::cli
