// A communication plugin (libbraid-<name>.so exporting braidCommPlugin_v1, see
// plugins/include/braid_comm_v1.h) loaded through the plugin search path. World and
// Communicator (world.hpp, communicator.hpp) are the C++ side most code uses.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "plugins/include/braid_comm_v1.h"

namespace braid::runtime {

class CommPlugin {
 public:
  // Finalizes (when initialised) and unloads; the library stays mapped (RTLD_NODELETE)
  // because MPI cannot be unloaded and started again in one process.
  ~CommPlugin();
  CommPlugin(const CommPlugin&) = delete;
  CommPlugin& operator=(const CommPlugin&) = delete;

  const std::string& path() const { return path_; }
  const char* name() const { return api_.name; }
  // "Open MPI v4.1.4, ..."
  std::string backend_version() const { return api_.backend_version(); }
  // The plugin's table; optional functions it predates are NULL (braid_comm_v1.h).
  const braid_comm_plugin_v1& api() const { return api_; }

  // Joins the launcher's world (api().init); throws Error(Status::plugin) with the plugin's reason.
  void init();
  bool initialised() const { return initialised_; }
  // Throws Error(Status::plugin, "<name> plugin: <what>: <last_error>") when `code` is not 0.
  void check(int code, const std::string& what) const;

 private:
  friend std::shared_ptr<CommPlugin> load_comm_plugin(const std::string&);
  CommPlugin() = default;
  void* handle_ = nullptr;
  braid_comm_plugin_v1 api_{};  // a copy of the exported table's bytes, the rest zero
  std::string path_;
  bool initialised_ = false;
};

// Why `api` cannot be used by this braid ("interface version 2, ..."), or "". `bytes`: the
// size of the exported table, which is shorter when built against an older braid_comm_v1.h.
std::string comm_plugin_incompatibility(const braid_comm_plugin_v1& api,
                                        std::size_t bytes = sizeof(braid_comm_plugin_v1));
// Loads libbraid-<name>.so (not yet initialised); throws Error(Status::plugin) naming every
// file tried and why: not found, not loadable, no braidCommPlugin_v1, wrong version.
std::shared_ptr<CommPlugin> load_comm_plugin(const std::string& name);

}  // namespace braid::runtime
