// braid_groups_*: the process groups of a plan (runtime::build_groups), their ranks,
// what each rank holds, the cross-module links and the contrastive batch-sync groups.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "capi/src/enums.hpp"
#include "capi/src/guard.hpp"
#include "capi/src/handles.hpp"

namespace {

using braid::runtime::Axis;

// Ranks go out as the core's vectors: no copy.
static_assert(std::is_same_v<int, int32_t>, "braid_groups hands out the core's int rank vectors as int32_t");

}  // namespace

// Also read by vocabulary.cpp (capi/src/enums.hpp).
namespace braid::capi {

braid_axis axis_to_c(Axis axis) {
  switch (axis) {
    case Axis::tp:
      return BRAID_AXIS_TP;
    case Axis::dp:
      return BRAID_AXIS_DP;
    case Axis::pp:
      return BRAID_AXIS_PP;
    case Axis::cp:
      break;
  }
  throw braid::Error(braid::Status::internal, std::string("a group along axis ") + braid::runtime::axis_name(axis) +
                                                  ", which braid_axis does not name");
}

}  // namespace braid::capi

namespace {

using braid::capi::axis_to_c;

std::string index_range(const char* what, std::size_t index, std::size_t count, const char* items) {
  return std::string(what) + " " + std::to_string(index) + " is out of range (" + std::to_string(count) + " " + items +
         ")";
}

const int32_t* data_or_null(const std::vector<int>& v) { return v.empty() ? nullptr : v.data(); }

}  // namespace

