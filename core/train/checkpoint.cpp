// Checkpoint directories: durable writes, the commit record, pruning, reading and the
// newest-valid scan.
#include "core/train/checkpoint.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

namespace braid::train {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSuffix = ".braidckpt";
constexpr std::string_view kTmp = ".tmp";
constexpr std::size_t kManifestEntry = 12;  // u64 size, u32 checksum

std::string in_dir(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string step_label(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::uint32_t load_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::uint64_t load_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

void check_step(std::int64_t step, int rank, int world) {
  if (step < 0) throw Error(Status::invalid_argument, "checkpoint: negative step " + std::to_string(step));
  if (world < 1 || rank < 0 || rank >= world)
    throw Error(Status::invalid_argument,
                "checkpoint: rank " + std::to_string(rank) + " of world " + std::to_string(world) + " is out of range");
}

// A file descriptor closed on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

void require_directory(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) throw Error(Status::io, "checkpoint directory '" + dir + "' does not exist");
    throw Error(Status::io, "checkpoint directory '" + dir + "': " + std::strerror(err));
  }
  if (!S_ISDIR(st.st_mode)) throw Error(Status::io, "checkpoint directory '" + dir + "' is not a directory");
}

void sync_directory(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0)
    throw Error(Status::io, "cannot sync checkpoint directory '" + dir + "': " + std::strerror(errno));
}

