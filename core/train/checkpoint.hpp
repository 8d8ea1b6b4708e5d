// Training checkpoints: named float32 tensors and named byte blobs (the trainer's: each
// parameter's AdamW step count) for one rank, in a self-checking file, written so that a
// crash at any moment leaves every earlier checkpoint intact.
//
// Layout of a checkpoint directory, for step 123:
//   one process (world 1):  step-000123.braidckpt                the whole checkpoint
//   world W > 1:            step-000123.rank-0000.braidckpt ...   one shard per rank
//                           step-000123.braidckpt                 manifest, written last by rank 0
// Either way step-000123.braidckpt exists only once the checkpoint is complete: it is the
// commit record. Every file goes to "<name>.tmp", is fsynced, renamed into place, and the
// directory fsynced. The manifest lists each shard's size and checksum, so a shard left by
// a later, interrupted attempt at the same step does not pass for the committed one.
// Ranks share one directory (a shared file system when they span nodes).
//
// File format (version 1, integers little-endian):
//   "BRAIDCKP"  u32 version  u32 kind (1 shard, 2 manifest)  u64 file size
//   i64 step  u32 rank  u32 world
//   u32 metadata length, metadata bytes
//   u32 tensor count, u32 blob count
//   per tensor: u32 name length, name, u32 ndim, i64 dims[ndim], float32 data (LE bits)
//   per blob:   u32 name length, name, u64 length, bytes
//   u32 CRC-32C (Castagnoli) of every byte before it
// A manifest has no tensors and one blob per rank, named after the shard file, holding the
// shard's u64 size and u32 checksum.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/common/error.hpp"
#include "core/nn/tensor.hpp"

namespace braid::train {

inline constexpr std::uint32_t kCheckpointFormatVersion = 1;

// An error about one checkpoint file: "checkpoint '<path>': <reason>", with the path and the
// reason also kept apart (latest_valid reports them, a trainer may print them its own way).
class CheckpointError : public Error {
 public:
  CheckpointError(Status status, std::string path, std::string reason)
      : Error(status, "checkpoint '" + path + "': " + reason), path_(std::move(path)), reason_(std::move(reason)) {}
  const std::string& path() const noexcept { return path_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string path_;
  std::string reason_;
};

// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected, as in iSCSI, ext4 and LevelDB):
// crc32c("123456789") == 0xE3069283. Pass the previous result to continue a running CRC.
std::uint32_t crc32c(std::string_view data, std::uint32_t crc = 0);

struct NamedTensor {
  std::string name;
  nn::Tensor tensor;
};

struct NamedBlob {
  std::string name;
  std::string bytes;
};

// What one rank saves. Names are unique per kind (a tensor and a blob may share one);
// entries keep the order they were added in.
class CheckpointContents {
 public:
  std::string metadata;  // free text for people and checks: run name, seed, layout
  std::string source;    // set by the readers: the file, for error messages

  // Throw Error(invalid_argument) on an empty or duplicate name.
  void add_tensor(std::string name, nn::Tensor tensor);
  void add_blob(std::string name, std::string bytes);
  void add_int(std::string name, std::int64_t value);  // 8 bytes, little-endian
  void add_double(std::string name, double value);     // the 8 bytes of its IEEE bits, little-endian

  bool has_tensor(std::string_view name) const;
  bool has_blob(std::string_view name) const;
  // Throw Error(bad_config) naming the source when the entry is absent or of the wrong size.
  const nn::Tensor& tensor(std::string_view name) const;
  const std::string& blob(std::string_view name) const;
  std::int64_t get_int(std::string_view name) const;
  double get_double(std::string_view name) const;

  const std::vector<NamedTensor>& tensors() const { return tensors_; }
  const std::vector<NamedBlob>& blobs() const { return blobs_; }

