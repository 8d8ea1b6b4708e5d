#include "core/runtime/plugin_loader.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/common/error.hpp"

namespace braid::runtime {

DevicePlugin::~DevicePlugin() {
  if (v2_ && v2_->finalize) v2_->finalize();
  if (v1_ && v1_->finalize) v1_->finalize();
  if (handle_) dlclose(handle_);
}

namespace {

// One device's properties through either interface version (v1's struct is v2's prefix
// but for host_memory, so each is asked with its own struct).
DeviceInfo properties(const braid_device_plugin_v1* v1, const braid_device_plugin_v2* v2, int32_t i) {
  char error[512] = "";
  DeviceInfo d;
  int rc = 0;
  if (v2) {
    braid_device_properties_v2 p{};
    p.struct_size = sizeof p;
    rc = v2->device_properties(i, &p, error, sizeof error);
    d = {p.name, double(p.memory_bytes), p.multiprocessors, p.compute_major, p.compute_minor, p.host_memory != 0};
  } else {
    braid_device_properties_v1 p{};
    p.struct_size = sizeof p;
    rc = v1->device_properties(i, &p, error, sizeof error);
    d = {p.name, double(p.memory_bytes), p.multiprocessors, p.compute_major, p.compute_minor, false};
  }
  if (rc != 0) {
    throw Error(Status::plugin,
                std::string(v2 ? v2->name : v1->name) + " plugin: device " + std::to_string(i) + ": " + error);
  }
  return d;
}

}  // namespace

std::vector<DeviceInfo> DevicePlugin::devices() const {
  if (!unavailable_.empty()) return {};
  char error[512] = "";
  int32_t count = 0;
  if ((v2_ ? v2_->device_count(&count, error, sizeof error) : v1_->device_count(&count, error, sizeof error)) != 0) {
    throw Error(Status::plugin, std::string(name()) + " plugin: " + error);
  }
  std::vector<DeviceInfo> out;
  for (int32_t i = 0; i < count; ++i) out.push_back(properties(v1_, v2_, i));
  return out;
}

void DevicePlugin::self_test(int index) const {
  char error[512] = "";
  if ((v2_ ? v2_->self_test(index, error, sizeof error) : v1_->self_test(index, error, sizeof error)) != 0) {
    throw Error(Status::plugin,
                std::string(name()) + " plugin: self-test on device " + std::to_string(index) + " failed: " + error);
  }
}

namespace {

// The file of the binary that holds this code, links resolved. dladdr names a shared library
// by its path, but the main program as it was started (argv[0]): a bare name, `braid` found on
// PATH, would resolve against the working directory, so the kernel is asked where the program
// is. A path through a symbolic link (/usr/local/bin/braid -> /opt/braid/bin/braid) is
// followed to the file, beside which the install's plugins are.
std::filesystem::path binary_holding_this_code() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&binary_holding_this_code), &info) || !info.dli_fname) return {};
  const std::string name = info.dli_fname;
  std::error_code error;
  if (name.find('/') != std::string::npos) {
    const std::filesystem::path resolved = std::filesystem::canonical(name, error);
    return error ? std::filesystem::absolute(name) : resolved;
  }
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::filesystem::path() : exe;
}

}  // namespace

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
  if (const std::filesystem::path binary = binary_holding_this_code(); !binary.empty()) {
    const auto here = binary.parent_path();
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
  // The first file found is the plugin: one that cannot be used is an error, never skipped for
  // a later one (a BRAID_PLUGIN_PATH the user set would be ignored without a word).
  const auto unusable = [&](const std::string& path, const std::string& why) {
    return Error(Status::plugin, path + ": " + why + "\n(braid loads the first " + file +
                                     " on its search path: BRAID_PLUGIN_PATH, then the folders next to its binary)");
  };
  for (const auto& dir : plugin_search_path()) {
    const std::string path = (std::filesystem::path(dir) / file).string();
    if (!std::filesystem::exists(path)) {
      tried += "\n  " + path + ": not found";
      continue;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = dlerror();
      throw unusable(path, std::string("cannot load: ") + (e ? e : "unknown dlopen error"));
    }
    const void* api = dlsym(handle, symbol);
    if (!api) {
      dlclose(handle);
      throw unusable(
          path, std::string("does not export ") + symbol + " (not a braid " + kind + " plugin, or another version)");
    }
    if (std::string why = check(api); !why.empty()) {
      dlclose(handle);
      throw unusable(path, "incompatible: " + why);
    }
    return {handle, api, path};
  }
  throw Error(Status::plugin, "no usable " + file + " (set BRAID_PLUGIN_PATH to the folder that holds it):" + tried);
}

