#include "core/spec/yaml_reader.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <yaml-cpp/depthguard.h>  // YAML::DeepRecursion: yaml.h leaves it out

#include "core/common/error.hpp"
#include "core/common/text.hpp"

namespace braid::spec {
namespace {

std::string position(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

std::string describe_scalar(const YAML::Node& node) {
  if (node.IsNull()) return "nothing";
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a list";
  return "'" + node.Scalar() + "'";
}

}  // namespace

Node::Node(YAML::Node node, std::shared_ptr<const std::string> source, std::string path)
    : node_(std::move(node)), source_(std::move(source)), path_(std::move(path)), mark_(node_.Mark()) {}

std::string Node::where() const { return position(*source_, mark_); }

void Node::fail(const std::string& message) const {
  std::string text = where() + ": ";
  if (!path_.empty()) text += path_ + ": ";
  throw Error(Status::bad_config, text + message);
}

Node Node::child(const YAML::Node& node, std::string_view key) const {
  std::string p = path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  return Node(node, source_, std::move(p));
}

bool Node::has(std::string_view key) const { return node_.IsMap() && node_[std::string(key)].IsDefined(); }

std::optional<Node> Node::find(std::string_view key) const {
  if (!node_.IsMap()) fail("expected a mapping of fields, found " + describe_scalar(node_));
  YAML::Node value = node_[std::string(key)];
  if (!value.IsDefined()) return std::nullopt;
  if (!value.IsNull()) return child(value, key);
  // An empty value ("key:" with nothing after it) has the position of what follows it:
  // report the key's own.
  for (const auto& kv : node_) {
    if (kv.first.Scalar() == key) {
      Node at_key = child(value, key);
      at_key.mark_ = kv.first.Mark();
      return at_key;
    }
  }
  return child(value, key);
}

Node Node::at(std::string_view key) const {
  auto value = find(key);
  if (!value) {
    std::string where_path = path_.empty() ? std::string(key) : path_ + "." + std::string(key);
    throw Error(Status::bad_config,
                where() + ": " + where_path + ": missing required field '" + std::string(key) + "'");
  }
  return *value;
}

std::vector<std::string> Node::keys() const {
  std::vector<std::string> out;
  if (!node_.IsMap()) return out;
  for (const auto& kv : node_) out.push_back(kv.first.Scalar());
  return out;
}

void Node::expect_keys(std::initializer_list<std::string_view> allowed) const {
  if (!node_.IsMap()) fail("expected a mapping of fields, found " + describe_scalar(node_));
  std::vector<std::string> names(allowed.begin(), allowed.end());
  for (const auto& kv : node_) {
    const std::string key = kv.first.Scalar();
    bool known = false;
    for (const auto& a : allowed) known = known || key == a;
    if (known) continue;
    std::string p = path_.empty() ? key : path_ + "." + key;
    std::string msg = position(*source_, kv.first.Mark()) + ": " + p + ": unknown field '" + key + "'";
    std::string guess = closest_match(key, names);
    if (!guess.empty()) msg += " (did you mean '" + guess + "'?)";
    msg += "; allowed here: " + join_choices(names, " and ");
    throw Error(Status::bad_config, msg);
  }
}

std::vector<Node> Node::items() const {
  if (!node_.IsSequence()) fail("expected a list, found " + describe_scalar(node_));
  std::vector<Node> out;
  std::size_t i = 0;
  for (const auto& item : node_) {
    out.emplace_back(item, source_, path_ + "[" + std::to_string(i++) + "]");
  }
  return out;
}

std::string Node::as_string() const {
  if (!node_.IsScalar()) fail("expected a string, found " + describe_scalar(node_));
  return node_.Scalar();
}

long long Node::as_int() const {
  if (!node_.IsScalar()) fail("expected an integer, found " + describe_scalar(node_));
  const std::string& s = node_.Scalar();
  long long value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec == std::errc::result_out_of_range) fail("integer " + s + " is out of range");
  if (ec != std::errc() || end != s.data() + s.size()) {
    fail("expected an integer, found '" + s + "'");
  }
  return value;
}

double Node::as_double() const {
  if (!node_.IsScalar()) fail("expected a number, found " + describe_scalar(node_));
  const std::string& s = node_.Scalar();
  if (s.empty()) fail("expected a number, found nothing");
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(value)) {
    fail("expected a finite number, found '" + s + "'");
  }
  return value;
}