 private:
  std::vector<NamedTensor> tensors_;
  std::vector<NamedBlob> blobs_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_, blob_index_;  // name -> position
};

// --- The directory API -------------------------------------------------------------

// "step-000123.braidckpt" (at least 6 digits) and "step-000123.rank-0003.braidckpt".
std::string checkpoint_file_name(std::int64_t step);
std::string shard_file_name(std::int64_t step, int rank);

// Creates `dir` (and its parents) when missing; Error(io) naming it when that fails or it
// is not a directory. The writers below do not create directories.
void create_checkpoint_dir(const std::string& dir);

// Holds `dir`'s lock (dir/.lock, an flock) while it lives: two runs writing one checkpoint
// directory would overwrite each other's files. Error(invalid_argument) naming the directory
// when another process holds it.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

// The newest step of any checkpoint file in `dir`, committed or not (nullopt: none): a run
// that does not resume must not write over another run's checkpoints.
std::optional<std::int64_t> newest_checkpoint_file(const std::string& dir);

// Writes this rank's shard of checkpoint `step` durably (temp file, fsync, rename, fsync of
// the directory). With world 1 the shard is the whole checkpoint and is committed once this
// returns. Never touches another step's files. Error(io) naming the path and the system's
// reason (no such directory, permission, disk full); the temp file is removed.
void write_shard(const std::string& dir, std::int64_t step, int rank, int world, const CheckpointContents& contents);

// Rank 0, after every rank's write_shard returned (a barrier the caller does): writes the
// manifest that commits `step` (world > 1; with world 1 it checks the file is there), then,
// when keep_last > 0, deletes the checkpoints older than the keep_last newest with a step
// <= `step`, manifest first. Error(io) when a shard is missing or a file cannot be written or
// deleted; the new checkpoint stays valid whatever fails during the deletion.
void commit(const std::string& dir, std::int64_t step, int world, int keep_last = 0);

// write_shard + commit for one process.
void write_checkpoint(const std::string& dir, std::int64_t step, const CheckpointContents& contents, int keep_last = 0);

// Reads and fully validates this rank's shard of checkpoint `step` (through the manifest when
// world > 1). Error(io) when a file is missing or unreadable, Error(bad_config) naming the
// file and what is wrong when it is corrupted, truncated, or from another step, rank or world.
CheckpointContents read_shard(const std::string& dir, std::int64_t step, int rank, int world);
CheckpointContents read_checkpoint(const std::string& dir, std::int64_t step);  // world 1

struct SkippedCheckpoint {
  std::int64_t step = 0;
  std::string file;       // the file at fault, e.g. "step-000200.rank-0001.braidckpt"
  std::string reason;     // e.g. "checksum mismatch: stored 0x1a2b3c4d, computed 0x5e6f7a8b"
  bool committed = true;  // false: shards a rank left before the checkpoint was complete
};

struct CheckpointScan {
  std::optional<std::int64_t> step;        // the newest valid checkpoint, if any
  int world = 1;                           // the world that wrote it
  std::vector<SkippedCheckpoint> skipped;  // newer ones that are not valid, newest first
};

// Tries the checkpoints in `dir` newest first and stops at the first one whose every file
// for `world` ranks validates (checksums included). A directory that does not exist holds
// no checkpoint. Shards without a manifest (a rank died before the commit) are reported as
// skipped; "*.tmp" leftovers are ignored. Reads files only, so every rank gets the same
// answer; call it on each rank, or on rank 0 and broadcast the step.
CheckpointScan latest_valid(const std::string& dir, int world = 1);

// The same, whatever world wrote each checkpoint (its commit record's header says which):
// for resuming under another layout (resharding on load). `world` of the result is the
// writer's.
CheckpointScan latest_valid_any(const std::string& dir);

// Every shard of committed checkpoint `step`, rank by rank, whatever world wrote it, each
// validated as read_shard does (the result's size is that world).
std::vector<CheckpointContents> read_all_shards(const std::string& dir, std::int64_t step);

// What a trainer prints before resuming: one line per skipped checkpoint, then where it
// resumes from, e.g. "checkpoint step-000200 is corrupted (step-000200.braidckpt: checksum
// mismatch: ...); resuming from step-000100".
std::string describe(const CheckpointScan& scan);

// --- The file format, for tools and tests ------------------------------------------

enum class CheckpointKind : std::uint32_t { shard = 1, manifest = 2 };

struct CheckpointFile {
  CheckpointKind kind = CheckpointKind::shard;
  std::int64_t step = 0;
  int rank = 0;
  int world = 1;
  CheckpointContents contents;
};

// The fixed-size start of every file.
inline constexpr std::size_t kCheckpointHeaderBytes = 40;
struct CheckpointHeader {
  CheckpointKind kind = CheckpointKind::shard;
  std::uint64_t file_size = 0;  // the whole file, checksum included
  std::int64_t step = 0;
  int rank = 0;
  int world = 1;
};

std::string encode_checkpoint(const CheckpointFile& file);
// Validates magic, version, size, checksum and structure in that order; throws
// CheckpointError(bad_config) naming `path` and what is wrong otherwise.
CheckpointFile decode_checkpoint(std::string_view bytes, const std::string& path);
// The header alone, from the first bytes of a file of `file_size` bytes: magic, version,
// kind, rank and world checked, the size compared with the one recorded. No checksum.
CheckpointHeader decode_checkpoint_header(std::string_view head, std::uint64_t file_size, const std::string& path);

}  // namespace braid::train
