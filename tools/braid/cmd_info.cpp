// braid info: what this build is, and which devices its plugins see.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "braid/braid.h"
#include "core/common/error.hpp"
#include "core/nn/device_ops.hpp"
#include "core/nn/host_ops.hpp"
#include "core/runtime/comm_plugin.hpp"
#include "core/runtime/device_comm.hpp"
#include "core/runtime/plugin_loader.hpp"
#include "tools/braid/commands.hpp"
#include "tools/braid/parse_options.hpp"

namespace po = boost::program_options;

namespace braid::cli {
namespace {

struct PluginReport {
  std::string name, kind, path, status;
  std::vector<runtime::DeviceInfo> devices;
  std::vector<std::string> checks;  // per device, with --check
  int interface = 0;                // device plugins: the interface version loaded (0: none)
  bool failed = false;
};

// A linear layer forward and backward through the device's op table against the host ops
// on the same inputs: "" when they agree within 1e-5 of the largest element, else why not.
std::string ops_check(const std::string& plugin, int index) {
  auto backend = nn::DeviceBackend::open(plugin, index);
  nn::DeviceOps device(backend);
  nn::HostOps host(1);
  nn::Tensor x({4, 8}), w({3, 8}), dy({4, 3});
  for (int64_t i = 0; i < x.numel(); ++i) x.data[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  for (int64_t i = 0; i < w.numel(); ++i) w.data[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data[i] = 0.2f * static_cast<float>(i % 3) - 0.2f;
  nn::Tensor y, dx, dw({3, 8}), y_d, dx_d, dw_d = backend->zeros({3, 8});
  host.linear_forward(x, w, nullptr, y);
  host.linear_backward(x, w, dy, &dx, &dw, nullptr);
  const nn::Tensor x_d = backend->upload(x), w_d = backend->upload(w), dy_d = backend->upload(dy);
  device.linear_forward(x_d, w_d, nullptr, y_d);
  device.linear_backward(x_d, w_d, dy_d, &dx_d, &dw_d, nullptr);
  for (auto [got, want, what] : {std::tuple{&y_d, &y, "y"}, {&dx_d, &dx, "dx"}, {&dw_d, &dw, "dweight"}}) {
    const nn::Tensor back = got->device().is_host() ? *got : backend->download(*got);
    double diff = 0, scale = 1e-30;
    for (std::size_t i = 0; i < want->data.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(back.data[i]) - want->data[i]));
      scale = std::max(scale, std::abs(static_cast<double>(want->data[i])));
    }
    if (diff > 1e-5 * scale)
      return std::string("linear ") + what + " differs from the host ops by " + std::to_string(diff / scale) +
             " (relative)";
  }
  return "";
}

PluginReport probe(const std::string& name, bool check) {
  PluginReport r;
  r.name = name;
  r.kind = "device";
  try {
    auto plugin = runtime::load_device_plugin(name);
    r.path = plugin->path();
    r.devices = plugin->devices();
    r.interface = plugin->interface_version();
    const std::string loaded = "loaded (device interface " + std::to_string(r.interface) + ")";
    r.status = !plugin->unavailable_reason().empty() ? loaded + "; no usable devices: " + plugin->unavailable_reason()
                                                     : loaded + "; " + std::to_string(r.devices.size()) + " device(s)";
    for (std::size_t i = 0; check && i < r.devices.size(); ++i) {
      try {
        plugin->self_test(static_cast<int>(i));
        // Through the op table too, where the plugin has one (interface 2).
        const std::string ops = plugin->v2() ? ops_check(name, static_cast<int>(i)) : "";
        r.checks.push_back(!ops.empty() ? ops : plugin->v2() ? "ok (self-test; linear through the op table)" : "ok");
        if (!ops.empty()) r.failed = true;
      } catch (const Error& e) {
        r.checks.push_back(e.what());
        r.failed = true;
      }
    }
  } catch (const Error& e) {
    r.status = e.what();
    r.failed = check;
  }
  return r;
}

// A communication plugin is loaded, not initialised: `braid info` joins no world (and a
// device one would need a GPU). `load` is the loader of its interface version.
template <typename Load>
PluginReport probe_comm(const std::string& name, Load load, int interface, const std::string& what) {
  PluginReport r;
  r.name = name;
  r.kind = "communication";
  try {
    auto plugin = load(name);
    r.path = plugin->path();
    r.interface = interface;
    r.status = "loaded" + what + "; " + plugin->backend_version();
  } catch (const Error& e) {
    r.status = e.what();
  }
  return r;
}

}  // namespace

int run_info(const std::vector<std::string>& args) {
  std::string format = "table";
  po::options_description opts(
      "usage: braid info [--check] [--format table|json]\n\n"
      "Prints the version, ABI and build options, the plugins found (device plugins — the host\n"
      "backend, and CUDA where built — with the interface version loaded and the devices they see;\n"
      "the communication plugins: MPI with its library, NCCL with its version where CUDA is built) and\n"
      "where they were looked for.\n\noptions");
  opts.add_options()("help,h", "show this help")("check", "run each device's self-test kernel (exit 1 if one fails)")(
      "format,f", po::value(&format)->value_name("FMT"), "table (default) | json");
  po::variables_map vm;
  try {
    po::store(parse_options(args, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "braid info: error: %s\n", e.what());
    return kExitBadInput;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return kExitOk;
  }
  if (format != "table" && format != "json") {
    std::fprintf(stderr, "braid info: error: --format must be table or json\n");
    return kExitBadInput;
  }
  const bool cuda = BRAID_CUDA_ENABLED;
  std::vector<PluginReport> plugins;
  plugins.push_back(probe("host", vm.count("check") > 0));
  if (cuda) plugins.push_back(probe("cuda", vm.count("check") > 0));
  plugins.push_back(probe_comm("mpi", runtime::load_comm_plugin, 1, ""));
  if (cuda)
    plugins.push_back(
        probe_comm("nccl", runtime::load_device_comm_plugin, 2, " (communication interface 2, device memory)"));
  const std::string version = std::to_string(BRAID_VERSION_MAJOR) + "." + std::to_string(BRAID_VERSION_MINOR) + "." +
                              std::to_string(BRAID_VERSION_PATCH);
  if (format == "json") {
    nlohmann::ordered_json j{{"version", version},
                             {"abi_version", BRAID_ABI_VERSION},
                             {"build_type", BRAID_BUILD_TYPE},
                             {"compiler", BRAID_CXX_COMPILER},
                             {"cuda", cuda},
                             {"plugin_path", runtime::plugin_search_path()}};
    j["plugins"] = nlohmann::ordered_json::array();
    for (const auto& p : plugins) {
      nlohmann::ordered_json devices = nlohmann::ordered_json::array();
      for (std::size_t i = 0; i < p.devices.size(); ++i) {
        const auto& d = p.devices[i];
        nlohmann::ordered_json x{
            {"name", d.name},
            {"host_memory", d.host_memory},
            {"memory_gib", d.memory_bytes / (1024.0 * 1024 * 1024)},
            {"multiprocessors", d.multiprocessors},
            {"compute_capability", std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor)}};
        if (i < p.checks.size()) x["self_test"] = p.checks[i];
        devices.push_back(x);
      }
      nlohmann::ordered_json x{{"name", p.name}, {"kind", p.kind}, {"path", p.path}, {"status", p.status}};
      if (p.kind == "device") {
        x["interface"] = p.interface;
        x["devices"] = devices;
      }
      j["plugins"].push_back(x);
    }
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("braid %s\n  ABI version  %d\n  build        %s, %s\n  CUDA         %s\n", version.c_str(),
                BRAID_ABI_VERSION, BRAID_BUILD_TYPE, BRAID_CXX_COMPILER,
                cuda ? "plugin built (nvcc found)" : "not built (no nvcc found, or BRAID_WITH_CUDA=OFF)");
    std::string path;
    for (const auto& dir : runtime::plugin_search_path()) path += (path.empty() ? "" : ":") + dir;
    std::printf("  plugin path  %s\n", path.empty() ? "(none: set BRAID_PLUGIN_PATH)" : path.c_str());
    for (const auto& p : plugins) {
      std::printf("  plugin %-5s %s%s%s\n", p.name.c_str(), p.status.c_str(), p.path.empty() ? "" : "\n               ",
                  p.path.c_str());
      for (std::size_t i = 0; i < p.devices.size(); ++i) {
        const auto& d = p.devices[i];
        const char* check_label = i < p.checks.size() ? ", self-test: " : "";
        const char* check = i < p.checks.size() ? p.checks[i].c_str() : "";
        if (d.host_memory)
          std::printf("    [%zu] %s, host memory%s%s\n", i, d.name.c_str(), check_label, check);
        else
          std::printf("    [%zu] %s, %.1f GiB, %d SMs, compute %d.%d%s%s\n", i, d.name.c_str(),
                      d.memory_bytes / (1024.0 * 1024 * 1024), d.multiprocessors, d.compute_major, d.compute_minor,
                      check_label, check);
      }
    }
  }
  for (const auto& p : plugins) {
    if (p.failed) return kExitInternal;
  }
  return kExitOk;
}

}  // namespace braid::cli
