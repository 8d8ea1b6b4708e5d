// Set-up checks that every rank makes at one point, so that a failure on any rank is said once
// and every rank stops alike.
#pragma once

#include <functional>

namespace braid::train {

// Runs `checks` on every rank at once (the CLI: agree_on_setup, an all-gather of who failed),
// throwing on each rank when one failed. Every rank calls it at the same points, and before
// it creates a group (a rank that threw alone would leave the others waiting there).
using Agree = std::function<void(const std::function<void()>&)>;

// The checks through `agree`; with none, run on this rank alone.
inline void agreed(const Agree& agree, const std::function<void()>& checks) { agree ? agree(checks) : checks(); }

}  // namespace braid::train