namespace {

// v2 needs every memory, stream and event function and an op table whose entries match
// supports(); v1 its four functions.
std::string check_v2(const void* p) {
  auto* api = static_cast<const braid_device_plugin_v2*>(p);
  if (api->interface_version != 2) return "interface version " + std::to_string(api->interface_version);
  const void* required[] = {reinterpret_cast<const void*>(api->init),
                            reinterpret_cast<const void*>(api->device_count),
                            reinterpret_cast<const void*>(api->device_properties),
                            reinterpret_cast<const void*>(api->self_test),
                            reinterpret_cast<const void*>(api->alloc),
                            reinterpret_cast<const void*>(api->free),
                            reinterpret_cast<const void*>(api->memory_stats),
                            reinterpret_cast<const void*>(api->copy),
                            reinterpret_cast<const void*>(api->memset_zero),
                            reinterpret_cast<const void*>(api->stream_create),
                            reinterpret_cast<const void*>(api->stream_destroy),
                            reinterpret_cast<const void*>(api->stream_wrap),
                            reinterpret_cast<const void*>(api->stream_synchronize),
                            reinterpret_cast<const void*>(api->event_create),
                            reinterpret_cast<const void*>(api->event_destroy),
                            reinterpret_cast<const void*>(api->event_record),
                            reinterpret_cast<const void*>(api->stream_wait_event),
                            reinterpret_cast<const void*>(api->event_synchronize),
                            reinterpret_cast<const void*>(api->supports),
                            reinterpret_cast<const void*>(api->attention_saved_shape),
                            api->ops};
  for (const void* f : required)
    if (!f) return "a version-2 table with missing functions";
  return "";
}

std::string check_v1(const void* p) {
  auto* api = static_cast<const braid_device_plugin_v1*>(p);
  if (api->interface_version != 1 || !api->init || !api->device_count || !api->device_properties || !api->self_test) {
    return "interface version " + std::to_string(api->interface_version) +
           " or missing functions (this braid reads version 1)";
  }
  return "";
}

}  // namespace

std::unique_ptr<DevicePlugin> load_device_plugin(const std::string& name) {
  std::unique_ptr<DevicePlugin> plugin(new DevicePlugin());
  PluginLibrary lib;
  try {
    lib = open_plugin(name, BRAID_DEVICE_PLUGIN_SYMBOL_V2, "device", check_v2);
    plugin->v2_ = static_cast<const braid_device_plugin_v2*>(lib.api);
  } catch (const Error& newest) {
    try {
      lib = open_plugin(name, BRAID_DEVICE_PLUGIN_SYMBOL_V1, "device", check_v1);
      plugin->v1_ = static_cast<const braid_device_plugin_v1*>(lib.api);
    } catch (const Error& older) {
      throw Error(Status::plugin,
                  std::string(older.what()) + "\n(version 2 was looked for first: " + newest.what() + ")");
    }
  }
  plugin->handle_ = lib.handle;
  plugin->path_ = lib.path;
  char error[512] = "";
  const int rc = plugin->v2_ ? plugin->v2_->init(error, sizeof error) : plugin->v1_->init(error, sizeof error);
  if (rc != 0) plugin->unavailable_ = error[0] ? error : "initialisation failed";
  return plugin;
}

}  // namespace braid::runtime
