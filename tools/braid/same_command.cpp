#include "tools/braid/same_command.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/common/error.hpp"

namespace braid::cli {

namespace {

// FNV-1a: a digest to compare, not to guard against anyone.
std::uint64_t digest(const std::string& text, std::uint64_t h = 14695981039346656037ull) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return in ? s.str() : std::string();  // unreadable: the command's own check names it
}

// `text` of rank `root` on every rank.
std::string broadcast_text(runtime::Communicator& all, std::string text, int root) {
  std::uint64_t size = text.size();
  all.broadcast(std::as_writable_bytes(std::span(&size, 1)), root);
  text.resize(size);
  all.broadcast(std::as_writable_bytes(std::span(text.data(), text.size())), root);
  return text;
}

// Argument i as the user wrote it: with its option's name when it is that option's value.
std::string quoted(const std::vector<std::string>& args, std::size_t i) {
  if (i >= args.size()) return "nothing";
  const bool value = i > 0 && args[i].rfind('-', 0) != 0 && args[i - 1].rfind("--", 0) == 0;
  return "'" + (value ? args[i - 1] + " " : "") + args[i] + "'";
}

std::vector<std::string> split(const std::string& joined) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t end; (end = joined.find('\0', start)) != std::string::npos; start = end + 1)
    out.push_back(joined.substr(start, end - start));
  return out;
}

}  // namespace

void require_same_command(runtime::World& world, const std::vector<std::string>& args,
                          const std::vector<std::string>& files) {
  if (world.size() < 2 || !world.has_communicator()) return;
  runtime::Communicator& all = world.communicator();
  std::string joined;
  for (const auto& a : args) joined += a + '\0';
  std::uint64_t mine[2] = {digest(joined), 0};
  for (const auto& f : files) {
    if (!f.empty()) mine[1] = digest(contents(f), mine[1] ^ digest(f));
  }
  std::vector<std::uint64_t> every(2 * static_cast<std::size_t>(world.size()));
  all.allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(every)));
  int other = -1;
  for (int r = 1; r < world.size() && other < 0; ++r) {
    if (every[2 * r] != every[0] || every[2 * r + 1] != every[1]) other = r;
  }
  if (other < 0) return;
  const std::string how = " (every rank of a launch runs one command on the same files)";
  if (every[2 * other] == every[0]) {
    throw Error(Status::invalid_argument, "rank " + std::to_string(other) +
                                              " reads other contents than rank 0 from the files the command names"
                                              " (run, plan or cluster file): copy the same files to every node" +
                                              how);
  }
  const auto first = split(broadcast_text(all, joined, 0)), theirs = split(broadcast_text(all, joined, other));
  std::size_t i = 0;
  while (i < first.size() && i < theirs.size() && first[i] == theirs[i]) ++i;
  throw Error(Status::invalid_argument,
              "rank " + std::to_string(other) + " was started with another command than rank 0: " + quoted(theirs, i) +
                  " there, " + quoted(first, i) + " on rank 0 (argument " + std::to_string(i + 1) + ")" + how);
}

}  // namespace braid::cli
