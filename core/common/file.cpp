#include "core/common/file.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "core/common/error.hpp"

namespace braid {

void write_file_atomically(const std::string& path, const std::string& text, const std::string& what) {
  // A name of its own, so concurrent writers of one path do not collide before the rename.
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(Status::io, "cannot write the " + what + " to '" + tmp + "'");
    out << text;
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp);
      throw Error(Status::io, "error while writing the " + what + " to '" + tmp + "'");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw Error(Status::io, "cannot move the " + what + " into place at '" + path + "': " + ec.message());
  }
}

}  // namespace braid
