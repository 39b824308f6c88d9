// The processes of a multi-rank job (parallel.h describes the launch as a user sees it): who
// starts which rank, how the ranks find each other (node 0's TCP store, or MPI under mpirun),
// and how a rank that dies is noticed and how the others are reaped.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <sys/types.h>
#include <vector>

#include "dist/parallel.h"
#include "dist/tcp_store.h"
#include "runtime/comm.h"
#include "util/status.h"

namespace polychip::dist {

// What every rank tells the others about itself (published as "rank/<r>").
struct RankInfo {
  int32_t node = 0;
  std::string host;  // the host identity the topology uses (POLYCHIP_HOST_ID, else hostname)
  int64_t pid = 0;
  std::string Encode() const;
  static RankInfo Decode(const std::string& s);
};

class Watchdog;  // ends this rank when another dies (world.cc)

// This process's place in the job and what it holds for it.
struct World {
  World();
  World(World&&) noexcept;
  World& operator=(World&&) noexcept;
  ~World();

  int32_t rank = 0;
  int32_t size = 1;
  int32_t node = 0, n_nodes = 1;
  int32_t local_rank = 0;      // index into this node's --device list
  bool mpirun = false;
  std::vector<pid_t> children;  // the ranks this process started
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only
  StoreAddress store;                      // node 0's store
  std::string token;                       // the job's token
  std::shared_ptr<TcpKvStore> kv;          // this rank's connection, also the host KV store
  std::unique_ptr<Watchdog> watchdog;
  std::vector<RankInfo> ranks;                       // every rank's, by world rank
  std::unique_ptr<runtime::Communicator> mpi_bootstrap;  // under mpirun: the world over mpi

  // Leaves the job cleanly: the store will not report this rank as dead.
  void Leave();
};

// The bootstrap timeout: --dist-timeout when given, else the caller's default.
int64_t BootstrapTimeout(const ParallelOptions& parallel);

// This process's world, however it was started: under mpirun (mpirun's processes are the
// ranks; the store's address travels over MPI), as a rank a node leader started, or as a node
// leader (the process the user started), which starts its node's other ranks.
StatusOr<World> StartWorld(const std::string& config_path, const std::string& device_flag,
                           int32_t n_ranks, const ParallelOptions& parallel);

// Every rank: registers with the store (so that its death is reported), publishes where it
// runs, learns where the others run, starts its watchdog, and lends the store to the plugins.
Status JoinWorld(World& w, const ParallelOptions& parallel);

// Waits for the other ranks to exit, at most `patience`; then kills them. Node 0's rank 0 then
// waits (as long) for the other nodes' ranks to leave its store before it closes it.
void ReapChildren(World& world, std::chrono::seconds patience);

// "emu:0,1" -> rank r's "emu:<r-th id>". No list: every rank takes its process's default.
StatusOr<std::string> RankDeviceFlag(const std::string& device_flag, int32_t rank, int32_t size);

}  // namespace polychip::dist