bool Node::as_bool() const {
  if (!node_.IsScalar()) fail("expected true or false, found " + describe_scalar(node_));
  const std::string& s = node_.Scalar();
  if (s == "true" || s == "True" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "False" || s == "no" || s == "off") return false;
  fail("expected true or false, found '" + s + "'");
}

std::string int_at_least_problem(long long v, long long min) {
  if (v < min) return "must be at least " + std::to_string(min) + " (got " + std::to_string(v) + ")";
  // Every count braid reads is an int inside; larger values are typos, not sizes.
  if (v > std::numeric_limits<int>::max())
    return "is too large (got " + std::to_string(v) + ", at most " + std::to_string(std::numeric_limits<int>::max()) +
           ")";
  return "";
}

std::string choice_problem(const std::string& s, const std::vector<std::string>& choices) {
  for (const auto& c : choices) {
    if (c == s) return "";
  }
  std::string msg = "'" + s + "' is not one of " + join_choices(choices);
  std::string guess = closest_match(s, choices);
  if (!guess.empty()) msg += " (did you mean '" + guess + "'?)";
  return msg;
}

long long Node::as_int_at_least(long long min) const {
  long long v = as_int();
  if (auto problem = int_at_least_problem(v, min); !problem.empty()) fail(problem);
  return v;
}

double Node::as_positive() const {
  double v = as_double();
  if (!(v > 0)) fail("must be positive (got " + node_.Scalar() + ")");
  return v;
}

double Node::as_fraction() const {
  double v = as_double();
  if (!(v > 0 && v <= 1)) fail("must be a fraction in (0, 1] (got " + node_.Scalar() + ")");
  return v;
}

std::string Node::as_choice(const std::vector<std::string>& choices) const {
  std::string s = as_string();
  if (auto problem = choice_problem(s, choices); !problem.empty()) fail(problem);
  return s;
}

namespace {

// YAML forbids a key twice in one mapping; yaml-cpp keeps the first silently, so a second
// value the user meant would be ignored.
void reject_repeated_keys(const YAML::Node& node, const std::string& source, const std::string& path) {
  if (node.IsSequence()) {
    std::size_t i = 0;
    for (const auto& item : node) reject_repeated_keys(item, source, path + "[" + std::to_string(i++) + "]");
    return;
  }
  if (!node.IsMap()) return;
  std::vector<std::pair<std::string, YAML::Mark>> seen;
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "";
    const std::string p = path.empty() ? key : path + "." + key;
    for (const auto& [earlier, mark] : seen) {
      if (earlier == key)
        throw Error(Status::bad_config, position(source, kv.first.Mark()) + ": " + p + ": field '" + key +
                                            "' given twice in one mapping (first at line " +
                                            std::to_string(mark.line + 1) + "); keep one");
    }
    seen.emplace_back(key, kv.first.Mark());
    reject_repeated_keys(kv.second, source, p);
  }
}

}  // namespace

Node parse_document(const std::string& text, const std::string& source) {
  auto name = std::make_shared<const std::string>(source);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's message for it is "bad file"
    throw Error(Status::bad_config, position(source, e.mark) +
                                        ": invalid YAML: nested deeper than yaml-cpp reads (it stopped at depth " +
                                        std::to_string(e.depth()) + "); a run file needs a few levels");
  } catch (const YAML::Exception& e) {
    throw Error(Status::bad_config, position(source, e.mark) + ": invalid YAML: " + e.msg);
  }
  reject_repeated_keys(root, source, "");
  Node out(root, name, "");
  if (!root.IsMap()) {
    throw Error(Status::bad_config,
                source + ": expected a YAML mapping at the top level, found " + describe_scalar(root));
  }
  return out;
}

namespace {
constexpr std::size_t kMaxDocumentBytes = std::size_t{16} << 20;
}  // namespace

Node load_document(const std::string& path) {
  // An ifstream opens a directory and reads it as empty text: say what it is instead.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(Status::io, "cannot read '" + path + "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(Status::io, "cannot read '" + path + "': " + std::strerror(errno));
  }
  // A spec file is a few KiB; a device such as /dev/zero (or a wrong path to a large file)
  // would otherwise be read without end.
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxDocumentBytes)
      throw Error(Status::bad_config, "'" + path + "' is larger than " + std::to_string(kMaxDocumentBytes >> 20) +
                                          " MiB: not a braid spec file (run, model, cluster and plan files are a few "
                                          "KiB)");
  }
  if (in.bad()) throw Error(Status::io, "error while reading '" + path + "'");
  return parse_document(text, path);
}

}  // namespace braid::spec
