// The trainer's foundations (core/train): checkpoints round-trip bit for bit, every flipped
// byte and every truncation is caught, the newest valid checkpoint is found past corrupted,
// uncommitted and incomplete ones, old ones are pruned, failed writes leave earlier
// checkpoints intact; a checkpoint of any world is found and read whole, its tensor-parallel
// slices joined bit for bit and cut for another layout; the metrics file's lines, its resume behaviour, and the
// progress, ETA and summary formatting; the memory meter's kinds and its report.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/nn/tensor_parallel.hpp"
#include "core/train/checkpoint.hpp"
#include "core/train/lr_schedule.hpp"
#include "core/train/memory_meter.hpp"
#include "core/train/metrics.hpp"
#include "core/train/run_record.hpp"
#include "core/train/sharded_state.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

namespace fs = std::filesystem;
using nn::Tensor;
using namespace train;

// A fresh directory per test, removed afterwards (permissions restored first).
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "braid-train-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const std::string& str() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

void flip_byte(const std::string& path, std::size_t offset) {
  std::string b = slurp(path);
  ASSERT_LT(offset, b.size());
  b[offset] = static_cast<char>(b[offset] ^ 0x10);
  spit(path, b);
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

Tensor random_tensor(nn::Shape shape, std::uint32_t seed) {
  Tensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (float& x : t.data) x = n(rng);
  return t;
}

// A small checkpoint such as a trainer writes: parameters, moments, optimizer step, RNG
// state, data cursor, logit scale.
CheckpointContents sample_contents(std::int64_t step, int rank = 0) {
  CheckpointContents c;
  c.metadata = "run tiny-clip seed 7 layout dp" + std::to_string(rank);
  c.add_tensor("vision.proj.weight", random_tensor({4, 3}, static_cast<std::uint32_t>(step * 10 + rank)));
  c.add_tensor("adam.m.vision.proj.weight", random_tensor({4, 3}, static_cast<std::uint32_t>(step * 10 + rank + 1)));
  c.add_tensor("logit_scale", Tensor({}, std::vector<float>{2.6592f}));
  c.add_int("optimizer.step", step);
  c.add_blob("rng", "mt19937 state " + std::to_string(step));
  c.add_int("data.cursor", step * 64 + rank);
  return c;
}

void expect_bits_equal(const Tensor& a, const Tensor& b, const std::string& name) {
  ASSERT_EQ(a.shape, b.shape) << name;
  ASSERT_EQ(a.data.size(), b.data.size()) << name;
  for (std::size_t i = 0; i < a.data.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(a.data[i]), std::bit_cast<std::uint32_t>(b.data[i]))
        << name << "[" << i << "]";
}

void expect_same_contents(const CheckpointContents& a, const CheckpointContents& b) {
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (std::size_t i = 0; i < a.tensors().size(); ++i) {
    EXPECT_EQ(a.tensors()[i].name, b.tensors()[i].name);
    expect_bits_equal(a.tensors()[i].tensor, b.tensors()[i].tensor, a.tensors()[i].name);
  }
  ASSERT_EQ(a.blobs().size(), b.blobs().size());
  for (std::size_t i = 0; i < a.blobs().size(); ++i) {
    EXPECT_EQ(a.blobs()[i].name, b.blobs()[i].name);
    EXPECT_EQ(a.blobs()[i].bytes, b.blobs()[i].bytes) << a.blobs()[i].name;
  }
}

// --- format ---

TEST(Checkpoint, Crc32cMatchesPublishedVectors) {
  // RFC 3720 (iSCSI) B.4 and the customary check value.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[static_cast<std::size_t>(i)] = static_cast<char>(i);
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(""), 0u);
  // A running CRC equals the CRC of the whole, at every split (the 8-byte loop and the tail).
  const std::string text = "the quick brown fox jumps over the lazy dog, twice over";
  for (std::size_t k = 0; k <= text.size(); ++k)
    EXPECT_EQ(crc32c(text.substr(k), crc32c(text.substr(0, k))), crc32c(text)) << k;
}

TEST(Checkpoint, RoundTripIsBitExact) {
  TempDir dir;
  CheckpointContents c = sample_contents(123);
  // Values a byte-by-byte copy keeps and a text or double round trip might not.
  const float quiet_nan_payload = std::bit_cast<float>(0x7fc12345u);
  c.add_tensor("special", Tensor({2, 4}, {-0.0f, 0.0f, std::numeric_limits<float>::denorm_min(),
                                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::max(),
                                          quiet_nan_payload, 1.0f / 3.0f, 16777217.0f}));
  c.add_tensor("empty", Tensor({0, 5}));
  c.add_tensor("big", random_tensor({37, 129}, 5));
  c.add_blob("binary", std::string("\0\x01\xff\n\r", 5));
  c.add_blob("nothing", "");
  c.add_int("negative", -9'000'000'000'000'000'000);
  c.add_double("logit_scale_param", 2.659260036932778);
  write_checkpoint(dir.str(), 123, c);
  EXPECT_EQ(files_in(dir.str()), std::vector<std::string>{"step-000123.braidckpt"});

  const CheckpointContents back = read_checkpoint(dir.str(), 123);
  expect_same_contents(c, back);
  EXPECT_EQ(back.get_int("negative"), -9'000'000'000'000'000'000);
  EXPECT_EQ(std::bit_cast<std::uint64_t>(back.get_double("logit_scale_param")),
            std::bit_cast<std::uint64_t>(2.659260036932778));
  EXPECT_EQ(back.get_int("optimizer.step"), 123);
  EXPECT_EQ(back.source, dir / "step-000123.braidckpt");
  // The same bytes on a second write: nothing time- or address-dependent in the format.
  EXPECT_EQ(encode_checkpoint({CheckpointKind::shard, 123, 0, 1, back}), slurp(dir / "step-000123.braidckpt"));
}

TEST(Checkpoint, ContentsRejectMisuseAndNameWhatIsMissing) {
  CheckpointContents c;
  c.add_tensor("w", Tensor({2}));
  test::expect_error([&] { c.add_tensor("w", Tensor({3})); }, Status::invalid_argument, {"'w'", "twice"});
  test::expect_error([&] { c.add_blob("", "x"); }, Status::invalid_argument, {"empty blob name"});
  Tensor bad({2, 2});
  bad.data.resize(bad.data.size() - 1);
  test::expect_error([&] { c.add_tensor("bad", bad); }, Status::invalid_argument, {"'bad'", "3 values", "(2, 2)"});
  c.add_blob("short", "abc");
  c.source = "ckpt/step-000001.braidckpt";
  test::expect_error([&] { c.tensor("v"); }, Status::bad_config, {"ckpt/step-000001.braidckpt", "no tensor 'v'"});
  test::expect_error([&] { c.get_int("short"); }, Status::bad_config, {"'short' has 3 bytes", "integer has 8"});
  test::expect_error([&] { c.get_double("nope"); }, Status::bad_config, {"no entry 'nope'"});
}

