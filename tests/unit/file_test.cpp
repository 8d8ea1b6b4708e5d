// Whole-file writes (core/common/file.hpp): what they replace, and what they must not.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/common/error.hpp"
#include "core/common/file.hpp"
#include "gtest/gtest.h"

namespace braid {
namespace {

namespace fs = std::filesystem;

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("braid-file-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string at(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
};

TEST_F(FileTest, ReplacesARegularFileWhole) {
  write_file_atomically(at("a.yaml"), "old\n", "cluster file");
  write_file_atomically(at("a.yaml"), "new\n", "cluster file");
  EXPECT_EQ(read(at("a.yaml")), "new\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 1);  // no temp left
}

TEST_F(FileTest, ALinkStaysALinkAndItsFileIsReplaced) {
  write_file_atomically(at("target.yaml"), "old\n", "cluster file");
  fs::create_symlink(at("target.yaml"), at("link.yaml"));
  write_file_atomically(at("link.yaml"), "new\n", "cluster file");
  EXPECT_TRUE(fs::is_symlink(at("link.yaml")));
  EXPECT_EQ(read(at("target.yaml")), "new\n");
  fs::create_symlink(at("later.yaml"), at("dangling.yaml"));  // names the file it creates
  write_file_atomically(at("dangling.yaml"), "made\n", "trace");
  EXPECT_TRUE(fs::is_symlink(at("dangling.yaml")));
  EXPECT_EQ(read(at("later.yaml")), "made\n");
}

TEST_F(FileTest, ADeviceOrAFifoIsWrittenNeverReplaced) {
  // A FIFO stands for every file that is not a regular one (a write to /dev/null itself would,
  // were this broken, replace the machine's /dev/null). Its reader is open before the write,
  // without blocking, so a FIFO replaced by a regular file shows as nothing read, not a hang.
  ASSERT_EQ(::mkfifo(at("pipe").c_str(), 0600), 0);
  const int reader = ::open(at("pipe").c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  write_file_atomically(at("pipe"), "through\n", "metrics");
  char got[16] = {};
  const ssize_t n = ::read(reader, got, sizeof got - 1);
  ::close(reader);
  EXPECT_EQ(std::string(got, n > 0 ? static_cast<std::size_t>(n) : 0), "through\n");
  struct stat st {};
  ASSERT_EQ(::stat(at("pipe").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(unwritable_reason("/dev/null"), "");  // a device one can write to
}

TEST_F(FileTest, UnwritablePlacesAreNamedBeforeAnyWork) {
  EXPECT_EQ(unwritable_reason(""), "no file name given");
  EXPECT_EQ(unwritable_reason(dir_.string()), "it is a directory");
  EXPECT_EQ(unwritable_reason(at("no/such/dir/x.yaml")), "no directory '" + at("no/such/dir") + "'");
  // access() lets root write anywhere; /proc still takes no new files.
  EXPECT_NE(unwritable_reason("/proc/braid-cluster.yaml").find("cannot create a file in '/proc'"), std::string::npos);
  EXPECT_EQ(unwritable_reason(at("fine.yaml")), "");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 0);  // the probe is gone
  try {
    write_file_atomically(at("missing/x.yaml"), "x", "cluster file");
    FAIL() << "wrote into a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::io);
    EXPECT_NE(std::string(e.what()).find("no directory"), std::string::npos) << e.what();
  }
}

TEST_F(FileTest, OneDirectoryHowEverItIsSpelled) {
  fs::create_directories(at("ckpt"));
  fs::create_directory_symlink(at("ckpt"), at("link"));
  EXPECT_TRUE(same_path(at("ckpt"), at("ckpt") + "/"));
  EXPECT_TRUE(same_path(at("ckpt"), at("sub/../ckpt")));
  EXPECT_TRUE(same_path(at("ckpt"), at("link")));
  EXPECT_TRUE(same_path(at("new"), at("new/")));  // neither exists yet
  EXPECT_FALSE(same_path(at("ckpt"), at("ckpt/grads")));
  EXPECT_FALSE(same_path(at("ckpt"), at("other")));
}

}  // namespace
}  // namespace braid
