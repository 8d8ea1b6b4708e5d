// Finds and loads backend plugins (libbraid-<name>.so) with dlopen: from
// BRAID_PLUGIN_PATH (colon-separated folders), then the plugin folder of the build
// tree or install prefix next to the running binary. Reports every place it looked
// and why each candidate failed.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plugins/include/braid_device_v1.h"
#include "plugins/include/braid_device_v2.h"

namespace braid::runtime {

struct DeviceInfo {
  std::string name;
  double memory_bytes = 0;
  int multiprocessors = 0;
  int compute_major = 0, compute_minor = 0;
  bool host_memory = false;  // the device's memory is host memory (the host backend)
};

// A loaded device plugin, through the newest interface it exports (v2: memory, streams
// and ops; v1: devices and a self-test only); unloads (after finalize) when destroyed.
class DevicePlugin {
 public:
  ~DevicePlugin();
  DevicePlugin(const DevicePlugin&) = delete;
  DevicePlugin& operator=(const DevicePlugin&) = delete;

  const std::string& path() const { return path_; }
  const char* name() const { return v2_ ? v2_->name : v1_->name; }
  int interface_version() const { return v2_ ? 2 : 1; }
  // The v2 table, or null for a v1-only plugin.
  const braid_device_plugin_v2* v2() const { return v2_; }
  // Devices it sees; throws Error(Status::plugin) with the plugin's reason when it cannot tell.
  std::vector<DeviceInfo> devices() const;
  // Why the plugin has no usable devices ("no CUDA driver ..."), or "" when it initialised.
  const std::string& unavailable_reason() const { return unavailable_; }
  // Runs the plugin's self-test kernel on a device; throws with its reason on failure.
  void self_test(int index) const;

 private:
  friend std::unique_ptr<DevicePlugin> load_device_plugin(const std::string&);
  DevicePlugin() = default;
  void* handle_ = nullptr;
  const braid_device_plugin_v1* v1_ = nullptr;
  const braid_device_plugin_v2* v2_ = nullptr;
  std::string path_, unavailable_;
};

// Folders searched for plugins, in order.
std::vector<std::string> plugin_search_path();

// A plugin library opened with dlopen and the interface struct it exports.
struct PluginLibrary {
  void* handle = nullptr;
  const void* api = nullptr;
  std::string path;
};
// Opens the first libbraid-<name>.so on the search path, which must export `symbol` with a
// struct `check` accepts (it returns "" or why not: "interface version 2, ..."). Throws
// Error(Status::plugin) naming that file and why it cannot be used (a later one is never
// tried: the user's BRAID_PLUGIN_PATH would be ignored silently), or every place looked in.
PluginLibrary open_plugin(const std::string& name, const char* symbol, const char* kind,
                          const std::function<std::string(const void* api)>& check);
// Loads libbraid-<name>.so through v2, else v1; throws Error(Status::plugin) naming every
// file tried and why.
std::unique_ptr<DevicePlugin> load_device_plugin(const std::string& name);

}  // namespace braid::runtime