TEST(Checkpoint, EveryFlippedByteIsCaught) {
  const std::string good = encode_checkpoint({CheckpointKind::shard, 7, 0, 1, sample_contents(7)});
  ASSERT_NO_THROW(decode_checkpoint(good, "x"));
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (unsigned char mask : {0x01, 0x80}) {
      std::string bad = good;
      bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ mask);
      try {
        decode_checkpoint(bad, "ckpt/step-000007.braidckpt");
        ADD_FAILURE() << "flipped byte " << i << " (mask " << int(mask) << ") not detected";
      } catch (const CheckpointError& e) {
        EXPECT_EQ(e.status(), Status::bad_config);
        EXPECT_EQ(e.path(), "ckpt/step-000007.braidckpt");
        const std::string what = e.what();
        if (i < 8) {
          EXPECT_NE(what.find("no BRAIDCKP magic"), std::string::npos) << what;
        } else if (i < 12) {
          EXPECT_NE(what.find("format version"), std::string::npos) << what;
        } else if (i >= 16 && i < 24) {  // the recorded size
          EXPECT_NE(what.find("bytes"), std::string::npos) << what;
        } else {
          EXPECT_NE(what.find("checksum mismatch: stored 0x"), std::string::npos) << i << ": " << what;
          EXPECT_NE(what.find(", computed 0x"), std::string::npos) << what;
        }
      }
    }
  }
}

TEST(Checkpoint, EveryTruncationIsCaught) {
  const std::string good = encode_checkpoint({CheckpointKind::shard, 7, 0, 1, sample_contents(7)});
  for (std::size_t n = 0; n < good.size(); ++n) {
    try {
      decode_checkpoint(std::string_view(good).substr(0, n), "f");
      ADD_FAILURE() << "truncation to " << n << " bytes not detected";
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(n == 0 ? "empty file" : "truncated"), std::string::npos) << n << ": " << what;
    }
  }
  test::expect_error([&] { decode_checkpoint(good + "x", "f"); }, Status::bad_config,
                     {"'f'", "1 more than the header records"});
}

TEST(Checkpoint, ReadNamesTheFileAndTheProblem) {
  TempDir dir;
  write_checkpoint(dir.str(), 5, sample_contents(5));
  const std::string path = dir / "step-000005.braidckpt";
  flip_byte(path, 100);
  test::expect_error([&] { read_checkpoint(dir.str(), 5); }, Status::bad_config, {path, "checksum mismatch"});
  test::expect_error([&] { read_checkpoint(dir.str(), 6); }, Status::io, {dir / "step-000006.braidckpt", "missing"});
  // A file renamed to another step's name is not that step.
  write_checkpoint(dir.str(), 8, sample_contents(8));
  fs::rename(dir / "step-000008.braidckpt", dir / "step-000009.braidckpt");
  test::expect_error([&] { read_checkpoint(dir.str(), 9); }, Status::bad_config, {"holds step 8, its name says 9"});
}

// --- the newest valid checkpoint ---

