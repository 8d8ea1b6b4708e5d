// Process groups as text: JSON (complete, the machine-readable contract) and a
// summary for people that stays short for thousands of ranks.
#pragma once

#include <string>
#include <vector>

#include "core/runtime/groups.hpp"

namespace braid::runtime {

// Everything in the topology: modules, program stages, every rank's holdings, every
// group, every link pair and every batch-sync member.
std::string to_json(const Topology& t);

struct TextOptions {
  bool all = false;  // list every rank, group and link pair
  int shown = 4;     // otherwise the first `shown` of each list (ranks: twice as many), then "... (N more)"
};
std::string to_text(const Topology& t, const TextOptions& options = {});

// Ranks as people read them: runs of consecutive ranks as "0-7", longer strided runs
// of five or more as "0,8,...,56", anything else listed ("0-3,8,12", "1,3,5,7").
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace braid::runtime
