#include "core/common/file.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
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
    if (!out) {
      const int error = errno;  // before the checks below set their own
      const std::string why = unwritable_reason(path);
      throw Error(Status::io,
                  "cannot write the " + what + " to '" + path + "': " + (why.empty() ? std::strerror(error) : why));
    }
    out << text;
    out.flush();
    if (!out) {
      const int error = errno;
      std::filesystem::remove(tmp);
      throw Error(Status::io, "error while writing the " + what + " to '" + path + "': " + std::strerror(error));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw Error(Status::io, "cannot move the " + what + " into place at '" + path + "': " + ec.message());
  }
}

std::string unwritable_reason(const std::string& path) {
  const std::filesystem::path target(path), dir = target.has_parent_path() ? target.parent_path() : ".";
  std::error_code ec;
  if (std::filesystem::is_directory(target, ec)) return "it is a directory";
  if (!std::filesystem::is_directory(dir, ec)) return "no directory '" + dir.string() + "'";
  if (::access(dir.c_str(), W_OK) != 0) return "directory '" + dir.string() + "' is not writable";
  return "";
}

}  // namespace braid
