// The comm plan of a multi-rank job: which comm plugin each group of ranks uses (the world;
// each pipeline stage's tensor group; each tensor position's pipeline group) and why. A pin
// (--comm-tp, config `comm:`) wins; otherwise the choice goes by what the plugins on the search
// path declare — their reach (one host, or across hosts), whose memory they read, and their
// probe's score here and now — never by their names, so a chip's own collective library
// (an XCCL-like plugin) takes over by declaring itself, and removing any one plugin leaves the
// others to serve.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/parallel.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "runtime/host_services.h"
#include "util/status.h"

namespace polychip::dist {

// The topology the per-group choice reads: each world rank's host, and how the job started.
struct Topology {
  std::vector<std::string> rank_hosts;  // by world rank
  bool mpirun = false;
};

// The comm plugin of one group of ranks, and why it was chosen.
struct GroupComm {
  std::string group;            // "world", "tp", "pp"
  std::vector<int32_t> ranks;   // world ranks, in group order
  runtime::PluginSpec spec;
  std::string why;
  std::vector<std::string> hosts;  // distinct, in rank order
  std::string reach;               // "; reach: ..." once asked (CheckReach), else empty
  bool crosses_hosts = true;       // as CheckReach found
};

// Every group of the job: the world, the tensor group of each stage, the pipeline group of
// each tensor position.
struct JobComms {
  GroupComm world;
  std::vector<GroupComm> tp, pp;  // by stage; by tensor rank
  std::vector<std::string> Describe() const;
  std::vector<GroupComm*> All();
};

// A comm plugin on the search path and what it declares, as the default choice reads it.
struct CommCandidate {
  std::string name;
  int32_t score = 0;  // its probe's, in this process (e.g. higher when launched by mpirun)
  runtime::CommReach reach = runtime::CommReach::kUnknown;
  std::string device_plugin;  // the backend whose device memory it reads; empty: host memory
};

// The usable comm plugins on the config's search path (each inspected in a child process
// first, as discovery does, so a broken one is skipped and logged).
std::vector<CommCandidate> DiscoverCommCandidates(const runtime::RuntimeConfig& config);

// The default plugin of a group on `n_hosts` hosts, for a model on `backend` (empty when not
// known): of the candidates that can join the group (a group across hosts needs a plugin that
// crosses them; a device-memory plugin must read `backend`'s memory), on one host those
// confined to one host first (shared-memory transports), then the highest probe score, then
// the name. nullopt when none fits.
std::optional<CommCandidate> DefaultComm(const std::vector<CommCandidate>& candidates,
                                         size_t n_hosts, const std::string& backend);

JobComms ChooseJobComms(const Topology& topo, int32_t tp, int32_t pp,
                        const runtime::RuntimeConfig& config, const LaunchFlags& flags);

// Asks each group's plugin for its reach (adding it to the description) and warns of a group
// spanning hosts on a plugin that cannot cross them. Logged by rank 0 (all of them).
void CheckReach(JobComms& j, const runtime::RuntimeConfig& config, bool log);

// Loads a group's plugin and logs the choice.
StatusOr<std::shared_ptr<runtime::CommPlugin>> LoadSpec(const runtime::PluginSpec& spec,
                                                       const runtime::RuntimeConfig& config,
                                                       const std::string& why);

// Splitting is collective over the world, so either every group of a kind is split or none:
// true when every group of `groups` is on the world's plugin.
bool SplitAll(const std::vector<GroupComm>& groups, const runtime::Communicator& world);

// This rank's communicator of group `g` (key: the group's name in the store). A group on the
// world's plugin is split from the world (mpi can only make communicators that way); another
// is created through the store, its id published by the group's first rank.
StatusOr<std::unique_ptr<runtime::Communicator>> CreateGroup(
    const GroupComm& g, bool split, const std::string& key, int32_t color,
    runtime::Communicator& world, const runtime::RuntimeConfig& config, runtime::KvStore& kv,
    int64_t timeout);

}  // namespace polychip::dist
