#include "core/runtime/plugin_loader.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/common/error.hpp"

namespace braid::runtime {

DevicePlugin::~DevicePlugin() {
  if (api_ && api_->finalize) api_->finalize();
  if (handle_) dlclose(handle_);
}

std::vector<DeviceInfo> DevicePlugin::devices() const {
  if (!unavailable_.empty()) return {};
  char error[512] = "";
  int32_t count = 0;
  if (api_->device_count(&count, error, sizeof error) != 0) {
    throw Error(Status::plugin, std::string(api_->name) + " plugin: " + error);
  }
  std::vector<DeviceInfo> out;
  for (int32_t i = 0; i < count; ++i) {
    braid_device_properties_v1 p{};
    p.struct_size = sizeof p;
    if (api_->device_properties(i, &p, error, sizeof error) != 0) {
      throw Error(Status::plugin, std::string(api_->name) + " plugin: device " + std::to_string(i) + ": " + error);
    }
    out.push_back({p.name, double(p.memory_bytes), p.multiprocessors, p.compute_major, p.compute_minor});
  }
  return out;
}

void DevicePlugin::self_test(int index) const {
  char error[512] = "";
  if (api_->self_test(index, error, sizeof error) != 0) {
    throw Error(Status::plugin, std::string(api_->name) + " plugin: self-test on device " + std::to_string(index) +
                                    " failed: " + error);
  }
}

std::vector<std::string> plugin_search_path() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("BRAID_PLUGIN_PATH")) {
    std::string all = env;
    for (std::size_t start = 0; start <= all.size();) {
      std::size_t end = all.find(':', start);
      if (end == std::string::npos) end = all.size();
      if (end > start) dirs.push_back(all.substr(start, end - start));
      start = end + 1;
    }
  }
  // Next to the binary that holds this code: build/tools/braid and build/capi/libbraid.so
  // find build/plugins; an installed <libdir>/libbraid.so finds <libdir>/braid, and
  // <bindir>/braid finds it through the install layout's relative path (../lib/braid).
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&plugin_search_path), &info) && info.dli_fname) {
    auto here = std::filesystem::absolute(info.dli_fname).parent_path();
    for (const char* rel : {"../plugins", "braid", BRAID_PLUGIN_DIR_FROM_BINDIR}) {
      auto dir = (here / rel).lexically_normal().string();
      if (std::filesystem::is_directory(dir) && std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) {
        dirs.push_back(dir);
      }
    }
  }
  return dirs;
}

PluginLibrary open_plugin(const std::string& name, const char* symbol, const char* kind,
                          const std::function<std::string(const void*)>& check) {
  const std::string file = "libbraid-" + name + ".so";
  std::string tried;
  for (const auto& dir : plugin_search_path()) {
    const std::string path = (std::filesystem::path(dir) / file).string();
    if (!std::filesystem::exists(path)) {
      tried += "\n  " + path + ": not found";
      continue;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = dlerror();
      tried += "\n  " + path + ": cannot load: " + (e ? e : "unknown dlopen error");
      continue;
    }
    const void* api = dlsym(handle, symbol);
    if (!api) {
      dlclose(handle);
      tried += "\n  " + path + ": does not export " + symbol + " (not a braid " + kind + " plugin, or another version)";
      continue;
    }
    if (std::string why = check(api); !why.empty()) {
      dlclose(handle);
      tried += "\n  " + path + ": incompatible: " + why;
      continue;
    }
    return {handle, api, path};
  }
  throw Error(Status::plugin, "no usable " + file + " (set BRAID_PLUGIN_PATH to the folder that holds it):" + tried);
}

std::unique_ptr<DevicePlugin> load_device_plugin(const std::string& name) {
  PluginLibrary lib = open_plugin(name, BRAID_DEVICE_PLUGIN_SYMBOL_V1, "device", [](const void* p) -> std::string {
    auto* api = static_cast<const braid_device_plugin_v1*>(p);
    if (api->interface_version != 1 || !api->init || !api->device_count || !api->device_properties || !api->self_test) {
      return "interface version " + std::to_string(api->interface_version) +
             " or missing functions (this braid reads version 1)";
    }
    return "";
  });
  std::unique_ptr<DevicePlugin> plugin(new DevicePlugin());
  plugin->handle_ = lib.handle;
  plugin->api_ = static_cast<const braid_device_plugin_v1*>(lib.api);
  plugin->path_ = lib.path;
  char error[512] = "";
  if (plugin->api_->init(error, sizeof error) != 0) plugin->unavailable_ = error[0] ? error : "initialisation failed";
  return plugin;
}

}  // namespace braid::runtime
