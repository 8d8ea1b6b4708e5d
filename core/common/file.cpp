#include "core/common/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/common/error.hpp"

namespace braid {

namespace fs = std::filesystem;

std::string file_behind(const std::string& path) {
  fs::path at(path);
  std::error_code ec;
  // Link by link, so that a dangling link names the file it will create; as the kernel, at
  // most 40 links.
  for (int hops = 0; hops < 40 && fs::is_symlink(at, ec); ++hops) {
    const fs::path target = fs::read_symlink(at, ec);
    if (ec) break;
    at = target.is_relative() ? at.parent_path() / target : target;
  }
  return at.string();
}

bool is_special_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

bool same_path(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  const fs::path pa = fs::weakly_canonical(fs::absolute(a, ea), ea), pb = fs::weakly_canonical(fs::absolute(b, eb), eb);
  if (ea || eb) return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
  return pa / "" == pb / "";  // "ckpt/" and "ckpt" alike
}

void write_file_atomically(const std::string& given, const std::string& text, const std::string& what) {
  const std::string path = file_behind(given);
  if (is_special_file(path)) {  // /dev/null, /dev/stdout, a FIFO: no rename can replace one
    std::ofstream out(path, std::ios::binary);
    out << text;
    out.flush();
    if (!out) throw Error(Status::io, "cannot write the " + what + " to '" + given + "': " + std::strerror(errno));
    return;
  }
  // A name of its own, so concurrent writers of one path do not collide before the rename.
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      const int error = errno;  // before the checks below set their own
      const std::string why = unwritable_reason(given);
      throw Error(Status::io,
                  "cannot write the " + what + " to '" + given + "': " + (why.empty() ? std::strerror(error) : why));
    }
    out << text;
    out.flush();
    if (!out) {
      const int error = errno;
      fs::remove(tmp);
      throw Error(Status::io, "error while writing the " + what + " to '" + given + "': " + std::strerror(error));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    throw Error(Status::io, "cannot move the " + what + " into place at '" + given + "': " + ec.message());
  }
}

std::string unwritable_reason(const std::string& given) {
  if (given.empty()) return "no file name given";
  const std::string path = file_behind(given);
  if (is_special_file(path)) return ::access(path.c_str(), W_OK) == 0 ? "" : "it is not writable";
  const fs::path target(path), dir = target.has_parent_path() ? target.parent_path() : ".";
  std::error_code ec;
  if (fs::is_directory(target, ec)) return "it is a directory";
  if (!fs::is_directory(dir, ec)) return "no directory '" + dir.string() + "'";
  if (::access(dir.c_str(), W_OK) != 0) return "directory '" + dir.string() + "' is not writable";
  // access() grants root everything, and a file system may still refuse files (/proc): try one.
  const std::string probe = (dir / (".braid-probe." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create a file in '" + dir.string() + "': " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

}  // namespace braid
