#include "lib/comm/layout.h"

#include <fmt/format.h>

#include "lib/comm/data_plane.h"
#include "lib/core/error.h"

namespace dflash::comm {

const char* role_name(Role r) { return r == Role::Target ? "target" : "drafter"; }

std::vector<int> RankLayout::drafters_of_group(int g) const {
  std::vector<int> d;
  for (int i = g; i < drafter_dp; i += target_groups) d.push_back(i);
  return d;
}

std::string RankLayout::describe() const {
  if (role == Role::Target) return fmt::format("[rank {} | target | group {} tp {}]", world_rank, group, tp_rank);
  return fmt::format("[rank {} | drafter | dp {}]", world_rank, dp_rank);
}

int node_local_rank(MPI_Comm world) {
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  return local;
}

RankLayout make_rank_layout(int target_tp, int target_groups, int drafter_dp, int world_size, int world_rank) {
  DFLASH_USER_CHECK(target_tp >= 1 && target_groups >= 1 && drafter_dp >= 1,
               "rank layout: target_tp ({}), target_groups ({}) and drafter_dp ({}) must all be ≥ 1", target_tp,
               target_groups, drafter_dp);
  const int need = target_tp * target_groups + drafter_dp;
  DFLASH_USER_CHECK(world_size == need,
               "rank layout: the world has {} ranks but target_tp {} × target_groups {} + drafter_dp {} = {}; "
               "run with mpirun -np {} or change the layout in the config",
               world_size, target_tp, target_groups, drafter_dp, need, need);
  DFLASH_USER_CHECK(drafter_dp >= target_groups,
               "rank layout: drafter_dp {} < target_groups {}: some target group would feed no drafter rank",
               drafter_dp, target_groups);
  DFLASH_CHECK(world_rank >= 0 && world_rank < world_size, "rank layout: world rank {} outside [0, {})", world_rank,
               world_size);
  RankLayout l;
  l.target_tp = target_tp;
  l.target_groups = target_groups;
  l.drafter_dp = drafter_dp;
  l.world_size = world_size;
  l.world_rank = world_rank;
  const int n_target = target_tp * target_groups;
  if (world_rank < n_target) {
    l.role = Role::Target;
    l.group = world_rank / target_tp;
    l.tp_rank = world_rank % target_tp;
  } else {
    l.role = Role::Drafter;
    l.dp_rank = world_rank - n_target;
    l.group = l.dp_rank % target_groups;
  }
  return l;
}

RoleComms::RoleComms(const RankLayout& l, MPI_Comm world, DataPlane plane, double timeout_seconds)
    : world_(world), plane_(plane), role_(l.role) {
  // One split: colour g for target group g, colour target_groups for the drafters; key keeps layout order.
  const int colour = l.role == Role::Target ? l.group : l.target_groups;
  const int key = l.role == Role::Target ? l.tp_rank : l.dp_rank;
  MPI_Comm c = MPI_COMM_NULL;
  DFLASH_CHECK(MPI_Comm_split(world, colour, key, &c) == MPI_SUCCESS, "{}: MPI_Comm_split failed", l.describe());
  (l.role == Role::Target ? tp_ : dp_) = c;
  // every rank joins the world's data communicator first, then its role's: the same order everywhere
  world_data_ = make_data_transport(plane, world, "world", timeout_seconds);
  role_data_ = make_data_transport(plane, c,
                                   l.role == Role::Target ? fmt::format("target TP group {}", l.group)
                                                          : std::string("drafter DP group"),
                                   timeout_seconds);
}

Transport& RoleComms::tp_data() const {
  DFLASH_CHECK(role_ == Role::Target, "tp_data(): a drafter rank has no target TP group");
  return *role_data_;
}

Transport& RoleComms::dp_data() const {
  DFLASH_CHECK(role_ == Role::Drafter, "dp_data(): a target rank has no drafter DP group");
  return *role_data_;
}

RoleComms::~RoleComms() {
  role_data_.reset();  // NCCL communicators go before the MPI communicators they were bootstrapped over
  world_data_.reset();
  if (tp_ != MPI_COMM_NULL) MPI_Comm_free(&tp_);
  if (dp_ != MPI_COMM_NULL) MPI_Comm_free(&dp_);
}

}  // namespace dflash::comm