TEST(Checkpoint, LatestValidSkipsACorruptedNewestAndLeftovers) {
  TempDir dir;
  EXPECT_FALSE(latest_valid(dir / "absent").step);  // no directory yet: nothing to resume
  for (std::int64_t s : {100, 200, 300}) write_checkpoint(dir.str(), s, sample_contents(s));
  flip_byte(dir / "step-000300.braidckpt", 60);
  spit(dir / "step-000400.braidckpt.tmp", "half written");
  spit(dir / "notes.txt", "not a checkpoint");

  const CheckpointScan scan = latest_valid(dir.str());
  ASSERT_TRUE(scan.step);
  EXPECT_EQ(*scan.step, 200);
  ASSERT_EQ(scan.skipped.size(), 1u);  // the .tmp leftover is no checkpoint
  EXPECT_EQ(scan.skipped[0].step, 300);
  EXPECT_EQ(scan.skipped[0].file, "step-000300.braidckpt");
  EXPECT_EQ(scan.skipped[0].reason.rfind("checksum mismatch: stored 0x", 0), 0u) << scan.skipped[0].reason;
  const std::string text = describe(scan);
  EXPECT_NE(text.find("checkpoint step-000300 is not usable (step-000300.braidckpt: checksum mismatch"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("resuming from step-000200\n"), std::string::npos) << text;
  expect_same_contents(read_checkpoint(dir.str(), *scan.step), sample_contents(200));

  // Truncated too: the scan falls back once more.
  const std::string b = slurp(dir / "step-000200.braidckpt");
  spit(dir / "step-000200.braidckpt", b.substr(0, b.size() / 2));
  const CheckpointScan again = latest_valid(dir.str());
  EXPECT_EQ(again.step, std::optional<std::int64_t>(100));
  ASSERT_EQ(again.skipped.size(), 2u);
  EXPECT_NE(again.skipped[1].reason.find("truncated"), std::string::npos) << again.skipped[1].reason;

  fs::remove(dir / "step-000100.braidckpt");
  const CheckpointScan none = latest_valid(dir.str());
  EXPECT_FALSE(none.step);
  EXPECT_NE(describe(none).find("no valid checkpoint to resume from"), std::string::npos);
}

TEST(Checkpoint, ShardsNeedEveryRankAndTheManifest) {
  TempDir dir;
  constexpr int world = 3;
  for (std::int64_t s : {10, 20}) {
    for (int r = 0; r < world; ++r) write_shard(dir.str(), s, r, world, sample_contents(s, r));
    commit(dir.str(), s, world);
  }
  // Step 30: rank 2 died before writing; rank 0 never committed.
  for (int r = 0; r < 2; ++r) write_shard(dir.str(), 30, r, world, sample_contents(30, r));
  test::expect_error([&] { commit(dir.str(), 30, world); }, Status::io,
                     {"cannot commit checkpoint step-000030", "step-000030.rank-0002.braidckpt", "missing"});
  EXPECT_FALSE(fs::exists(dir / "step-000030.braidckpt"));

  CheckpointScan scan = latest_valid(dir.str(), world);
  EXPECT_EQ(scan.step, std::optional<std::int64_t>(20));
  ASSERT_EQ(scan.skipped.size(), 1u);
  EXPECT_EQ(scan.skipped[0].step, 30);
  EXPECT_NE(scan.skipped[0].reason.find("never committed"), std::string::npos) << scan.skipped[0].reason;
  for (int r = 0; r < world; ++r) expect_same_contents(read_shard(dir.str(), 20, r, world), sample_contents(20, r));

  // A shard of step 20 lost: step 20 is incomplete, step 10 is the one to resume from.
  fs::remove(dir / "step-000020.rank-0001.braidckpt");
  scan = latest_valid(dir.str(), world);
  EXPECT_EQ(scan.step, std::optional<std::int64_t>(10));
  ASSERT_EQ(scan.skipped.size(), 2u);
  EXPECT_EQ(scan.skipped[1].step, 20);
  EXPECT_EQ(scan.skipped[1].file, "step-000020.rank-0001.braidckpt");
  EXPECT_EQ(scan.skipped[1].reason, "missing");

  // A shard rewritten after the commit (a later attempt at the same step, interrupted) is
  // valid on its own but not the one the manifest committed.
  write_shard(dir.str(), 10, 2, world, sample_contents(11, 2));
  scan = latest_valid(dir.str(), world);
  EXPECT_FALSE(scan.step);
  EXPECT_EQ(scan.skipped.back().file, "step-000010.rank-0002.braidckpt");
  EXPECT_NE(scan.skipped.back().reason.find("does not match the manifest"), std::string::npos)
      << scan.skipped.back().reason;
}

TEST(Checkpoint, AnotherWorldSizeIsReported) {
  TempDir dir;
  write_checkpoint(dir.str(), 4, sample_contents(4));
  CheckpointScan scan = latest_valid(dir.str(), 2);
  EXPECT_FALSE(scan.step);
  ASSERT_EQ(scan.skipped.size(), 1u);
  EXPECT_EQ(scan.skipped[0].reason, "written by 1 rank; this run has 2");
  test::expect_error([&] { read_shard(dir.str(), 4, 1, 2); }, Status::bad_config, {"written by 1 rank"});

  for (int r = 0; r < 2; ++r) write_shard(dir.str(), 8, r, 2, sample_contents(8, r));
  commit(dir.str(), 8, 2);
  scan = latest_valid(dir.str(), 1);
  EXPECT_EQ(scan.step, std::optional<std::int64_t>(4));
  ASSERT_EQ(scan.skipped.size(), 1u);
  EXPECT_EQ(scan.skipped[0].reason, "written by 2 ranks; this run has 1");
  EXPECT_EQ(latest_valid(dir.str(), 2).step, std::optional<std::int64_t>(8));
}

TEST(Checkpoint, KeepsTheLastK) {
  TempDir dir;
  spit(dir / "step-000009.braidckpt", "a newer, broken checkpoint from an earlier attempt");
  spit(dir / "step-000001.braidckpt.tmp", "an interrupted write");
  for (std::int64_t s = 2; s <= 6; ++s) write_checkpoint(dir.str(), s, sample_contents(s), /*keep_last=*/2);
  // Newer files than the step just written are left alone; everything older than the two
  // newest goes, leftovers included.
  EXPECT_EQ(files_in(dir.str()),
            (std::vector<std::string>{"step-000005.braidckpt", "step-000006.braidckpt", "step-000009.braidckpt"}));

  TempDir sharded;
  for (std::int64_t s = 1; s <= 4; ++s) {
    for (int r = 0; r < 2; ++r) write_shard(sharded.str(), s, r, 2, sample_contents(s, r));
    commit(sharded.str(), s, 2, /*keep_last=*/2);
  }
  EXPECT_EQ(files_in(sharded.str()),
            (std::vector<std::string>{"step-000003.braidckpt", "step-000003.rank-0000.braidckpt",
                                      "step-000003.rank-0001.braidckpt", "step-000004.braidckpt",
                                      "step-000004.rank-0000.braidckpt", "step-000004.rank-0001.braidckpt"}));
  EXPECT_EQ(latest_valid(sharded.str(), 2).step, std::optional<std::int64_t>(4));
}

// --- failed writes ---

TEST(Checkpoint, WriteIntoAMissingOrNonDirectoryFailsClearly) {
  TempDir dir;
  test::expect_error([&] { write_checkpoint(dir / "nope", 1, sample_contents(1)); }, Status::io,
                     {"checkpoint directory '" + (dir / "nope") + "' does not exist"});
  spit(dir / "file", "x");
  test::expect_error([&] { write_checkpoint(dir / "file", 1, sample_contents(1)); }, Status::io,
                     {dir / "file", "is not a directory"});
  test::expect_error([&] { create_checkpoint_dir(dir / "file/sub"); }, Status::io, {dir / "file/sub"});
  create_checkpoint_dir(dir / "a/b");
  write_checkpoint(dir / "a/b", 1, sample_contents(1));
  EXPECT_EQ(latest_valid(dir / "a/b").step, std::optional<std::int64_t>(1));
}

// The attempt runs in a child process that, when this one is root (whom permissions do not
// stop), first becomes "nobody".
TEST(Checkpoint, WriteIntoAReadOnlyDirectoryLeavesEarlierOnesIntact) {
  TempDir dir;
  write_checkpoint(dir.str(), 1, sample_contents(1));
  const std::string before = slurp(dir / "step-000001.braidckpt");
  fs::permissions(dir.str(),
                  fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read | fs::perms::others_exec);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(4);
    int code = 3;  // no error at all
    std::string message;
    try {
      write_checkpoint(dir.str(), 2, sample_contents(2));
    } catch (const Error& e) {
      message = e.what();
      code = e.status() == Status::io ? 0 : 1;
    }
    if (::write(pipe_fds[1], message.data(), message.size()) < 0) code = 5;
    ::_exit(code);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) message.append(buf, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  fs::permissions(dir.str(), fs::perms::owner_all);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 4) GTEST_SKIP() << "running as root and cannot become nobody to lose write access";
  EXPECT_EQ(WEXITSTATUS(status), 0) << message;
  EXPECT_NE(message.find("cannot create checkpoint file '" + (dir / "step-000002.braidckpt.tmp") + "'"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(std::strerror(EACCES)), std::string::npos) << message;
  EXPECT_EQ(files_in(dir.str()), std::vector<std::string>{"step-000001.braidckpt"});
  EXPECT_EQ(slurp(dir / "step-000001.braidckpt"), before);
}

// A full disk, made real with the file-size limit: write() fails part way (EFBIG) exactly
// as it does with ENOSPC. Works as root too.
TEST(Checkpoint, AWriteThatFailsMidwayRemovesItsTempFile) {
  TempDir dir;
  write_checkpoint(dir.str(), 1, sample_contents(1));
  const std::string before = slurp(dir / "step-000001.braidckpt");
  CheckpointContents big = sample_contents(2);
  big.add_tensor("large", Tensor({256, 1024}, 0.5f));  // 1 MiB

  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 64 * 1024;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // else the kernel kills the process
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    write_checkpoint(dir.str(), 2, big);
  } catch (const Error& e) {
    message = e.what();
    EXPECT_EQ(e.status(), Status::io);
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_NE(message.find("cannot write checkpoint file '" + (dir / "step-000002.braidckpt.tmp") + "'"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
  EXPECT_EQ(files_in(dir.str()), std::vector<std::string>{"step-000001.braidckpt"});
  EXPECT_EQ(slurp(dir / "step-000001.braidckpt"), before);
  EXPECT_EQ(latest_valid(dir.str()).step, std::optional<std::int64_t>(1));
}

// --- resharding on load: any world's checkpoint, joined whole, cut for another layout ---

TEST(Checkpoint, LatestValidAnyFindsTheWriterWorldAndReadsEveryShard) {
  TempDir dir;
  EXPECT_FALSE(latest_valid_any(dir / "absent").step);
  write_checkpoint(dir.str(), 4, sample_contents(4));
  for (int r = 0; r < 2; ++r) write_shard(dir.str(), 8, r, 2, sample_contents(8, r));
  commit(dir.str(), 8, 2);
  for (int r = 0; r < 3; ++r) write_shard(dir.str(), 12, r, 3, sample_contents(12, r));
  commit(dir.str(), 12, 3);

  CheckpointScan scan = latest_valid_any(dir.str());
  EXPECT_EQ(scan.step, std::optional<std::int64_t>(12));
  EXPECT_EQ(scan.world, 3);
  EXPECT_TRUE(scan.skipped.empty());
  std::vector<CheckpointContents> shards = read_all_shards(dir.str(), 12);
  ASSERT_EQ(shards.size(), 3u);
  for (int r = 0; r < 3; ++r) expect_same_contents(shards[static_cast<std::size_t>(r)], sample_contents(12, r));
  EXPECT_EQ(shards[2].source, dir / "step-000012.rank-0002.braidckpt");

  // A corrupted shard: validated as read_shard does, skipped by the scan, refused when read.
  flip_byte(dir / "step-000012.rank-0001.braidckpt", 60);
  scan = latest_valid_any(dir.str());
  EXPECT_EQ(scan.step, std::optional<std::int64_t>(8));
  EXPECT_EQ(scan.world, 2);
  ASSERT_EQ(scan.skipped.size(), 1u);
  EXPECT_EQ(scan.skipped[0].file, "step-000012.rank-0001.braidckpt");
  test::expect_error([&] { read_all_shards(dir.str(), 12); }, Status::bad_config,
                     {"step-000012.rank-0001.braidckpt", "checksum mismatch"});
  EXPECT_EQ(read_all_shards(dir.str(), 8).size(), 2u);

  // A broken commit record is skipped too; world 1 reads as one shard.
  spit(dir / "step-000008.braidckpt", "BRAIDCKP garbage");
  scan = latest_valid_any(dir.str());
  EXPECT_EQ(scan.step, std::optional<std::int64_t>(4));
  EXPECT_EQ(scan.world, 1);
  ASSERT_EQ(scan.skipped.size(), 2u);
  EXPECT_EQ(scan.skipped[1].file, "step-000008.braidckpt");
  shards = read_all_shards(dir.str(), 4);
  ASSERT_EQ(shards.size(), 1u);
  expect_same_contents(shards[0], sample_contents(4));
  test::expect_error([&] { read_all_shards(dir.str(), 5); }, Status::io, {"step-000005.braidckpt", "missing"});
}

nn::Parameter held_parameter(const std::string& name, nn::Shape full, nn::TensorSlice slice = {}) {
  nn::Parameter p;
  p.name = name;
  p.full_shape = std::move(full);
  p.slice = slice;
  return p;
}

// The schedule a checkpoint records reads back; a resume is refused only where the steps the
// checkpoint trained would have taken other rates under the new schedule.
TEST(LrSchedule, ACheckpointKeepsItsScheduleAndAResumeComparesTheStepsItTrained) {
  spec::TrainerSpec t;
  t.learning_rate = 1e-3;
  t.warmup_steps = 4;
  t.min_lr_ratio = 0.1;
  const LrSchedule ten = LrSchedule::of(t, 10);
  EXPECT_DOUBLE_EQ(ten.at(2), 0.5e-3);               // warm-up
  EXPECT_DOUBLE_EQ(ten.at(4), 1e-3);                 // the peak
  EXPECT_DOUBLE_EQ(ten.at(10), 0.1e-3);              // the floor at the last step
  EXPECT_DOUBLE_EQ(ten.at(7), 0.1e-3 + 0.9e-3 / 2);  // half way down the cosine
  EXPECT_DOUBLE_EQ(ten.at(50), 0.1e-3);              // past the end: the floor

  CheckpointContents c;
  c.source = "ck/step-000003.braidckpt";
  EXPECT_EQ(schedule_change(c, ten, 4), "");  // written before schedules were recorded: nothing to compare
  ten.record(c);
  ASSERT_TRUE(LrSchedule::recorded(c));
  EXPECT_EQ(*LrSchedule::recorded(c), ten);
  EXPECT_EQ(schedule_change(c, ten, 4), "");
  // A longer run still in its warm-up at the checkpoint trained the same rates: resumable.
  EXPECT_EQ(schedule_change(c, LrSchedule::of(t, 20), 4), "");
  // Past the warm-up the cosine of 10 steps is not that of 20: step 5 differs.
  const std::string longer = schedule_change(c, LrSchedule::of(t, 20), 6);
  EXPECT_NE(longer.find("checkpoint 'ck/step-000003.braidckpt' was trained under a learning-rate schedule of 10 "
                        "steps (peak 0.001, warm-up 4 steps, floor 0.1 of the peak), this run's is of 20 steps"),
            std::string::npos)
      << longer;
  EXPECT_NE(longer.find("its step 5 trained at "), std::string::npos) << longer;
  // Another peak differs from the first step.
  spec::TrainerSpec hotter = t;
  hotter.learning_rate = 2e-3;
  EXPECT_NE(schedule_change(c, LrSchedule::of(hotter, 10), 2)
                .find("its step 1 trained at 0.00025 where this run's "
                      "schedule gives 0.0005"),
            std::string::npos);
}

// A checkpoint records what the run's steps depend on, field by field: the same run read from
// another path compares equal; another model, data or seed is named; the cluster and the trainer's
// other settings may change.
TEST(RunRecord, ACheckpointKeepsItsRunAndAResumeNamesTheFieldThatChanged) {
  const spec::RunSpec run = test::load("tiny-clip.yaml");
  const RunRecord record = RunRecord::of(run, 1);
  CheckpointContents c;
  c.source = "ck/step-000003.braidckpt";
  EXPECT_EQ(run_change(c, record), "");  // written before runs were recorded: nothing to compare
  record.record(c);
  ASSERT_TRUE(RunRecord::recorded(c));
  EXPECT_EQ(*RunRecord::recorded(c), record);
  spec::RunSpec elsewhere = run;
  elsewhere.source = "/elsewhere/renamed.yaml";
  elsewhere.cluster.nodes = 2;
  elsewhere.trainer.steps = 5000;
  elsewhere.trainer.eval_every = 7;
  elsewhere.training.microbatch = 8;  // a layout setting: the same samples in other microbatches
  EXPECT_EQ(run_change(c, RunRecord::of(elsewhere, 1)), "");

  EXPECT_EQ(run_change(c, RunRecord::of(run, 5)),
            "checkpoint 'ck/step-000003.braidckpt' was trained on another run: its seed was 1, this run's 5");
  spec::RunSpec edited = run;
  edited.data.image.median = 20;
  edited.model.modules[0].heads = 2;
  edited.training.contrastive_batch = 64;
  EXPECT_EQ(run_change(c, RunRecord::of(edited, 1)),
            "checkpoint 'ck/step-000003.braidckpt' was trained on another run: its model.image_encoder.heads was 4, "
            "this run's 2 (and 2 more fields: training.contrastive_batch, data.image.median)");
  spec::RunSpec fewer = run;
  fewer.model.modules.erase(fewer.model.modules.begin() + 1);  // the text encoder gone
  const std::string gone = run_change(c, RunRecord::of(fewer, 1));
  EXPECT_NE(gone.find("its model.modules was 3, this run's 2 (and "), std::string::npos) << gone;
  EXPECT_NE(gone.find("model.text_encoder.role"), std::string::npos) << gone;

  // The same modules listed in another order are the same run; the optimizer's settings count.
  spec::RunSpec reordered = run;
  std::swap(reordered.model.modules[0], reordered.model.modules[1]);
  EXPECT_EQ(run_change(c, RunRecord::of(reordered, 1)), "");
  spec::RunSpec betas = run;
  betas.trainer.beta2 = 0.999;
  EXPECT_EQ(run_change(c, RunRecord::of(betas, 1)),
            "checkpoint 'ck/step-000003.braidckpt' was trained on another run: its trainer.beta2 was "
            "0.97999999999999998, this run's 0.999");
  // A module name of any text reads back whole.
  spec::RunSpec odd = run;
  odd.model.modules[0].name = "a=b\\c\nd";
  CheckpointContents d;
  RunRecord::of(odd, 1).record(d);
  EXPECT_EQ(*RunRecord::recorded(d), RunRecord::of(odd, 1));

  CheckpointContents broken;
  broken.source = "ck/bad.braidckpt";
  broken.add_blob("run/fields", "seed=1\nno equals sign\n");
  EXPECT_THROW(RunRecord::recorded(broken), Error);
}

TEST(ShardedState, NamesRoundTripAndMalformedOnesAreNotStateNames) {
  for (const nn::TensorSlice& s : {nn::TensorSlice{}, nn::TensorSlice{0, 1, 2}, nn::TensorSlice{1, 3, 4}}) {
    const nn::Parameter p = held_parameter("llm.blocks.0.mlp.fc1.weight", {8, 4}, s);
    const std::string name = state_name("adam_m", p);
    const auto parsed = parse_state_name(name);
    ASSERT_TRUE(parsed) << name;
    EXPECT_EQ(parsed->key, "adam_m/llm.blocks.0.mlp.fc1.weight") << name;
    EXPECT_EQ(parsed->slice, s) << name;
  }
  EXPECT_EQ(state_name("param", held_parameter("w", {8, 4}, {1, 3, 4})), "param/w@1:3/4");
  for (const char* bad :
       {"w", "param/w@2:0/2", "param/w@0:2/2", "param/w@0:-1/2", "param/w@0:0/0", "param/w@0:1/2x", "param/w@0:1"})
    EXPECT_FALSE(parse_state_name(bad)) << bad;
}

// The state of a TP 2 x DP 2 run: every rank's shard (the DP replicas hold the same slices),
// a row-sliced weight and bias, a column-sliced weight and a replicated norm.
std::vector<CheckpointContents> tp2_dp2_shards(const std::map<std::string, std::pair<Tensor, int>>& whole) {
  std::vector<CheckpointContents> shards(4);
  for (int rank = 0; rank < 4; ++rank) {
    const int tp_rank = rank % 2;
    CheckpointContents& c = shards[static_cast<std::size_t>(rank)];
    c.source = "ckpt/step-000002.rank-000" + std::to_string(rank) + ".braidckpt";
    for (const auto& [name, tensor_axis] : whole) {
      const auto& [t, axis] = tensor_axis;
      const nn::Parameter p = held_parameter(name.substr(name.find('/') + 1), t.shape,
                                             axis < 0 ? nn::TensorSlice{} : nn::TensorSlice{axis, tp_rank, 2});
      c.add_tensor(state_name(name.substr(0, name.find('/')), p), slice_of(t, p));
    }
    c.add_int("adam_step/w", 2);
  }
  return shards;
}

TEST(ShardedState, SlicesJoinWholeBitForBitAndAnotherLayoutCutsItsOwn) {
  Tensor rows = random_tensor({6, 4}, 1), cols = random_tensor({3, 8}, 2);
  rows.data[5] = -0.0f;  // joined by copying: even a zero's sign comes back
  const std::map<std::string, std::pair<Tensor, int>> state = {{"param/w", {rows, 0}},
                                                               {"param/b", {random_tensor({6}, 3), 0}},
                                                               {"adam_m/w", {random_tensor({6, 4}, 4), 0}},
                                                               {"param/o", {cols, 1}},
                                                               {"param/norm", {random_tensor({4}, 5), -1}}};
  const auto whole = whole_tensors(tp2_dp2_shards(state));
  ASSERT_EQ(whole.size(), state.size());
  for (const auto& [name, tensor_axis] : state) {
    ASSERT_TRUE(whole.count(name)) << name;
    expect_bits_equal(whole.at(name), tensor_axis.first, name);
  }
  // TP 3 (rows) and TP 4 (columns) cut their slices from it; TP 1 holds it whole.
  expect_bits_equal(slice_of(whole.at("param/w"), held_parameter("w", {6, 4}, {0, 2, 3})),
                    nn::column_parallel_shard(rows, 2, 3), "rows 4-5");
  expect_bits_equal(slice_of(whole.at("param/o"), held_parameter("o", {3, 8}, {1, 1, 4})),
                    nn::row_parallel_shard(cols, 1, 4), "columns 2-3");
  expect_bits_equal(slice_of(whole.at("param/o"), held_parameter("o", {3, 8})), cols, "whole");
  // Round trip: the cut slices join back to the same tensor.
  std::vector<CheckpointContents> tp4(4);
  for (int r = 0; r < 4; ++r) {
    const nn::Parameter p = held_parameter("o", {3, 8}, {1, r, 4});
    tp4[static_cast<std::size_t>(r)].add_tensor(state_name("param", p), slice_of(whole.at("param/o"), p));
  }
  expect_bits_equal(whole_tensors(tp4).at("param/o"), cols, "round trip");
}

TEST(ShardedState, AMissingSliceOrMismatchedShapesAreReportedWithTheCheckpoint) {
  const Tensor w = random_tensor({6, 4}, 7);
  std::vector<CheckpointContents> shards = tp2_dp2_shards({{"param/w", {w, 0}}});
  shards.erase(shards.begin() + 1, shards.end());  // rank 0 only: slice 1 of 2 is nowhere
  test::expect_error(
      [&] { whole_tensors(shards, "ckpt/step-000002.braidckpt"); }, Status::bad_config,
      {"checkpoint 'ckpt/step-000002.braidckpt'", "slice 1 of the 2 slices of param/w along axis 0", "in no shard"});

  // Slices of one tensor that disagree: in shape, or in how many there are.
  CheckpointContents other;
  other.source = "ckpt/step-000002.rank-0001.braidckpt";
  other.add_tensor("param/w@0:1/2", random_tensor({2, 4}, 8));
  shards.push_back(other);
  test::expect_error([&] { whole_tensors(shards); }, Status::bad_config,
                     {"rank-0001", "param/w@0:1/2 (shape (2, 4)) does not match the other slices of param/w",
                      "2 along axis 0 of (6, 4)"});
  shards.back() = CheckpointContents{};
  shards.back().add_tensor("param/w@0:1/3", random_tensor({3, 4}, 8));
  test::expect_error([&] { whole_tensors(shards); }, Status::bad_config, {"does not match the other slices"});
  // A vector cannot be a slice of columns.
  CheckpointContents vector;
  vector.source = "v.braidckpt";
  vector.add_tensor("param/b@1:0/2", random_tensor({3}, 9));
  test::expect_error([&] { whole_tensors({vector}); }, Status::bad_config,
                     {"'v.braidckpt'", "param/b@1:0/2 has shape (3,), not a slice along axis 1"});
  // A whole tensor of another shape than the model's.
  test::expect_error(
      [&] {
        slice_of(w, held_parameter("w", {4, 6}, {0, 0, 2}));
      },
      Status::bad_config, {"w: the checkpoint has shape (6, 4), the model (4, 6)"});
}

TEST(ShardedState, HeldStateNamesAMissingParameterAndKeepsStateNotYetCreated) {
  const Tensor w = random_tensor({6, 4}, 11);
  std::vector<CheckpointContents> shards = tp2_dp2_shards({{"param/w", {w, 0}},
                                                           {"adam_m/w", {random_tensor({6, 4}, 12), 0}},
                                                           {"adam_v/w", {random_tensor({6, 4}, 13), 0}}});
  const WholeState state(shards, "ckpt/step-000002.braidckpt");
  const HeldState held = state.held_by(held_parameter("w", {6, 4}, {0, 1, 3}));
  expect_bits_equal(held.value, nn::column_parallel_shard(w, 1, 3), "w");
  EXPECT_EQ(held.adam.m.shape, (nn::Shape{2, 4}));
  EXPECT_EQ(held.adam.step, 2);
  test::expect_error(
      [&] {
        state.held_by(held_parameter("llm.head.weight", {6, 4}));
      },
      Status::bad_config, {"checkpoint 'ckpt/step-000002.braidckpt'", "no param of parameter llm.head.weight"});
  test::expect_error(
      [&] {
        state.held_by(held_parameter("w", {6, 8}));
      },
      Status::bad_config, {"param of parameter w has shape (6, 4), the model (6, 8)"});

  // Moments without elements in every shard: no optimizer step yet, an empty state.
  std::vector<CheckpointContents> fresh(2);
  for (int r = 0; r < 2; ++r) {
    const nn::Parameter p = held_parameter("w", {6, 4}, {0, r, 2});
    fresh[static_cast<std::size_t>(r)].add_tensor(state_name("param", p), slice_of(w, p));
    fresh[static_cast<std::size_t>(r)].add_tensor(state_name("adam_m", p), Tensor(nn::Shape{0}));
    fresh[static_cast<std::size_t>(r)].add_tensor(state_name("adam_v", p), Tensor(nn::Shape{0}));
  }
  fresh[1].add_int("adam_step/w", 0);  // from any shard
  const HeldState empty = WholeState(fresh, "f").held_by(held_parameter("w", {6, 4}));
  expect_bits_equal(empty.value, w, "w");
  EXPECT_EQ(empty.adam.m.numel(), 0);
  EXPECT_EQ(empty.adam.v.numel(), 0);
  EXPECT_EQ(empty.adam.step, 0);
  // Moments in one slice only: the other slice is missing, not "no state yet".
  const nn::Parameter p0 = held_parameter("w", {6, 4}, {0, 0, 2});
  fresh[0] = CheckpointContents{};
  fresh[0].add_tensor(state_name("param", p0), slice_of(w, p0));
  fresh[0].add_tensor(state_name("adam_m", p0), slice_of(w, p0));
  fresh[0].add_tensor(state_name("adam_v", p0), slice_of(w, p0));
  test::expect_error([&] { WholeState(fresh, "f"); }, Status::bad_config, {"slice 1 of the 2 slices of adam_m/w"});
}

// --- metrics ---

std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(Metrics, LinesAreJsonWithTheRequiredKeys) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  {
    MetricsWriter w(path);
    w.write(StepMetrics{1, 2.3456001281738281, 184.25});
    w.write(StepMetrics{2, std::nan(""), std::numeric_limits<double>::infinity()});
    w.write(EvalMetrics{2, {{"retrieval_top1_i2t", 0.8125}, {"retrieval_top1_t2i", 0.796875}}});
    w.write(EvalMetrics{2, {{"caption_loss", 1.5}, {"token_accuracy", 0.25}}});
    // Written through at once: a reader sees every line while the writer is still open.
    EXPECT_EQ(json_lines(path).size(), 4u);
  }
  const auto lines = json_lines(path);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], nlohmann::json::parse(R"({"step":1,"loss":2.3456001281738281,"samples_per_s":184.25})"));
  // Full precision: the float loss comes back bit for bit.
  EXPECT_EQ(static_cast<float>(lines[0]["loss"].get<double>()), 2.3456001281738281f);
  EXPECT_TRUE(lines[1]["loss"].is_null());
  EXPECT_TRUE(lines[1]["samples_per_s"].is_null());
  EXPECT_EQ(lines[2], nlohmann::json::parse(
                          R"({"eval":true,"step":2,"retrieval_top1_i2t":0.8125,"retrieval_top1_t2i":0.796875})"));
  EXPECT_EQ(lines[3]["caption_loss"], 1.5);
  EXPECT_EQ(lines[3]["token_accuracy"], 0.25);
  EXPECT_EQ(metrics_line(StepMetrics{3, 0.5, 10}), R"({"step":3,"loss":0.5,"samples_per_s":10.0})");
  test::expect_error(
      [] {
        metrics_line(EvalMetrics{1, {{"step", 1.0}}});
      },
      Status::invalid_argument, {"'step'", "reserved"});

  // A new run starts the file afresh.
  { MetricsWriter w(path); }
  EXPECT_EQ(slurp(path), "");
  test::expect_error([&] { MetricsWriter w(dir / "no/such/dir/m.jsonl"); }, Status::io,
                     {"cannot open metrics file '" + (dir / "no/such/dir/m.jsonl") + "'"});
}

