// The checkpoint file format: CRC-32C, the contents' accessors, encoding and validation.
#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "core/common/error.hpp"
#include "core/train/checkpoint.hpp"

namespace braid::train {
namespace {

constexpr char kMagic[8] = {'B', 'R', 'A', 'I', 'D', 'C', 'K', 'P'};
// magic, version, kind, file size, step, rank, world
constexpr std::size_t kFixedHeader = 8 + 4 + 4 + 8 + 8 + 4 + 4;
static_assert(kFixedHeader == kCheckpointHeaderBytes);
constexpr std::size_t kTrailer = 4;
// Sanity bounds for fields read from a file whose checksum matched: a writer never exceeds them.
constexpr std::uint32_t kMaxDims = 64;

// Slicing-by-8 tables for the reflected Castagnoli polynomial: eight bytes per lookup round.
using CrcTables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr CrcTables make_crc_tables() {
  CrcTables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t i = 0; i < 256; ++i)
    for (std::size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
  return t;
}

constexpr CrcTables kCrc = make_crc_tables();

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// --- little-endian encoding ---

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}
void put_string(std::string& out, const std::string& s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  out += s;
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

void put_floats(std::string& out, std::span<const float> data) {
  const std::size_t at = out.size();
  out.resize(at + 4 * data.size());
  if constexpr (std::endian::native == std::endian::little) {
    if (!data.empty()) std::memcpy(out.data() + at, data.data(), 4 * data.size());
  } else {
    for (std::size_t i = 0; i < data.size(); ++i) {
      const auto bits = std::bit_cast<std::uint32_t>(data[i]);
      for (int b = 0; b < 4; ++b) out[at + 4 * i + b] = static_cast<char>((bits >> (8 * b)) & 0xFFu);
    }
  }
}

void load_floats(const char* p, std::span<float> data) {
  if constexpr (std::endian::native == std::endian::little) {
    if (!data.empty()) std::memcpy(data.data(), p, 4 * data.size());
  } else {
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = std::bit_cast<float>(load_u32(p + 4 * i));
  }
}

void check_name(const std::string& name, const char* what) {
  if (name.empty()) throw Error(Status::invalid_argument, std::string("checkpoint: empty ") + what + " name");
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw CheckpointError(Status::bad_config, path, what);
}

// Reads fields in order; every read is bounds-checked so that a file that passed its
// checksum but is malformed (a writer bug, a hand-made file) still fails by name.
class Cursor {
 public:
  Cursor(std::string_view bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  const char* take(std::uint64_t n, const std::string& what) {
    if (n > bytes_.size() - at_)
      corrupt(path_, what + " runs past the end of the data (offset " + std::to_string(at_) + ", " + std::to_string(n) +
                         " bytes, " + std::to_string(bytes_.size() - at_) + " left)");
    const char* p = bytes_.data() + at_;
    at_ += static_cast<std::size_t>(n);
    return p;
  }
  std::uint32_t u32(const std::string& what) { return load_u32(take(4, what)); }
  std::uint64_t u64(const std::string& what) { return load_u64(take(8, what)); }
  std::string string(const std::string& what) {
    const std::uint32_t n = u32(what + " length");
    const char* p = take(n, what);
    return std::string(p, n);
  }
  std::size_t left() const { return bytes_.size() - at_; }
  std::size_t offset() const { return at_; }

 private:
  std::string_view bytes_;
  const std::string& path_;
  std::size_t at_ = 0;
};

}  // namespace

std::uint32_t crc32c(std::string_view data, std::uint32_t crc) {
  std::uint32_t c = ~crc;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  std::size_t n = data.size();
  while (n >= 8) {
    const std::uint32_t lo = c ^ (static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
                                  static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24);
    c = kCrc[7][lo & 0xFFu] ^ kCrc[6][(lo >> 8) & 0xFFu] ^ kCrc[5][(lo >> 16) & 0xFFu] ^ kCrc[4][lo >> 24] ^
        kCrc[3][p[4]] ^ kCrc[2][p[5]] ^ kCrc[1][p[6]] ^ kCrc[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ kCrc[0][(c ^ *p++) & 0xFFu];
  return ~c;
}

// --- CheckpointContents ---

void CheckpointContents::add_tensor(std::string name, nn::Tensor tensor) {
  check_name(name, "tensor");
  if (has_tensor(name)) throw Error(Status::invalid_argument, "checkpoint: tensor '" + name + "' added twice");
  if (nn::shape_numel(tensor.shape) != tensor.numel())
    throw Error(Status::invalid_argument, "checkpoint: tensor '" + name + "' has " + std::to_string(tensor.numel()) +
                                              " values for shape " + nn::shape_string(tensor.shape));
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back({std::move(name), std::move(tensor)});
}

void CheckpointContents::add_blob(std::string name, std::string bytes) {
  check_name(name, "blob");
  if (has_blob(name)) throw Error(Status::invalid_argument, "checkpoint: blob '" + name + "' added twice");
  blob_index_.emplace(name, blobs_.size());
  blobs_.push_back({std::move(name), std::move(bytes)});
}

void CheckpointContents::add_int(std::string name, std::int64_t value) {
  std::string bytes;
  put_u64(bytes, static_cast<std::uint64_t>(value));
  add_blob(std::move(name), std::move(bytes));
}

void CheckpointContents::add_double(std::string name, double value) {
  std::string bytes;
  put_u64(bytes, std::bit_cast<std::uint64_t>(value));
  add_blob(std::move(name), std::move(bytes));
}

bool CheckpointContents::has_tensor(std::string_view name) const { return tensor_index_.contains(name); }

bool CheckpointContents::has_blob(std::string_view name) const { return blob_index_.contains(name); }

const nn::Tensor& CheckpointContents::tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  if (it == tensor_index_.end())
    throw Error(Status::bad_config, "checkpoint '" + source + "' has no tensor '" + std::string(name) + "' (it has " +
                                        std::to_string(tensors_.size()) + " tensors)");
  return tensors_[it->second].tensor;
}

const std::string& CheckpointContents::blob(std::string_view name) const {
  const auto it = blob_index_.find(name);
  if (it == blob_index_.end())
    throw Error(Status::bad_config, "checkpoint '" + source + "' has no entry '" + std::string(name) + "' (it has " +
                                        std::to_string(blobs_.size()) + " blobs)");
  return blobs_[it->second].bytes;
}

std::int64_t CheckpointContents::get_int(std::string_view name) const {
  const std::string& b = blob(name);
  if (b.size() != 8)
    throw Error(Status::bad_config, "checkpoint '" + source + "': entry '" + std::string(name) + "' has " +
                                        std::to_string(b.size()) + " bytes, an integer has 8");
  return static_cast<std::int64_t>(load_u64(b.data()));
}

double CheckpointContents::get_double(std::string_view name) const {
  const std::string& b = blob(name);
  if (b.size() != 8)
    throw Error(Status::bad_config, "checkpoint '" + source + "': entry '" + std::string(name) + "' has " +
                                        std::to_string(b.size()) + " bytes, a double has 8");
  return std::bit_cast<double>(load_u64(b.data()));
}

// --- encoding ---

std::string encode_checkpoint(const CheckpointFile& file) {
  if (file.world < 1 || file.rank < 0 || file.rank >= file.world)
    throw Error(Status::invalid_argument, "checkpoint: rank " + std::to_string(file.rank) + " of world " +
                                              std::to_string(file.world) + " is out of range");
  if (file.step < 0) throw Error(Status::invalid_argument, "checkpoint: negative step " + std::to_string(file.step));
  const auto& c = file.contents;
  constexpr auto kU32Max = std::numeric_limits<std::uint32_t>::max();
  auto check_size = [](std::size_t n, const std::string& what) {
    if (n > kU32Max) throw Error(Status::invalid_argument, "checkpoint: " + what + " is too long for the format");
  };
  check_size(c.metadata.size(), "the metadata");
  check_size(c.tensors().size(), "the tensor list");
  check_size(c.blobs().size(), "the blob list");

  // Sized up front: the header records the total so that truncation is told apart from corruption.
  std::uint64_t size = kFixedHeader + 4 + c.metadata.size() + 4 + 4 + kTrailer;
  for (const auto& t : c.tensors()) {
    check_size(t.name.size(), "tensor name '" + t.name + "'");
    if (t.tensor.shape.size() > kMaxDims)
      throw Error(Status::invalid_argument, "checkpoint: tensor '" + t.name + "' has more than 64 dimensions");
    size += 4 + t.name.size() + 4 + 8 * t.tensor.shape.size() + 4 * t.tensor.data.size();
  }
  for (const auto& b : c.blobs()) {
    check_size(b.name.size(), "blob name '" + b.name + "'");
    size += 4 + b.name.size() + 8 + b.bytes.size();
  }

  std::string out;
  out.reserve(static_cast<std::size_t>(size));
  out.append(kMagic, sizeof kMagic);
  put_u32(out, kCheckpointFormatVersion);
  put_u32(out, static_cast<std::uint32_t>(file.kind));
  put_u64(out, size);
  put_u64(out, static_cast<std::uint64_t>(file.step));
  put_u32(out, static_cast<std::uint32_t>(file.rank));
  put_u32(out, static_cast<std::uint32_t>(file.world));
  put_string(out, c.metadata);
  put_u32(out, static_cast<std::uint32_t>(c.tensors().size()));
  put_u32(out, static_cast<std::uint32_t>(c.blobs().size()));
  for (const auto& t : c.tensors()) {
    put_string(out, t.name);
    put_u32(out, static_cast<std::uint32_t>(t.tensor.shape.size()));
    for (std::int64_t d : t.tensor.shape) put_u64(out, static_cast<std::uint64_t>(d));
    put_floats(out, t.tensor.data);
  }
  for (const auto& b : c.blobs()) {
    put_string(out, b.name);
    put_u64(out, b.bytes.size());
    out += b.bytes;
  }
  put_u32(out, crc32c(out));
  if (out.size() != size) throw Error(Status::internal, "checkpoint: encoded size differs from the computed size");
  return out;
}

// --- validation and decoding ---

namespace {

// Magic, version and recorded size: what must hold before the checksum can be looked at.
void check_frame(std::string_view head, std::uint64_t file_size, const std::string& path) {
  if (file_size == 0) corrupt(path, "empty file");
  // A prefix of the magic is a truncated checkpoint, anything else is not a checkpoint.
  if (head.empty() || std::memcmp(head.data(), kMagic, std::min(head.size(), sizeof kMagic)) != 0)
    corrupt(path, "not a braid checkpoint (no BRAIDCKP magic)");
  if (head.size() < kFixedHeader || file_size < kFixedHeader + kTrailer)
    corrupt(path, "truncated: " + std::to_string(file_size) + " bytes, shorter than the header");
  const std::uint32_t version = load_u32(head.data() + 8);
  if (version != kCheckpointFormatVersion)
    corrupt(path, "format version " + std::to_string(version) + ", this braid reads version " +
                      std::to_string(kCheckpointFormatVersion));
  const std::uint64_t recorded = load_u64(head.data() + 16);
  if (recorded > file_size)
    corrupt(path, "truncated: " + std::to_string(file_size) + " bytes of " + std::to_string(recorded));
  if (recorded < file_size)
    corrupt(path, std::to_string(file_size) + " bytes, " + std::to_string(file_size - recorded) +
                      " more than the header records (" + std::to_string(recorded) + ")");
}

}  // namespace

CheckpointHeader decode_checkpoint_header(std::string_view head, std::uint64_t file_size, const std::string& path) {
  check_frame(head, file_size, path);
  CheckpointHeader h;
  const std::uint32_t kind = load_u32(head.data() + 12);
  if (kind != static_cast<std::uint32_t>(CheckpointKind::shard) &&
      kind != static_cast<std::uint32_t>(CheckpointKind::manifest))
    corrupt(path, "unknown kind " + std::to_string(kind));
  h.kind = static_cast<CheckpointKind>(kind);
  h.file_size = file_size;
  const std::uint64_t step = load_u64(head.data() + 24);
  const std::uint32_t rank = load_u32(head.data() + 32);
  const std::uint32_t world = load_u32(head.data() + 36);
  if (step > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) corrupt(path, "negative step");
  if (world < 1 || world > static_cast<std::uint32_t>(std::numeric_limits<int>::max()) || rank >= world)
    corrupt(path, "rank " + std::to_string(rank) + " of world " + std::to_string(world));
  h.step = static_cast<std::int64_t>(step);
  h.rank = static_cast<int>(rank);
  h.world = static_cast<int>(world);
  return h;
}

CheckpointFile decode_checkpoint(std::string_view bytes, const std::string& path) {
  check_frame(bytes, bytes.size(), path);
  const std::size_t body = bytes.size() - kTrailer;
  const std::uint32_t stored = load_u32(bytes.data() + body);
  const std::uint32_t computed = crc32c(bytes.substr(0, body));
  if (stored != computed) corrupt(path, "checksum mismatch: stored " + hex32(stored) + ", computed " + hex32(computed));
  const CheckpointHeader h = decode_checkpoint_header(bytes, bytes.size(), path);

  Cursor in(bytes.substr(0, body), path);
  in.take(kFixedHeader, "header");
  CheckpointFile file;
  file.kind = h.kind;
  file.step = h.step;
  file.rank = h.rank;
  file.world = h.world;
  file.contents.metadata = in.string("metadata");
  file.contents.source = path;
  const std::uint32_t tensors = in.u32("tensor count");
  const std::uint32_t blobs = in.u32("blob count");
  for (std::uint32_t i = 0; i < tensors; ++i) {
    const std::string where = "tensor " + std::to_string(i);
    std::string name = in.string(where + " name");
    const std::uint32_t ndim = in.u32("tensor '" + name + "' dimension count");
    if (ndim > kMaxDims) corrupt(path, "tensor '" + name + "' has " + std::to_string(ndim) + " dimensions");
    nn::Tensor t;
    std::uint64_t numel = 1;
    const std::uint64_t fit = in.left() / 4;  // no tensor holds more floats than bytes remain / 4
    for (std::uint32_t d = 0; d < ndim; ++d) {
      const std::uint64_t dim = in.u64("tensor '" + name + "' shape");
      if (dim > fit || (dim != 0 && numel > fit / dim))
        corrupt(path, "tensor '" + name + "' has a shape larger than the file");
      numel *= dim;
      t.shape.push_back(static_cast<std::int64_t>(dim));
    }
    const char* p = in.take(4 * numel, "tensor '" + name + "' data");
    if (name.empty()) corrupt(path, where + " has an empty name");
    t.data.resize(static_cast<std::size_t>(numel));
    load_floats(p, t.data);
    if (file.contents.has_tensor(name)) corrupt(path, "tensor '" + name + "' appears twice");
    file.contents.add_tensor(std::move(name), std::move(t));
  }
  for (std::uint32_t i = 0; i < blobs; ++i) {
    const std::string where = "blob " + std::to_string(i);
    std::string name = in.string(where + " name");
    const std::uint64_t n = in.u64("blob '" + name + "' length");
    const char* p = in.take(n, "blob '" + name + "'");
    if (name.empty()) corrupt(path, where + " has an empty name");
    if (file.contents.has_blob(name)) corrupt(path, "blob '" + name + "' appears twice");
    file.contents.add_blob(std::move(name), std::string(p, static_cast<std::size_t>(n)));
  }
  if (in.left() != 0) corrupt(path, std::to_string(in.left()) + " unread bytes before the checksum");
  return file;
}

}  // namespace braid::train
