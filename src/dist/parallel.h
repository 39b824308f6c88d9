// Multi-process model execution: tensor and pipeline parallelism over a comm plugin, one
// process per rank.
//
// The process the user started is rank 0. It starts ranks 1..n-1 as copies of itself (same
// command line; POLYCHIP_DIST_RANK / _SIZE / _KV in their environment, stdout discarded), and
// the ranks bootstrap a communicator through a file key-value store in a fresh directory. Each
// rank opens its own device (`--device emu:0,1`: rank r takes the r-th listed device) and loads
// its shard of the model. Rank 0 runs everything else (scheduler, sampler, server) and
// broadcasts each step's batch; the other ranks only replay the steps.
//
// Under mpirun (`mpirun -np 2 polychip run ... --tp-size 2`), the ranks are mpirun's processes
// instead, and nothing is started.
//
// Several hosts (SGLang's flags): `--nnodes N --node-rank R --dist-init-addr HOST:PORT` on each
// node, whose `--device emu:0,1` lists that node's devices (its ranks; node 0's come first).
// Bootstrap needs no shared filesystem: node 0's rank 0 serves a small token-protected TCP
// key-value store (tcp_store.h) at HOST:PORT — on loopback, at a free port, for a one-host
// launch — which every rank of every node joins; under mpirun its address travels through MPI.
// That store backs the plugins' host KV services. Only node 0 runs the server or prints results.
//
// A comm plugin per group: the world (step broadcast, logits), each pipeline stage's tensor
// group and each tensor position's pipeline group get their own plugin, pinned (--comm-tp,
// config `comm: {tp: shm, pp: gloo}`, or one plugin for all with `comm: {name: ...}` /
// POLYCHIP_COMM_BACKEND) or chosen from the topology: a group on one host takes shm; one
// across hosts the network plugin (mpi under mpirun, else gloo). Every choice is logged.
//
// Failure: a rank that dies makes the others' next collective fail naming it (the comm plugin
// watches its peers); any step error aborts the communicator, so no rank waits forever. Across
// hosts the store watches too: a rank whose connection closes without leaving is reported
// ("rank 3 (pid 123) died on host b") to every rank, which then ends.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "runtime/comm.h"
#include "util/status.h"

namespace polychip::dist {

// The multi-node launch flags (SGLang's spelling) and the per-group comm pins, as the launch
// builder (launch/launch.h) resolved them from the command line or the config file.
struct LaunchFlags {
  int32_t nnodes = 1;
  int32_t node_rank = 0;
  std::string dist_init_addr;  // HOST:PORT of node 0's store; required with nnodes > 1
  std::string dist_token;      // shared by every node; else env POLYCHIP_DIST_TOKEN
  int64_t dist_timeout_ms = 0; // > 0: overrides ParallelOptions::timeout_ms for bootstrap
  std::string comm_world, comm_tp, comm_pp;  // --comm-world/--comm-tp/--comm-pp pins
};

struct ParallelOptions {
  int32_t tp_size = 1;
  int32_t pp_size = 1;  // pipeline stages; ranks = tp_size * pp_size, rank r in stage r / tp_size
  int64_t timeout_ms = 60000;  // communicator creation (all ranks started and attached)
  LaunchFlags launch;
};

// True in a process started by rank 0 as one of the other ranks, under mpirun in a rank other
// than 0, and on a node other than node 0.
bool IsFollowerRank(const LaunchFlags& flags);

// The model runner of this rank for `file`. With one rank it is a plain TransformerRunner on
// the device selected by config_path / device_flag. Otherwise, on rank 0: a runner that
// broadcasts each step to the other ranks (started here) and runs its own shard; on a follower
// rank this call never returns: it replays rank 0's steps until rank 0 closes, then ends the
// process (exit status 0, or 1 after printing the error).
StatusOr<std::unique_ptr<engine::ModelRunner>> CreateRunner(
    const model::ModelFile& file, const std::string& config_path, const std::string& device_flag,
    int threads, const model::RunnerOptions& options, const ParallelOptions& parallel);

// The comm plugin of a multi-rank run: the YAML `comm:` section, else POLYCHIP_COMM_BACKEND,
// else shm. Loaded once per process (the plugin registry keeps it).
StatusOr<std::shared_ptr<runtime::CommPlugin>> LoadComm(const std::string& config_path,
                                                         const std::string& device_flag);

// The comm plugin each group of a tp x pp job would get and why, as CreateRunner logs it, with
// each plugin's reach and a warning line per group that spans hosts on a plugin that cannot
// cross them; for `polychip devices`, which starts nothing. The ranks spread evenly over
// flags.nnodes hosts named node0, node1, ... (node 0's ranks first); the pins
// (--comm-tp, config comm:) apply as at start-up.
StatusOr<std::vector<std::string>> PlanComms(const std::string& config_path,
                                             const std::string& device_flag, int32_t tp,
                                             int32_t pp, const LaunchFlags& flags);

// A one-line description of a runner made by CreateRunner (device, weights, ranks), for logs.
std::string DescribeRunner(const engine::ModelRunner& runner);

// Every group's comm plugin and why, as logged at start-up ("tp group 0 (ranks 0,1 on host a):
// comm 'shm', default: every rank on host a"); empty with one rank.
std::vector<std::string> DescribeComms(const engine::ModelRunner& runner);

}  // namespace polychip::dist