TEST(Metrics, ResumeKeepsLinesUpToTheCheckpointStep) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  {
    MetricsWriter w(path);
    for (int s = 1; s <= 10; ++s) {
      w.write(StepMetrics{s, 1.0 / s, 100});
      if (s % 5 == 0) w.write(EvalMetrics{s, {{"caption_loss", 2.0 / s}}});
    }
    w.write_line(R"({"step":11,"lo)");  // killed mid-line: no newline
  }
  std::string partial = slurp(path);
  partial.pop_back();
  spit(path, partial);

  {
    MetricsWriter w(path, /*resume_step=*/6);
    EXPECT_EQ(w.kept_lines(), 7);     // steps 1-6 and the evaluation at step 5
    EXPECT_EQ(w.dropped_lines(), 6);  // steps 7-10, the evaluation at 10, the cut line
    w.write(StepMetrics{7, 0.125, 100});
  }
  const auto lines = json_lines(path);
  ASSERT_EQ(lines.size(), 8u);
  std::vector<std::int64_t> steps;
  for (const auto& l : lines) steps.push_back(l["step"].get<std::int64_t>());
  EXPECT_EQ(steps, (std::vector<std::int64_t>{1, 2, 3, 4, 5, 5, 6, 7}));
  EXPECT_TRUE(lines[5]["eval"].get<bool>());
  EXPECT_EQ(lines[7]["loss"], 0.125);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // Resuming with no file yet starts one.
  { MetricsWriter w(dir / "fresh.jsonl", 3); }
  EXPECT_TRUE(fs::exists(dir / "fresh.jsonl"));

  // A damaged line that is not the last: refused by line number, the file left as it was.
  spit(path, "{\"step\":1,\"loss\":1}\nnot json\n{\"step\":2,\"loss\":1}\n");
  test::expect_error([&] { MetricsWriter w(path, 2); }, Status::bad_config,
                     {"metrics file '" + path + "' line 2", "integer \"step\""});
  EXPECT_EQ(slurp(path), "{\"step\":1,\"loss\":1}\nnot json\n{\"step\":2,\"loss\":1}\n");
}

