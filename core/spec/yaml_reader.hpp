// Validated reading of YAML documents. Every error names the file, line, column
// and dotted field path ("run.yaml:12:5: training.global_batch: ..."), so a
// user can go straight to the mistake. All spec parsing goes through here.
#pragma once

#include <yaml-cpp/yaml.h>

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace braid::spec {

class Node {
 public:
  Node(YAML::Node node, std::shared_ptr<const std::string> source, std::string path);

  const std::string& path() const { return path_; }
  const std::string& source() const { return *source_; }
  // "file:line:column" of this node (1-based), or just "file" when YAML gave no position.
  std::string where() const;
  [[noreturn]] void fail(const std::string& message) const;

  bool is_map() const { return node_.IsMap(); }
  bool is_sequence() const { return node_.IsSequence(); }
  bool is_scalar() const { return node_.IsScalar(); }
  const YAML::Node& yaml() const { return node_; }

  // Mappings. `at` fails with "missing required field" at this mapping's position.
  bool has(std::string_view key) const;
  Node at(std::string_view key) const;
  std::optional<Node> find(std::string_view key) const;
  // Fails on the first key not in `allowed`, with a "did you mean" when one is close.
  void expect_keys(std::initializer_list<std::string_view> allowed) const;
  std::vector<std::string> keys() const;

  // Sequences (a lone scalar is not promoted: lists must be lists).
  std::vector<Node> items() const;

  // Scalars. Each fails with the expected type and the text it found.
  std::string as_string() const;
  long long as_int() const;
  double as_double() const;
  bool as_bool() const;
  // An integer in [min, INT_MAX].
  long long as_int_at_least(long long min) const;
  double as_positive() const;
  double as_fraction() const;  // in (0, 1]
  // One of `choices`; fails with the list of choices and a "did you mean".
  std::string as_choice(const std::vector<std::string>& choices) const;

 private:
  Node child(const YAML::Node& node, std::string_view key) const;

  YAML::Node node_;
  std::shared_ptr<const std::string> source_;
  std::string path_;
  YAML::Mark mark_;  // where messages point; the node's own mark unless given
};

// The messages of Node::as_int_at_least and Node::as_choice, for checks of typed values
// that must read as the run file's do: "" when `v` is in [min, INT_MAX] / `s` is a choice.
std::string int_at_least_problem(long long v, long long min);
std::string choice_problem(const std::string& s, const std::vector<std::string>& choices);

// Parse a YAML document; `source` names it in messages (a path, or "<string>"). A key
// given twice in one mapping is an error (YAML forbids it; yaml-cpp keeps the first).
Node parse_document(const std::string& text, const std::string& source);
// Read and parse a file; a missing or unreadable file, or a directory, is Status::io
// naming the path.
Node load_document(const std::string& path);

}  // namespace braid::spec