// `bytes` into dir/name: written to name.tmp, fsynced, renamed, directory fsynced. On any
// failure the temp file is removed and whatever `name` held before is untouched.
void write_durably(const std::string& dir, const std::string& name, std::string_view bytes) {
  require_directory(dir);
  const std::string path = in_dir(dir, name);
  const std::string tmp = path + std::string(kTmp);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw Error(Status::io, "cannot create checkpoint file '" + tmp + "': " + std::strerror(errno));
  auto fail = [&](const std::string& what, int err) {
    ::close(fd.release());
    ::unlink(tmp.c_str());
    throw Error(Status::io, what + ": " + std::strerror(err));
  };
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t chunk = std::min<std::size_t>(bytes.size() - done, std::size_t{1} << 30);
    const ssize_t n = ::write(fd.get(), bytes.data() + done, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write checkpoint file '" + tmp + "'", n < 0 ? errno : EIO);
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0) fail("cannot sync checkpoint file '" + tmp + "'", errno);
  if (::close(fd.release()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(Status::io, "cannot close checkpoint file '" + tmp + "': " + std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(Status::io, "cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(err));
  }
  sync_directory(dir);
}

// `path` opened for reading; CheckpointError(io) naming it otherwise (`missing`: the reason
// when it does not exist).
int open_for_reading(const std::string& path, const std::string& missing) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw CheckpointError(Status::io, path,
                          err == ENOENT ? missing : std::string("cannot open: ") + std::strerror(err));
  }
  return fd;
}

std::uint64_t file_size(const Fd& fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw CheckpointError(Status::io, path, std::string("cannot stat: ") + std::strerror(errno));
  return static_cast<std::uint64_t>(st.st_size);
}

// The header of an open checkpoint file of `size` bytes.
CheckpointHeader read_header(const Fd& fd, std::uint64_t size, const std::string& path) {
  char head[kCheckpointHeaderBytes] = {};
  const ssize_t h = ::pread(fd.get(), head, sizeof head, 0);
  return decode_checkpoint_header(std::string_view(head, h > 0 ? static_cast<std::size_t>(h) : 0), size, path);
}

std::string read_whole(const std::string& path) {
  const Fd fd(open_for_reading(path, "missing"));
  std::string bytes(static_cast<std::size_t>(file_size(fd, path)), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw CheckpointError(Status::io, path, std::string("cannot read: ") + std::strerror(errno));
    if (n == 0) throw CheckpointError(Status::io, path, "shrank while being read");
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}

// What a file is, from its name: "step-N.braidckpt" (the commit record), "step-N.rank-R.braidckpt"
// (a shard), either with ".tmp" (a write in progress or interrupted).
struct FileName {
  std::int64_t step = 0;
  int rank = -1;  // -1: the commit record
  bool tmp = false;
};

bool parse_number(std::string_view& s, std::int64_t& out) {
  std::size_t n = 0;
  while (n < s.size() && n < 18 && s[n] >= '0' && s[n] <= '9') ++n;
  if (n == 0 || (n < s.size() && s[n] >= '0' && s[n] <= '9')) return false;
  std::from_chars(s.data(), s.data() + n, out);
  s.remove_prefix(n);
  return true;
}

std::optional<FileName> parse_file_name(std::string_view s) {
  FileName f;
  if (!s.starts_with("step-")) return std::nullopt;
  s.remove_prefix(5);
  if (!parse_number(s, f.step)) return std::nullopt;
  if (s.starts_with(".rank-")) {
    s.remove_prefix(6);
    std::int64_t rank = 0;
    if (!parse_number(s, rank) || rank > 1'000'000'000) return std::nullopt;
    f.rank = static_cast<int>(rank);
  }
  if (!s.starts_with(kSuffix)) return std::nullopt;
  s.remove_prefix(kSuffix.size());
  f.tmp = s == kTmp;
  if (!f.tmp && !s.empty()) return std::nullopt;
  return f;
}

struct StepFiles {
  bool committed = false;          // step-N.braidckpt is there
  std::vector<std::string> files;  // every file of the step, ".tmp" included
  std::set<int> shards;
};

// The checkpoint files in `dir` by step; empty when `dir` does not exist.
std::map<std::int64_t, StepFiles> list_steps(const std::string& dir) {
  std::map<std::int64_t, StepFiles> steps;
  std::error_code ec;
  if (!fs::exists(dir, ec) && !ec) return steps;
  fs::directory_iterator it(dir, ec);
  if (ec) throw Error(Status::io, "cannot list checkpoint directory '" + dir + "': " + ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto f = parse_file_name(name);
    if (!f) continue;
    StepFiles& s = steps[f->step];
    s.files.push_back(name);
    if (f->tmp) continue;
    if (f->rank < 0)
      s.committed = true;
    else
      s.shards.insert(f->rank);
  }
  if (ec) throw Error(Status::io, "cannot list checkpoint directory '" + dir + "': " + ec.message());
  return steps;
}

void expect_identity(const std::string& path, const CheckpointFile& f, std::int64_t step, int rank, int world,
                     CheckpointKind kind) {
  if (f.world != world)
    throw CheckpointError(Status::bad_config, path,
                          "written by " + std::to_string(f.world) + (f.world == 1 ? " rank" : " ranks") +
                              "; this run has " + std::to_string(world));
  if (f.step != step)
    throw CheckpointError(Status::bad_config, path,
                          "holds step " + std::to_string(f.step) + ", its name says " + std::to_string(step));
  if (f.kind != kind)
    throw CheckpointError(
        Status::bad_config, path,
        kind == CheckpointKind::manifest ? "is a shard, not a manifest" : "is a manifest, not a shard");
  if (f.rank != rank)
    throw CheckpointError(Status::bad_config, path,
                          "holds rank " + std::to_string(f.rank) + "'s shard, not rank " + std::to_string(rank) + "'s");
}

std::string manifest_entry(std::uint64_t size, std::uint32_t checksum) {
  std::string e;
  for (int i = 0; i < 8; ++i) e.push_back(static_cast<char>((size >> (8 * i)) & 0xFFu));
  for (int i = 0; i < 4; ++i) e.push_back(static_cast<char>((checksum >> (8 * i)) & 0xFFu));
  return e;
}

// Size and stored checksum of a shard, its header checked, without reading its body.
std::string shard_entry(const std::string& path, std::int64_t step, int rank, int world) {
  const Fd fd(open_for_reading(path, "missing: did rank " + std::to_string(rank) + " finish write_shard?"));
  const std::uint64_t size = file_size(fd, path);
  const CheckpointHeader header = read_header(fd, size, path);
  char tail[4] = {};
  if (header.kind != CheckpointKind::shard || header.step != step || header.rank != rank || header.world != world)
    throw CheckpointError(Status::bad_config, path,
                          "header says step " + std::to_string(header.step) + ", rank " + std::to_string(header.rank) +
                              " of " + std::to_string(header.world));
  if (::pread(fd.get(), tail, sizeof tail, static_cast<off_t>(size - sizeof tail)) != static_cast<ssize_t>(sizeof tail))
    throw CheckpointError(Status::io, path, std::string("cannot read its checksum: ") + std::strerror(errno));
  return manifest_entry(size, load_u32(tail));
}

void remove_step(const std::string& dir, std::int64_t step, const StepFiles& files) {
  // The commit record first: a step half deleted reads as uncommitted, never as valid.
  std::vector<std::string> order = files.files;
  std::stable_partition(order.begin(), order.end(),
                        [&](const std::string& n) { return n == checkpoint_file_name(step); });
  for (const auto& name : order) {
    const std::string path = in_dir(dir, name);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      throw Error(Status::io, "cannot delete old checkpoint file '" + path + "': " + std::strerror(errno) +
                                  " (the new checkpoint is complete)");
  }
}

// The world that wrote committed checkpoint `step`, from its commit record's header (a
// shard for world 1, the manifest otherwise); read_shard validates the rest.
int committed_world(const std::string& dir, std::int64_t step) {
  const std::string record = in_dir(dir, checkpoint_file_name(step));
  const Fd fd(open_for_reading(record, "missing"));
  return read_header(fd, file_size(fd, record), record).world;
}

// latest_valid for `world` ranks, or (nullopt) for the world each checkpoint records.
// Reads every file of committed checkpoint `step` as `world` ranks wrote it (its commit
// record's world when none is given); CheckpointError at the first that does not check out.
// Returns the world.
int read_every_shard(const std::string& dir, std::int64_t step, std::optional<int> world) {
  const int w = world ? *world : committed_world(dir, step);
  for (int r = 0; r < w; ++r) read_shard(dir, step, r, w);
  return w;
}

bool validates(const std::string& dir, std::int64_t step) {
  try {
    read_every_shard(dir, step, std::nullopt);
    return true;
  } catch (const CheckpointError&) {
    return false;
  }
}

CheckpointScan scan_checkpoints(const std::string& dir, std::optional<int> world) {
  CheckpointScan scan;
  const auto steps = list_steps(dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const auto& [step, files] = *it;
    if (!files.committed) {
      if (!files.shards.empty())
        scan.skipped.push_back({step, checkpoint_file_name(step),
                                "missing: never committed (a rank stopped before the checkpoint was complete)", false});
      continue;  // only .tmp leftovers: an interrupted write, not a checkpoint
    }
    try {
      scan.world = read_every_shard(dir, step, world);
      scan.step = step;
      return scan;
    } catch (const CheckpointError& e) {
      scan.skipped.push_back({step, fs::path(e.path()).filename().string(), e.reason()});
    }
  }
  return scan;
}

}  // namespace

std::string checkpoint_file_name(std::int64_t step) { return step_label(step) + std::string(kSuffix); }

std::string shard_file_name(std::int64_t step, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, ".rank-%04d", rank);
  return step_label(step) + buf + std::string(kSuffix);
}

void create_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::is_symlink(dir, ec) && !fs::exists(dir, ec))
    throw Error(Status::io, "cannot use checkpoint directory '" + dir + "': it is a link to '" +
                                fs::read_symlink(dir, ec).string() + "', which does not exist");
  fs::create_directories(dir, ec);
  if (ec) throw Error(Status::io, "cannot create checkpoint directory '" + dir + "': " + ec.message());
  require_directory(dir);
}