// --- progress and summary ---

TEST(Progress, DurationsAndTheMovingAverageEta) {
  EXPECT_EQ(format_duration(0), "0:00:00");
  EXPECT_EQ(format_duration(63), "0:01:03");
  EXPECT_EQ(format_duration(59.5), "0:01:00");
  EXPECT_EQ(format_duration(97385), "27:03:05");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");

  ProgressMeter meter(200, /*window=*/3);
  EXPECT_EQ(meter.eta_seconds(0), 0.0);
  EXPECT_EQ(meter.update(10, 2.34561, 184.24, 1.0), "step 10/200  loss 2.3456  184.2 samples/s  ETA 0:03:10");
  meter.update(11, 2.3, 180, 1.0);
  meter.update(12, 2.2, 180, 1.0);
  // The window keeps the last three steps: (1 + 1 + 4) / 3 = 2 s a step, 187 steps left.
  EXPECT_EQ(meter.update(13, 2.1, 45, 4.0), "step 13/200  loss 2.1000  45.0 samples/s  ETA 0:06:14");
  EXPECT_DOUBLE_EQ(meter.eta_seconds(13), 374.0);
  // The 4 s step stays in the window for three steps, then ages out: (4 + 1 + 1) / 3 after
  // step 15, (1 + 1 + 1) / 3 after step 16.
  meter.update(14, 2.0, 180, 1.0);
  meter.update(15, 2.0, 180, 1.0);
  EXPECT_DOUBLE_EQ(meter.eta_seconds(15), 2.0 * 185);
  EXPECT_EQ(meter.update(16, std::nan(""), 180, 1.0), "step 16/200  loss nan  180.0 samples/s  ETA 0:03:04");
  EXPECT_EQ(meter.update(200, 1.0, 180, 1.0), "step 200/200  loss 1.0000  180.0 samples/s  ETA 0:00:00");
  test::expect_error([] { ProgressMeter bad(10, 0); }, Status::invalid_argument, {"window"});
}