extern "C" {

BRAID_API braid_status braid_groups_create(const braid_plan* plan, int32_t world_size, braid_groups** out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE(out, "out is NULL");
  *out = nullptr;
  BRAID_REQUIRE_HANDLE(plan, braid_plan);
  auto groups = std::make_unique<braid_groups>();
  groups->topology = braid::runtime::build_groups(plan->config->run.model, plan->result.best, world_size);
  for (const auto& m : groups->topology.modules)
    for (const auto& g : m.groups) groups->groups.push_back(&g);
  *out = groups.release();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_destroy(braid_groups* groups) {
  return braid::capi::destroy_handle(groups, __func__, "braid_groups");
}

BRAID_API braid_status braid_groups_world_size(const braid_groups* groups, int32_t* size) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE(size, "size is NULL");
  *size = groups->topology.world_size;
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_count(const braid_groups* groups, size_t* count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE(count, "count is NULL");
  *count = groups->groups.size();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_group(const braid_groups* groups, size_t index, braid_group_info* info) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE_STRUCT(info, braid_group_info, sizeof(braid_group_info));
  BRAID_REQUIRE(index < groups->groups.size(), index_range("index", index, groups->groups.size(), "groups"));
  const auto& g = *groups->groups[index];
  braid_group_info v = BRAID_GROUP_INFO_INIT;
  v.name = g.name.c_str();
  v.module = g.module;
  v.axis = axis_to_c(g.axis);
  v.rank_count = g.ranks.size();
  v.ranks = data_or_null(g.ranks);
  braid::capi::copy_out(v, info);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_rank(const braid_groups* groups, int32_t rank, braid_rank_info* info) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE_STRUCT(info, braid_rank_info, sizeof(braid_rank_info));
  const auto place = groups->topology.place_of(rank);
  braid_rank_info v = BRAID_RANK_INFO_INIT;
  v.stage = place.stage;
  v.replica = place.replica;
  v.tp_rank = place.tp_rank;
  v.holding_count = groups->topology.holdings[static_cast<std::size_t>(rank)].size();
  braid::capi::copy_out(v, info);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_holding(const braid_groups* groups, int32_t rank, size_t index,
                                            braid_holding* holding) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE_STRUCT(holding, braid_holding, sizeof(braid_holding));
  groups->topology.place_of(rank);  // checks the rank
  const auto& held = groups->topology.holdings[static_cast<std::size_t>(rank)];
  BRAID_REQUIRE(index < held.size(), "index " + std::to_string(index) + " is out of range (rank " +
                                         std::to_string(rank) + " holds " + std::to_string(held.size()) +
                                         (held.size() == 1 ? " module stage)" : " module stages)"));
  const auto& h = held[index];
  braid_holding v = BRAID_HOLDING_INIT;
  v.module = h.module;
  v.stage = h.stage;
  v.tp = h.tp;
  v.dp = h.dp;
  braid::capi::copy_out(v, holding);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_link_count(const braid_groups* groups, size_t* count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE(count, "count is NULL");
  *count = groups->topology.links.size();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_link(const braid_groups* groups, size_t index, braid_link_info* info) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE_STRUCT(info, braid_link_info, sizeof(braid_link_info));
  const auto& links = groups->topology.links;
  BRAID_REQUIRE(index < links.size(), index_range("index", index, links.size(), "links"));
  const auto& l = links[index];
  braid_link_info v = BRAID_LINK_INFO_INIT;
  v.from_module = l.from;
  v.to_module = l.to;
  v.from_stage = l.from_stage;
  v.to_stage = l.to_stage;
  v.local = l.local ? 1 : 0;
  v.pair_count = l.pairs.size();
  braid::capi::copy_out(v, info);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_link_pair(const braid_groups* groups, size_t link, size_t pair,
                                              braid_link_pair* out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE_STRUCT(out, braid_link_pair, sizeof(braid_link_pair));
  const auto& links = groups->topology.links;
  BRAID_REQUIRE(link < links.size(), index_range("link", link, links.size(), "links"));
  const auto& pairs = links[link].pairs;
  BRAID_REQUIRE(pair < pairs.size(),
                index_range("pair", pair, pairs.size(), "pairs") + " of link " + std::to_string(link));
  const auto& p = pairs[pair];
  braid_link_pair v = BRAID_LINK_PAIR_INIT;
  v.from_replica = p.from_replica;
  v.to_replica = p.to_replica;
  v.from_rank_count = p.from_ranks.size();
  v.from_ranks = data_or_null(p.from_ranks);
  v.to_rank_count = p.to_ranks.size();
  v.to_ranks = data_or_null(p.to_ranks);
  braid::capi::copy_out(v, out);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_batch_sync_count(const braid_groups* groups, size_t* count) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE(count, "count is NULL");
  *count = groups->topology.batch_syncs.size();
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_batch_sync(const braid_groups* groups, size_t index, braid_batch_sync_info* info) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE_STRUCT(info, braid_batch_sync_info, sizeof(braid_batch_sync_info));
  const auto& syncs = groups->topology.batch_syncs;
  BRAID_REQUIRE(index < syncs.size(), index_range("index", index, syncs.size(), "batch-sync groups"));
  const auto& g = syncs[index];
  braid_batch_sync_info v = BRAID_BATCH_SYNC_INFO_INIT;
  v.name = g.name.c_str();
  v.member_count = g.members.size();
  v.rank_count = g.ranks.size();
  v.ranks = data_or_null(g.ranks);
  braid::capi::copy_out(v, info);
  return BRAID_OK;
  BRAID_API_END
}

BRAID_API braid_status braid_groups_batch_sync_member(const braid_groups* groups, size_t index, size_t member,
                                                      braid_batch_sync_member* out) {
  BRAID_API_BEGIN
  BRAID_REQUIRE_HANDLE(groups, braid_groups);
  BRAID_REQUIRE_STRUCT(out, braid_batch_sync_member, sizeof(braid_batch_sync_member));
  const auto& syncs = groups->topology.batch_syncs;
  BRAID_REQUIRE(index < syncs.size(), index_range("index", index, syncs.size(), "batch-sync groups"));
  const auto& members = syncs[index].members;
  BRAID_REQUIRE(member < members.size(), index_range("member", member, members.size(), "members") +
                                             " of batch-sync group " + std::to_string(index));
  const auto& m = members[member];
  braid_batch_sync_member v = BRAID_BATCH_SYNC_MEMBER_INIT;
  v.module = m.module;
  v.stage = m.stage;
  v.replica = m.replica;
  v.rank_count = m.ranks.size();
  v.ranks = data_or_null(m.ranks);
  braid::capi::copy_out(v, out);
  return BRAID_OK;
  BRAID_API_END
}

}  // extern "C"
