// Small text helpers shared by the spec reader, the CLI and error messages.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace braid {

// Levenshtein distance, for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word`, or "" when none is close enough to be a plausible typo.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// Appends `item` to the list `out`, with `separator` before it unless `out` is empty. (Also
// keeps GCC 12 quiet: `(cond ? "" : ",") + std::string(x)` trips its -Wrestrict false positive.)
void append_item(std::string& out, std::string_view item, std::string_view separator);

// "a, b or c"
std::string join_choices(const std::vector<std::string>& items, std::string_view last_sep = " or ");

// `v` with `digits` decimals.
std::string fixed(double v, int digits);
// A duration for people: "1.234 s", "12.34 ms", "56.7 us".
std::string seconds(double s);
// `s` padded with spaces to `width`, on the left when `right` (right-aligned).
std::string pad(std::string s, std::size_t width, bool right = false);

}  // namespace braid