TEST(Progress, LinesEveryRoundNumberOfSteps) {
  // At most 20 lines per run, step 1 and the last step included, every 1, 2 or 5 x 10^k steps.
  EXPECT_EQ(default_progress_interval(1), 1);
  EXPECT_EQ(default_progress_interval(20), 1);
  EXPECT_EQ(default_progress_interval(21), 2);
  EXPECT_EQ(default_progress_interval(40), 5);    // every 2 would be 21 lines with step 1
  EXPECT_EQ(default_progress_interval(200), 20);  // every 10 likewise
  EXPECT_EQ(default_progress_interval(201), 20);
  EXPECT_EQ(default_progress_interval(2500), 200);
  EXPECT_EQ(default_progress_interval(1000000), 100000);
  for (std::int64_t total : {1, 7, 20, 21, 40, 99, 200, 2000, 2500, 12345}) {
    const std::int64_t every = default_progress_interval(total);
    int lines = 0;
    for (std::int64_t step = 1; step <= total; ++step) lines += progress_due(step, 1, total, every);
    EXPECT_LE(lines, 20) << total << " steps";  // the multiples, plus the first and last step
    EXPECT_TRUE(progress_due(total, 1, total, every));
  }
  // A resumed run prints its first step; 0 prints nothing.
  EXPECT_TRUE(progress_due(101, 101, 2500, 200));
  EXPECT_FALSE(progress_due(102, 101, 2500, 200));
  EXPECT_TRUE(progress_due(400, 101, 2500, 200));
  EXPECT_FALSE(progress_due(2500, 1, 2500, 0));
}