CheckpointDirLock::CheckpointDirLock(const std::string& dir) {
  const std::string path = in_dir(dir, ".lock");
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(Status::io, "cannot open the checkpoint directory's lock '" + path + "': " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw Error(Status::invalid_argument, "checkpoint directory '" + dir + "' is in use by another run (it holds " +
                                                path + "): give each run its own --checkpoint-dir");
    throw Error(Status::io, "cannot lock '" + path + "': " + std::strerror(err));
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

std::optional<std::int64_t> newest_checkpoint_file(const std::string& dir) {
  const auto steps = list_steps(dir);
  if (steps.empty()) return std::nullopt;
  return steps.rbegin()->first;
}

void write_shard(const std::string& dir, std::int64_t step, int rank, int world, const CheckpointContents& contents) {
  check_step(step, rank, world);
  CheckpointFile file{CheckpointKind::shard, step, rank, world, contents};
  const std::string bytes = encode_checkpoint(file);
  write_durably(dir, world == 1 ? checkpoint_file_name(step) : shard_file_name(step, rank), bytes);
}

void commit(const std::string& dir, std::int64_t step, int world, int keep_last) {
  check_step(step, 0, world);
  if (keep_last < 0) throw Error(Status::invalid_argument, "checkpoint: keep_last must be >= 0");
  const std::string record = in_dir(dir, checkpoint_file_name(step));
  if (world == 1) {
    if (::access(record.c_str(), F_OK) != 0)
      throw Error(Status::io, "cannot commit checkpoint " + step_label(step) + ": '" + record + "' is missing");
  } else {
    CheckpointFile manifest{CheckpointKind::manifest, step, 0, world, {}};
    for (int r = 0; r < world; ++r) {
      const std::string name = shard_file_name(step, r);
      try {
        manifest.contents.add_blob(name, shard_entry(in_dir(dir, name), step, r, world));
      } catch (const Error& e) {
        throw Error(e.status(), "cannot commit checkpoint " + step_label(step) + ": " + e.what());
      }
    }
    write_durably(dir, checkpoint_file_name(step), encode_checkpoint(manifest));
  }
  if (keep_last == 0) return;
  // The newest `keep_last` checkpoints that validate (this one does) stay, with any damaged
  // ones among them: one that no longer reads must not push out a good one, or a resume
  // could be left with fewer good checkpoints than asked (or none).
  const auto steps = list_steps(dir);
  const auto committed =
      std::count_if(steps.begin(), steps.end(), [&](const auto& s) { return s.second.committed && s.first <= step; });
  if (committed <= keep_last) return;  // nothing to prune: no checkpoint need be read
  std::vector<std::int64_t> valid;     // newest first, up to `step`
  for (auto it = steps.rbegin(); it != steps.rend() && valid.size() < static_cast<std::size_t>(keep_last); ++it)
    if (it->second.committed && it->first <= step && (it->first == step || validates(dir, it->first)))
      valid.push_back(it->first);
  if (valid.size() < static_cast<std::size_t>(keep_last)) return;
  const std::int64_t oldest_kept = valid.back();
  for (const auto& [s, files] : steps)
    if (s < oldest_kept) remove_step(dir, s, files);
}

void write_checkpoint(const std::string& dir, std::int64_t step, const CheckpointContents& contents, int keep_last) {
  write_shard(dir, step, 0, 1, contents);
  commit(dir, step, 1, keep_last);
}

CheckpointContents read_shard(const std::string& dir, std::int64_t step, int rank, int world) {
  check_step(step, rank, world);
  const std::string record = in_dir(dir, checkpoint_file_name(step));
  if (world == 1) {
    CheckpointFile f = decode_checkpoint(read_whole(record), record);
    expect_identity(record, f, step, 0, 1, CheckpointKind::shard);
    return std::move(f.contents);
  }
  const CheckpointFile manifest = decode_checkpoint(read_whole(record), record);
  expect_identity(record, manifest, step, 0, world, CheckpointKind::manifest);
  if (manifest.contents.blobs().size() != static_cast<std::size_t>(world))
    throw CheckpointError(Status::bad_config, record,
                          "lists " + std::to_string(manifest.contents.blobs().size()) + " shards for " +
                              std::to_string(world) + " ranks");
  const std::string name = shard_file_name(step, rank);
  if (!manifest.contents.has_blob(name)) throw CheckpointError(Status::bad_config, record, "does not list " + name);
  const std::string& entry = manifest.contents.blob(name);
  if (entry.size() != kManifestEntry)
    throw CheckpointError(Status::bad_config, record,
                          "entry for " + name + " has " + std::to_string(entry.size()) + " bytes");
  const std::string path = in_dir(dir, name);
  const std::string bytes = read_whole(path);
  const std::uint32_t stored = bytes.size() >= 4 ? load_u32(bytes.data() + bytes.size() - 4) : 0;
  const std::uint64_t want_size = load_u64(entry.data());
  const std::uint32_t want_checksum = load_u32(entry.data() + 8);
  if (bytes.size() != want_size || stored != want_checksum)
    throw CheckpointError(Status::bad_config, path,
                          "does not match the manifest: " + std::to_string(bytes.size()) + " bytes, checksum " +
                              hex32(stored) + "; the manifest records " + std::to_string(want_size) +
                              " bytes, checksum " + hex32(want_checksum));
  CheckpointFile f = decode_checkpoint(bytes, path);
  expect_identity(path, f, step, rank, world, CheckpointKind::shard);
  return std::move(f.contents);
}

CheckpointContents read_checkpoint(const std::string& dir, std::int64_t step) { return read_shard(dir, step, 0, 1); }

CheckpointScan latest_valid(const std::string& dir, int world) {
  check_step(0, 0, world);
  return scan_checkpoints(dir, world);
}

CheckpointScan latest_valid_any(const std::string& dir) { return scan_checkpoints(dir, std::nullopt); }

std::vector<CheckpointContents> read_all_shards(const std::string& dir, std::int64_t step) {
  check_step(step, 0, 1);
  const int world = committed_world(dir, step);
  std::vector<CheckpointContents> shards;  // not reserved: `world` is unchecked until the manifest is read
  for (int r = 0; r < world; ++r) shards.push_back(read_shard(dir, step, r, world));
  return shards;
}

std::string describe(const CheckpointScan& scan) {
  std::string out;
  for (const auto& s : scan.skipped)
    out += "checkpoint " + step_label(s.step) + " is not usable (" + s.file + ": " + s.reason + ")\n";
  if (scan.step)
    out += "resuming from " + step_label(*scan.step) + "\n";
  else
    out += "no valid checkpoint to resume from\n";
  return out;
}

}  // namespace braid::train
