#pragma once
// Who does what in the world: `world = target_tp * target_groups + drafter_dp`. World ranks
// [0, target_tp * target_groups) are target ranks, group g holding ranks [g * target_tp, (g + 1) * target_tp)
// (tp rank = offset in the group); the remaining drafter_dp ranks are drafter ranks d = 0..drafter_dp-1.
// Target group g feeds the drafter ranks d with d % target_groups == g.
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "lib/comm/transport.h"

namespace dflash::comm {

enum class Role { Target, Drafter };
const char* role_name(Role r);  // "target" | "drafter"

struct RankLayout {
  int target_tp = 0, target_groups = 0, drafter_dp = 0;
  int world_size = 0, world_rank = 0;

  Role role = Role::Target;
  int group = -1;    // target: its group; drafter: the group that feeds it (d % target_groups)
  int tp_rank = -1;  // target only: rank inside the TP group
  int dp_rank = -1;  // drafter only: d

  int target_world_rank(int g, int tp) const { return g * target_tp + tp; }
  int drafter_world_rank(int d) const { return target_tp * target_groups + d; }
  // drafter ranks d (not world ranks) that target group g feeds, ascending
  std::vector<int> drafters_of_group(int g) const;
  // "[rank 3 | target | group 0 tp 3]" for log prefixes
  std::string describe() const;
};

// This process's rank among the ranks of its node (MPI_Comm_split_type SHARED; collective over `world`): which GPU of
// the node it binds.
int node_local_rank(MPI_Comm world);

// The layout for one world rank. Throws dflash::Error (naming the numbers and the fix) when a size is < 1,
// world_size != target_tp * target_groups + drafter_dp, drafter_dp < target_groups (a group would feed nobody),
// or world_rank is outside [0, world_size).
RankLayout make_rank_layout(int target_tp, int target_groups, int drafter_dp, int world_size, int world_rank);

// The role communicators of one rank (MPI_Comm_split of `world`; collective over all of it). Owns and frees them.
//   tp: this rank's target TP group (target ranks; MPI_COMM_NULL on drafters), rank in it = tp_rank;
//   dp: all drafter ranks (drafter ranks; MPI_COMM_NULL on targets), rank in it = dp_rank.
// Packets between a target group and its drafters travel on `world` with layout world ranks.
// The MPI communicators are the control plane. The data plane (`plane`, lib/comm/data_plane.h) has one transport
// per communicator of this rank: world_data (packets), tp_data (target TP all-reduce), dp_data (drafter gradient
// all-reduce); with nccl each is an NCCL communicator bootstrapped over its MPI twin (collective over `world`).
// timeout_seconds bounds NCCL waits (≤ 0: unbounded).
class RoleComms {
 public:
  RoleComms(const RankLayout& layout, MPI_Comm world, DataPlane plane = DataPlane::Mpi, double timeout_seconds = 0);
  ~RoleComms();
  RoleComms(const RoleComms&) = delete;
  RoleComms& operator=(const RoleComms&) = delete;

  MPI_Comm world() const { return world_; }
  MPI_Comm tp() const { return tp_; }
  MPI_Comm dp() const { return dp_; }

  DataPlane plane() const { return plane_; }
  Transport& world_data() const { return *world_data_; }
  Transport& tp_data() const;  // target ranks only
  Transport& dp_data() const;  // drafter ranks only

 private:
  MPI_Comm world_ = MPI_COMM_NULL, tp_ = MPI_COMM_NULL, dp_ = MPI_COMM_NULL;
  DataPlane plane_ = DataPlane::Mpi;
  std::unique_ptr<Transport> world_data_, role_data_;  // role_data_: tp (target) or dp (drafter)
  Role role_ = Role::Target;
};

}  // namespace dflash::comm