TEST(Progress, Summary) {
  RunSummary s;
  s.first_step = 101;
  s.last_step = 200;
  s.total_steps = 200;
  s.seconds = 100;
  s.samples = 12800;
  s.final_loss = 0.12346;
  s.last_eval = EvalMetrics{200, {{"retrieval_top1_i2t", 0.8125}, {"retrieval_top1_t2i", 0.796875}}};
  s.checkpoint = "runs/clip/step-000200.braidckpt";
  EXPECT_EQ(format_summary(s),
            "trained steps 101-200 of 200 in 0:01:40 (12800 samples, 128.0 samples/s)\n"
            "final loss 0.1235\n"
            "eval at step 200: retrieval_top1_i2t 0.8125, retrieval_top1_t2i 0.7969\n"
            "checkpoint runs/clip/step-000200.braidckpt\n");
  RunSummary done;
  done.first_step = 201;
  done.last_step = 200;
  done.total_steps = 200;
  EXPECT_EQ(format_summary(done), "nothing to train: the run is at step 200 of 200\n");
}

// The meter's heap figures carry allocator overheads (chunk headers, page rounding) and
// whatever gtest allocates between two samples: well under this.
constexpr double kHeapSlack = 256 * 1024;
constexpr std::int64_t kMiBFloats = 256 * 1024;  // floats in 1 MiB

