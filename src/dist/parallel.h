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
// Failure: a rank that dies makes the others' next collective fail naming it (the comm plugin
// watches its peers); any step error aborts the communicator, so no rank waits forever.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/model_runner.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "runtime/comm.h"
#include "util/status.h"

namespace polychip::dist {

struct ParallelOptions {
  int32_t tp_size = 1;
  int32_t pp_size = 1;  // pipeline stages; ranks = tp_size * pp_size, rank r in stage r / tp_size
  int64_t timeout_ms = 60000;  // communicator creation (all ranks started and attached)
};

// True in a process started by rank 0 as one of the other ranks.
bool IsFollowerRank();

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

// A one-line description of a runner made by CreateRunner (device, weights, ranks), for logs.
std::string DescribeRunner(const engine::ModelRunner& runner);

}  // namespace polychip::dist
