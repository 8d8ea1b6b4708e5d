#include "core/runtime/comm_plugin.hpp"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/common/error.hpp"
#include "core/runtime/plugin_loader.hpp"

namespace braid::runtime {
namespace {

// Version 1 without its optional functions: what every plugin exports at least.
constexpr std::size_t kRequiredBytes = offsetof(braid_comm_plugin_v1, ireduce_scatter);

// The size of the exported object at `object` (its ELF symbol's st_size): how much of
// braid_comm_plugin_v1 the plugin was built with. kRequiredBytes when the symbol table
// does not say, so that no optional function is read.
std::size_t exported_bytes(const void* object) {
  Dl_info info{};
  void* entry = nullptr;
  if (dladdr1(object, &info, &entry, RTLD_DL_SYMENT) == 0 || !entry || info.dli_saddr != object) return kRequiredBytes;
  const auto* symbol = static_cast<const ElfW(Sym)*>(entry);
  return symbol->st_size != 0 ? symbol->st_size : kRequiredBytes;
}

}  // namespace

CommPlugin::~CommPlugin() {
  if (initialised_) api_.finalize();
  if (handle_) dlclose(handle_);
}

void CommPlugin::init() {
  if (initialised_) return;
  if (api_.init() != 0) {
    const char* why = api_.last_error();
    throw Error(Status::plugin, std::string(api_.name) + " plugin " + path_ +
                                    " failed to start: " + (why && why[0] ? why : "no message"));
  }
  initialised_ = true;
}

void CommPlugin::check(int code, const std::string& what) const {
  if (code == 0) return;
  const char* why = api_.last_error();
  throw Error(Status::plugin, std::string(api_.name) + " plugin: " + what + " failed (code " + std::to_string(code) +
                                  "): " + (why && why[0] ? why : "no message"));
}

std::string comm_plugin_incompatibility(const braid_comm_plugin_v1& api, std::size_t bytes) {
  // Read nothing past the version before it matches: another version's struct may be shorter.
  if (api.interface_version != 1) {
    return "interface version " + std::to_string(api.interface_version) + ", this braid reads version 1";
  }
  if (bytes < kRequiredBytes) {
    return "its table is " + std::to_string(bytes) + " bytes, version 1 has " + std::to_string(kRequiredBytes) +
           " before its optional functions";
  }
  if (!api.name) return "name is NULL";
  const std::pair<const char*, bool> functions[] = {{"last_error", api.last_error != nullptr},
                                                    {"backend_version", api.backend_version != nullptr},
                                                    {"init", api.init != nullptr},
                                                    {"finalize", api.finalize != nullptr},
                                                    {"world", api.world != nullptr},
                                                    {"comm_world", api.comm_world != nullptr},
                                                    {"comm_create", api.comm_create != nullptr},
                                                    {"comm_free", api.comm_free != nullptr},
                                                    {"comm_rank", api.comm_rank != nullptr},
                                                    {"comm_size", api.comm_size != nullptr},
                                                    {"isend", api.isend != nullptr},
                                                    {"irecv", api.irecv != nullptr},
                                                    {"iallreduce", api.iallreduce != nullptr},
                                                    {"iallgather", api.iallgather != nullptr},
                                                    {"ibroadcast", api.ibroadcast != nullptr},
                                                    {"test", api.test != nullptr},
                                                    {"wait", api.wait != nullptr},
                                                    {"barrier", api.barrier != nullptr},
                                                    {"abort", api.abort != nullptr}};
  for (const auto& [function, present] : functions) {
    if (!present)
      return std::string("function ") + function + " is NULL (version 1 requires every function up to abort)";
  }
  return "";
}

std::shared_ptr<CommPlugin> load_comm_plugin(const std::string& name) {
  PluginLibrary lib = open_plugin(name, BRAID_COMM_PLUGIN_SYMBOL_V1, "communication", [](const void* api) {
    return comm_plugin_incompatibility(*static_cast<const braid_comm_plugin_v1*>(api), exported_bytes(api));
  });
  // Pinned once accepted: MPI cannot be unloaded and started again in one process.
  if (void* pin = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD | RTLD_NODELETE)) dlclose(pin);
  std::shared_ptr<CommPlugin> plugin(new CommPlugin());
  plugin->handle_ = lib.handle;
  // Only the bytes the plugin has: past them lies another object, not NULL (braid_comm_v1.h).
  std::memcpy(&plugin->api_, lib.api, std::min(exported_bytes(lib.api), sizeof(braid_comm_plugin_v1)));
  plugin->path_ = lib.path;
  return plugin;
}

}  // namespace braid::runtime