TEST(MemoryMeter, ParametersByKindFromTheTensorsAsTheyAre) {
  nn::Parameter a;
  a.value = Tensor({4, kMiBFloats});
  a.grad = Tensor({4, kMiBFloats});
  std::vector<TrainedParameter> params(1);
  params[0].param = &a;
  MemoryMeter meter(params);
  meter.begin_step();
  EXPECT_EQ(meter.last()[MemoryKind::weights], 4.0 * (1 << 20));
  EXPECT_EQ(meter.last()[MemoryKind::gradients], 4.0 * (1 << 20));
  EXPECT_EQ(meter.last()[MemoryKind::optimizer], 0);
  // Adam's moments appear at the first optimizer step: optimizer state, not activations.
  params[0].state.m = Tensor({4, kMiBFloats});
  params[0].state.v = Tensor({4, kMiBFloats});
  meter.sample();
  EXPECT_EQ(meter.last()[MemoryKind::optimizer], 8.0 * (1 << 20));
  EXPECT_LT(meter.last()[MemoryKind::activations], kHeapSlack);
  // Shards (ZeRO, tensor parallelism) are measured as what is there now.
  a.grad = Tensor({1, kMiBFloats});
  meter.sample();
  EXPECT_EQ(meter.last()[MemoryKind::gradients], 1.0 * (1 << 20));
  EXPECT_EQ(meter.peak()[MemoryKind::gradients], 4.0 * (1 << 20));
  a.value = Tensor();
  params[0].value_shard = Tensor({1, kMiBFloats});
  params[0].grad_shard = Tensor({1, kMiBFloats});
  meter.sample();
  EXPECT_EQ(meter.last()[MemoryKind::weights], 1.0 * (1 << 20));
  EXPECT_EQ(meter.last()[MemoryKind::gradients], 2.0 * (1 << 20));
  EXPECT_EQ(meter.peak()[MemoryKind::weights], 4.0 * (1 << 20));
  EXPECT_EQ(meter.samples(), 4);
}

TEST(MemoryMeter, WhatTheStepAllocatesBesidesIsActivationsAndPeaksStay) {
  {
    // A sanitizer's allocator replaces glibc's heap, which mallinfo2 then does not see.
    const std::size_t before = MemoryMeter::heap_in_use();
    const Tensor probe({kMiBFloats}, 1.0f);
    if (MemoryMeter::heap_in_use() < before + (1 << 20))
      GTEST_SKIP() << "the heap is not glibc's in this build (a sanitizer's allocator): mallinfo2 does not see it";
  }
  std::vector<TrainedParameter> none;
  MemoryMeter meter(none);
  meter.begin_step();
  EXPECT_LT(meter.last()[MemoryKind::activations], kHeapSlack);
  {
    Tensor activation({8, kMiBFloats}, 1.0f);  // 8 MiB alive across an instruction boundary
    meter.sample();
    EXPECT_GE(meter.last()[MemoryKind::activations], 8.0 * (1 << 20));
    EXPECT_LT(meter.last()[MemoryKind::activations], 8.0 * (1 << 20) + kHeapSlack);
  }
  meter.sample();
  EXPECT_LT(meter.last()[MemoryKind::activations], kHeapSlack);
  EXPECT_GE(meter.peak()[MemoryKind::activations], 8.0 * (1 << 20));
  EXPECT_GE(meter.peak().total, 8.0 * (1 << 20));
  // Every step measures from the first one's start: what an earlier step kept (a cache, the
  // next step's samples) is still memory the training holds besides its state.
  std::vector<float> kept(2 * kMiBFloats, 1.0f);
  meter.begin_step();
  EXPECT_GE(meter.last()[MemoryKind::activations], 2.0 * (1 << 20));
  EXPECT_LT(meter.last()[MemoryKind::activations], 2.0 * (1 << 20) + kHeapSlack);
}

TEST(MemoryMeter, SourcesCountAsTheirKindAndNotAsActivations) {
  std::vector<TrainedParameter> none;
  MemoryMeter meter(none);
  std::vector<char> in_flight;
  meter.add_source(MemoryKind::communication, [&] { return in_flight.size(); });
  meter.add_source(MemoryKind::weights, [] { return std::size_t{1000}; });
  test::expect_error([&] { meter.add_source(MemoryKind::activations, [] { return std::size_t{0}; }); },
                     Status::invalid_argument, {"activations are measured from the heap"});
  meter.begin_step();
  EXPECT_EQ(meter.last()[MemoryKind::weights], 1000);
  in_flight.assign(6 << 20, 'x');
  meter.sample();
  EXPECT_EQ(meter.last()[MemoryKind::communication], 6 << 20);
  EXPECT_LT(meter.last()[MemoryKind::activations], kHeapSlack);
  EXPECT_NEAR(meter.last().total, 1000 + (6 << 20) + meter.last()[MemoryKind::activations], 1e-6);
}

TEST(MemoryMeter, ReportNamesEveryKindOfEveryRankAndThePrecisionUsed) {
  MemoryComparison c;
  c.run_precision = spec::Precision::bf16;
  c.ranks.resize(2);
  for (int k = 0; k < kMemoryKinds; ++k) {
    c.ranks[1].measured.bytes[static_cast<std::size_t>(k)] = (k + 1) << 20;
    c.ranks[1].predicted.bytes[static_cast<std::size_t>(k)] = (k + 1) << 19;
  }
  c.ranks[1].measured.total = 15 << 20;
  c.ranks[1].predicted.total = 15 << 19;
  const auto j = nlohmann::json::parse(memory_json(c, 7));
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["memory"], true);
  EXPECT_EQ(j["run_precision"], "bf16");
  EXPECT_EQ(j["predicted_as"], "fp32");
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (const char* kind : {"weights", "gradients", "optimizer", "activations", "communication", "total"}) {
    EXPECT_TRUE(j["ranks"][0]["measured_bytes"].contains(kind)) << kind;
    EXPECT_TRUE(j["ranks"][0]["predicted_bytes"].contains(kind)) << kind;
  }
  // Point-to-point sends in flight are measured, not predicted: no figure stands in for one.
  EXPECT_EQ(j["ranks"][1]["measured_bytes"]["messages"], 6 << 20);
  EXPECT_FALSE(j["ranks"][1]["predicted_bytes"].contains("messages"));
  EXPECT_EQ(j["ranks"][1]["measured_bytes"]["optimizer"], 3 << 20);
  EXPECT_EQ(j["ranks"][1]["predicted_bytes"]["total"], 15 << 19);
  const std::string table = format_memory_comparison(c);
  EXPECT_NE(table.find("(predicted in fp32, as the trainer runs; the run says bf16)"), std::string::npos) << table;
  EXPECT_NE(table.find("1     optimizer               3.000          1.500                2.00\n"), std::string::npos)
      << table;
  EXPECT_NE(table.find("0     weights                 0.000          0.000                   -\n"), std::string::npos)
      << table;
  EXPECT_NE(table.find("1     messages                6.000              -                   -\n"), std::string::npos)
      << table;
}

}  // namespace
}  // namespace braid
