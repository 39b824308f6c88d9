#include "dist/parallel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "dist/tcp_store.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "runtime/host_services.h"
#include "runtime/log.h"
#include "runtime/plugin_loader.h"

namespace polychip::dist {
namespace {

using engine::SequenceStep;
using runtime::Communicator;

constexpr char kRankEnv[] = "POLYCHIP_DIST_RANK";
constexpr char kSizeEnv[] = "POLYCHIP_DIST_SIZE";
constexpr char kStoreEnv[] = "POLYCHIP_DIST_STORE";      // node 0's store, HOST:PORT
constexpr char kTokenEnv[] = "POLYCHIP_DIST_TOKEN";      // also the user's --dist-token default
constexpr char kNodeEnv[] = "POLYCHIP_DIST_NODE";        // node rank, nnodes
constexpr char kLocalEnv[] = "POLYCHIP_DIST_LOCAL_RANK";  // index into this node's --device

// What every rank tells the others about itself (published as "rank/<r>").
struct RankInfo {
  int32_t node = 0;
  std::string host;  // the host identity the topology uses (POLYCHIP_HOST_ID, else hostname)
  int64_t pid = 0;
  std::string Encode() const {
    return std::to_string(node) + "\t" + host + "\t" + std::to_string(pid);
  }
  static RankInfo Decode(const std::string& s) {
    RankInfo r;
    const size_t a = s.find('\t'), b = s.rfind('\t');
    r.node = std::atoi(s.substr(0, a).c_str());
    r.host = s.substr(a + 1, b - a - 1);
    r.pid = std::atoll(s.substr(b + 1).c_str());
    return r;
  }
};

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// Simulated hosts on one machine share its hostname: POLYCHIP_HOST_ID tells them apart.
std::string HostIdentity() {
  const char* id = std::getenv("POLYCHIP_HOST_ID");
  return id != nullptr && *id != '\0' ? id : HostName();
}

// "rank 3 (pid 123)\thost-b": how a rank names itself to the store; Died() makes the line.
std::string Who(int32_t rank, int64_t pid, const std::string& host) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ")\t" + host;
}
std::string Died(const std::string& who) {
  const size_t tab = who.find('\t');
  if (tab == std::string::npos) return who + " died";
  return who.substr(0, tab) + " died on host " + who.substr(tab + 1);
}

// Every rank watches the store on its own connection: the first rank that vanished without
// leaving (killed, crashed) or the loss of node 0's store ends this rank, naming the culprit,
// within a fraction of a second, wherever it was blocked (a collective over TCP may otherwise
// wait for its timeout).
class Watchdog {
 public:
  Watchdog(std::unique_ptr<TcpKvStore> kv, int32_t rank, std::string store_owner)
      : kv_(std::move(kv)), rank_(rank), store_owner_(std::move(store_owner)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Watchdog() { Stop(); }
  void Stop() {
    if (stop_.exchange(true)) return;
    thread_.join();
    kv_->Leave();
  }

 private:
  void Run() {
    while (!stop_.load()) {
      StatusOr<std::string> dead = kv_->Get(kDeadKey, 300);
      if (stop_.load()) return;
      if (dead.ok()) {
        End("dist: " + Died(*dead) + " (its connection to the job's store closed); ending rank " +
            std::to_string(rank_));
      }
      if (kv_->lost()) {
        End("dist: lost the job's store at " + kv_->address() + ": " + Died(store_owner_) +
            " or its host is unreachable; ending rank " + std::to_string(rank_));
      }
    }
  }
  void End(const std::string& message) {
    runtime::Log().error("{}", message);
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::unique_ptr<TcpKvStore> kv_;
  int32_t rank_;
  std::string store_owner_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct World {
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
  std::unique_ptr<Communicator> mpi_bootstrap;       // under mpirun: the world over mpi

  // Leaves the job cleanly: the store will not report this rank as dead.
  void Leave() {
    if (watchdog) watchdog->Stop();
    if (kv) kv->Leave();
  }
};

// The rank's store and the bootstrap timeout (the flag overrides the caller's default).
int64_t BootstrapTimeout(const ParallelOptions& parallel) {
  const LaunchFlags& f = parallel.launch;
  return f.dist_timeout_ms > 0 ? f.dist_timeout_ms : parallel.timeout_ms;
}

std::string TokenFromFlags(const LaunchFlags& f) {
  if (!f.dist_token.empty()) return f.dist_token;
  const char* env = std::getenv(kTokenEnv);
  return env != nullptr ? env : "";
}

StatusOr<std::vector<std::string>> OwnCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  if (!in) return Unavailable("cannot read /proc/self/cmdline to start the other ranks");
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  if (args.empty()) return Unavailable("empty /proc/self/cmdline");
  return args;
}

// Starts this node's other ranks (global ranks first+1 .. first+n_local-1) as copies of this
// process. A child dies with its parent (PR_SET_PDEATHSIG), so a killed node leader never
// leaves orphans computing.
Status StartLocalRanks(World& w, int32_t n_local, const std::string& store,
                       const std::string& token) {
  PC_ASSIGN_OR_RETURN(std::vector<std::string> args, OwnCommandLine());
  for (int32_t l = 1; l < n_local; ++l) {
    const int32_t r = w.rank + l;
    const pid_t pid = fork();
    if (pid < 0) return Unavailable("fork failed starting rank " + std::to_string(r));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      // Ctrl-C reaches the whole process group: rank 0 alone decides when the job ends.
      signal(SIGINT, SIG_IGN);
      setenv(kRankEnv, std::to_string(r).c_str(), 1);
      setenv(kSizeEnv, std::to_string(w.size).c_str(), 1);
      setenv(kStoreEnv, store.c_str(), 1);
      setenv(kTokenEnv, token.c_str(), 1);
      setenv(kNodeEnv, (std::to_string(w.node) + "," + std::to_string(w.n_nodes)).c_str(), 1);
      setenv(kLocalEnv, std::to_string(l).c_str(), 1);
      const int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, STDOUT_FILENO);  // rank 0 alone writes results
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "rank %d: exec failed\n", r);
      _exit(127);
    }
    w.children.push_back(pid);
  }
  if (n_local > 1) {
    std::string pids;
    for (pid_t p : w.children) pids += " " + std::to_string(p);
    runtime::Log().info("dist: node {} started {} more rank(s) (pids{}), store {}", w.node,
                        n_local - 1, pids, store);
  }
  return Status::Ok();
}

// The ranks this node runs: its --device list with several nodes; all of them on one host.
StatusOr<int32_t> LocalRankCount(const std::string& device_flag, int32_t nnodes,
                                 int32_t n_ranks) {
  if (nnodes == 1) return n_ranks;
  PC_ASSIGN_OR_RETURN(runtime::DeviceSelection sel, runtime::ParseDeviceFlag(device_flag));
  if (sel.physical.empty()) {
    return InvalidArgument("--nnodes " + std::to_string(nnodes) +
                           ": --device must list this node's devices, one per rank on it "
                           "(e.g. --device " + sel.backend + ":0,1)");
  }
  return int32_t(sel.physical.size());
}

// A node leader (the process the user started on each node; on one host, rank 0): serves the
// store on node 0, registers its rank count, learns where its ranks sit in the world, and
// starts them.
StatusOr<World> StartNode(const std::string& device_flag, int32_t n_ranks,
                          const ParallelOptions& parallel) {
  const LaunchFlags& f = parallel.launch;
  const int64_t timeout = BootstrapTimeout(parallel);
  World w;
  w.size = n_ranks;
  w.node = f.node_rank;
  w.n_nodes = std::max(1, f.nnodes);
  if (w.node < 0 || w.node >= w.n_nodes) {
    return InvalidArgument("--node-rank " + std::to_string(w.node) + " is not in 0.." +
                           std::to_string(w.n_nodes - 1));
  }
  PC_ASSIGN_OR_RETURN(const int32_t n_local, LocalRankCount(device_flag, w.n_nodes, n_ranks));
  std::string token = TokenFromFlags(parallel.launch);
  StoreAddress address;
  if (w.n_nodes == 1) {
    // One host: loopback at a free port, with a fresh token (the ranks get it from us).
    if (token.empty()) token = RandomToken();
    PC_ASSIGN_OR_RETURN(w.server, TcpStoreServer::Start("127.0.0.1", 0, token));
    address.hosts = {"127.0.0.1"};
    address.port = w.server->port();
  } else {
    if (f.dist_init_addr.empty()) {
      return InvalidArgument("--nnodes " + std::to_string(w.n_nodes) +
                             " needs --dist-init-addr HOST:PORT (node 0's address)");
    }
    PC_ASSIGN_OR_RETURN(address, ParseStoreAddress(f.dist_init_addr));
    if (token.empty()) {
      runtime::Log().warn("dist: no --dist-token (or {}): any process that reaches {} can join "
                          "this job", kTokenEnv, address.ToString());
    }
    if (w.node == 0) {
      PC_ASSIGN_OR_RETURN(w.server, TcpStoreServer::Start("", address.port, token));
      runtime::Log().info("dist: node 0 serves the job's store on port {} ({} nodes)",
                          w.server->port(), w.n_nodes);
    }
  }
  const std::string self = "node " + std::to_string(w.node);
  PC_ASSIGN_OR_RETURN(std::unique_ptr<TcpKvStore> kv,
                      TcpKvStore::Connect(address, token, timeout, self));
  w.kv = std::move(kv);
  PC_RETURN_IF_ERROR(
      w.kv->Set("node/" + std::to_string(w.node), std::to_string(n_local) + "\t" + HostName()));
  // Every node's rank count, in node order: node n's ranks follow node n-1's.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
  std::vector<int32_t> counts(w.n_nodes, 0);
  std::string missing;
  for (int32_t n = 0; n < w.n_nodes; ++n) {
    const int64_t left = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(
               deadline - std::chrono::steady_clock::now()).count());
    StatusOr<std::string> v = w.kv->Get("node/" + std::to_string(n), left);
    if (!v.ok()) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(n);
      continue;
    }
    counts[n] = std::atoi(v->c_str());
  }
  if (!missing.empty()) {
    return Unavailable(self + ": node(s) " + missing + " of " + std::to_string(w.n_nodes) +
                       " never arrived at the store at " + address.ToString() + " within " +
                       std::to_string(timeout) + " ms (started with the same --nnodes, "
                       "--dist-init-addr and --dist-token?)");
  }
  int32_t total = 0;
  std::string layout;
  for (int32_t n = 0; n < w.n_nodes; ++n) {
    if (n == w.node) w.rank = total;
    total += counts[n];
    layout += (layout.empty() ? "" : ", ") + std::string("node ") + std::to_string(n) + ": " +
              std::to_string(counts[n]);
  }
  if (total != n_ranks) {
    return InvalidArgument("the nodes' --device lists hold " + std::to_string(total) +
                           " rank(s) (" + layout + "), --tp-size x --pp-size needs " +
                           std::to_string(n_ranks));
  }
  PC_RETURN_IF_ERROR(StartLocalRanks(w, n_local, address.ToString(), token));
  w.store = address;
  w.token = token;
  return w;
}

// A rank started by a node leader.
StatusOr<World> FollowerWorld(const ParallelOptions& parallel) {
  World w;
  w.rank = std::atoi(std::getenv(kRankEnv));
  const char* size = std::getenv(kSizeEnv);
  const char* store = std::getenv(kStoreEnv);
  const char* node = std::getenv(kNodeEnv);
  const char* local = std::getenv(kLocalEnv);
  if (size == nullptr || store == nullptr || node == nullptr || local == nullptr) {
    return InvalidArgument(std::string(kRankEnv) + " is set but " + kSizeEnv + "/" + kStoreEnv +
                           "/" + kNodeEnv + "/" + kLocalEnv + " are not");
  }
  w.size = std::atoi(size);
  std::sscanf(node, "%d,%d", &w.node, &w.n_nodes);
  w.local_rank = std::atoi(local);
  PC_ASSIGN_OR_RETURN(StoreAddress address, ParseStoreAddress(store));
  PC_ASSIGN_OR_RETURN(std::unique_ptr<TcpKvStore> kv,
                      TcpKvStore::Connect(address, TokenFromFlags(parallel.launch), BootstrapTimeout(parallel),
                                          "rank " + std::to_string(w.rank)));
  w.kv = std::move(kv);
  w.store = address;
  w.token = TokenFromFlags(parallel.launch);
  return w;
}

// This machine's IPv4 addresses, the others first: what rank 0 advertises under mpirun.
std::vector<std::string> LocalAddresses() {
  std::vector<std::string> out, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                sizeof(text));
      ((a->ifa_flags & IFF_LOOPBACK) ? loopback : out).push_back(text);
    }
    freeifaddrs(list);
  }
  out.insert(out.end(), loopback.begin(), loopback.end());
  if (out.empty()) out.push_back("127.0.0.1");
  return out;
}

// Under mpirun (Open MPI's environment) the ranks are mpirun's processes: nothing is started.
// MPI itself carries the bootstrap: over the mpi plugin's world (whose ids need no exchange)
// rank 0 broadcasts its store's address and token, and every rank joins the store.
std::optional<World> MpirunWorldShape() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (rank == nullptr || size == nullptr) return std::nullopt;
  World w;
  w.mpirun = true;
  w.rank = std::atoi(rank);
  w.size = std::atoi(size);
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  w.local_rank = local != nullptr ? std::atoi(local) : w.rank;
  return w;
}

StatusOr<World> MpirunWorld(World w, const std::string& config_path,
                            const ParallelOptions& parallel) {
  PC_ASSIGN_OR_RETURN(runtime::RuntimeConfig config,
                      runtime::ResolveRuntimeConfig(config_path, ""));
  PC_ASSIGN_OR_RETURN(auto mpi,
                      runtime::PluginRegistry::Global().LoadComm(
                          "mpi", runtime::PluginSearchPath(config.extra_search_path), {}));
  runtime::InProcessKvStore own;
  PC_ASSIGN_OR_RETURN(std::string id, mpi->UniqueId());
  PC_RETURN_IF_ERROR(own.Set("world", id));
  const int64_t timeout = BootstrapTimeout(parallel);
  PC_ASSIGN_OR_RETURN(w.mpi_bootstrap,
                      Communicator::Create(mpi, own, "world", w.size, w.rank, timeout));
  char message[2048] = {};  // "HOST[,HOST...]:PORT\nTOKEN"
  if (w.rank == 0) {
    const LaunchFlags& f = parallel.launch;
    StoreAddress address;
    if (!f.dist_init_addr.empty()) {
      PC_ASSIGN_OR_RETURN(address, ParseStoreAddress(f.dist_init_addr));
    } else {
      address.hosts = LocalAddresses();
    }
    std::string token = TokenFromFlags(parallel.launch);
    if (token.empty()) token = RandomToken();
    PC_ASSIGN_OR_RETURN(w.server, TcpStoreServer::Start("", address.port, token));
    address.port = w.server->port();
    std::snprintf(message, sizeof(message), "%s\n%s", address.ToString().c_str(), token.c_str());
  }
  PC_RETURN_IF_ERROR(
      w.mpi_bootstrap->Broadcast(message, message, sizeof(message), DType::kI8, 0));
  const std::string text(message);
  const size_t nl = text.find('\n');
  PC_ASSIGN_OR_RETURN(StoreAddress address, ParseStoreAddress(text.substr(0, nl)));
  PC_ASSIGN_OR_RETURN(std::unique_ptr<TcpKvStore> kv,
                      TcpKvStore::Connect(address, text.substr(nl + 1), timeout,
                                          "rank " + std::to_string(w.rank)));
  w.kv = std::move(kv);
  w.store = address;
  w.token = text.substr(nl + 1);
  return w;
}

// Every rank: registers with the store (so that its death is reported), publishes where it
// runs, learns where the others run, starts its watchdog, and lends the store to the plugins.
Status JoinWorld(World& w, const ParallelOptions& parallel) {
  const int64_t timeout = BootstrapTimeout(parallel);
  const RankInfo me{w.node, HostIdentity(), int64_t(getpid())};
  PC_RETURN_IF_ERROR(w.kv->Register(Who(w.rank, me.pid, me.host)));
  PC_RETURN_IF_ERROR(w.kv->Set("rank/" + std::to_string(w.rank), me.Encode()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
  std::string missing;
  w.ranks.assign(w.size, RankInfo{});
  for (int32_t r = 0; r < w.size; ++r) {
    const int64_t left = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(
               deadline - std::chrono::steady_clock::now()).count());
    StatusOr<std::string> v = w.kv->Get("rank/" + std::to_string(r), left);
    if (!v.ok()) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      continue;
    }
    w.ranks[r] = RankInfo::Decode(*v);
  }
  if (!missing.empty()) {
    return Unavailable("rank " + std::to_string(w.rank) + ": rank(s) " + missing + " of " +
                       std::to_string(w.size) + " never joined the job's store at " +
                       w.kv->address() + " within " + std::to_string(timeout) + " ms");
  }
  const std::string owner = Who(0, w.ranks[0].pid, w.ranks[0].host);
  PC_ASSIGN_OR_RETURN(std::unique_ptr<TcpKvStore> watch,
                      TcpKvStore::Connect(w.store, w.token,
                                          timeout, "rank " + std::to_string(w.rank)));
  w.watchdog = std::make_unique<Watchdog>(std::move(watch), w.rank, owner);
  runtime::SetHostKvStore(w.kv);
  // For a network plugin choosing the address it listens on (gloo): the one node 0 reached us by.
  if (const std::string local = w.kv->local_address(); !local.empty()) {
    setenv("POLYCHIP_DIST_LOCAL_ADDR", local.c_str(), 1);
  }
  return Status::Ok();
}

// Waits for the other ranks to exit, at most `patience`; then kills them. Node 0's rank 0 then
// waits (as long) for the other nodes' ranks to leave its store before it closes it.
void ReapChildren(World& world, std::chrono::seconds patience) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (pid_t pid : world.children) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  world.children.clear();
  world.Leave();
  if (world.server) {
    const int64_t left = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(
               deadline - std::chrono::steady_clock::now()).count());
    world.server->WaitRanksGone(left);
  }
  runtime::SetHostKvStore(nullptr);
  world.server.reset();
}

}  // namespace

StatusOr<std::shared_ptr<runtime::CommPlugin>> LoadComm(const std::string& config_path,
                                                         const std::string& device_flag) {
  PC_ASSIGN_OR_RETURN(runtime::RuntimeConfig config,
                      runtime::ResolveRuntimeConfig(config_path, device_flag));
  runtime::PluginSpec spec = config.comm.value_or(runtime::PluginSpec{"shm", "", {}});
  const std::string source =
      config.comm ? config.comm_source : std::string("default (no comm configured)");
  std::shared_ptr<runtime::CommPlugin> comm;
  if (!spec.path.empty()) {
    PC_ASSIGN_OR_RETURN(comm, runtime::LoadCommFromPath(spec.path, spec.params));
  } else {
    PC_ASSIGN_OR_RETURN(comm, runtime::PluginRegistry::Global().LoadComm(
                                  spec.name, runtime::PluginSearchPath(config.extra_search_path),
                                  spec.params));
  }
  runtime::Log().info("comm plugin '{}' {} selected by {}", comm->name(), comm->version(), source);
  return comm;
}

namespace {

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

std::string Join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

GroupComm ChooseGroupComm(const std::string& group, std::vector<int32_t> ranks,
                          const Topology& topo, const runtime::RuntimeConfig& config,
                          const LaunchFlags& f) {
  GroupComm g;
  g.group = group;
  g.ranks = std::move(ranks);
  for (int32_t r : g.ranks) {
    const std::string& h = topo.rank_hosts[r];
    if (std::find(g.hosts.begin(), g.hosts.end(), h) == g.hosts.end()) g.hosts.push_back(h);
  }
  const std::string& flag = group == "tp" ? f.comm_tp : group == "pp" ? f.comm_pp : f.comm_world;
  if (!flag.empty()) {
    g.spec = runtime::PluginSpec{flag, "", {}};
    if (config.comm && config.comm->name == flag) g.spec.params = config.comm->params;
    g.why = "pinned by --comm-" + group;
  } else if (auto it = config.comm_groups.find(group); it != config.comm_groups.end()) {
    g.spec = it->second;
    g.why = "pinned by " + config.comm_source + " (comm." + group + ")";
  } else if (config.comm) {
    g.spec = *config.comm;
    g.why = "pinned by " + config.comm_source;
  } else if (g.hosts.size() == 1) {
    g.spec = runtime::PluginSpec{"shm", "", {}};
    g.why = "default: every rank on host " + g.hosts[0];
  } else {
    g.spec = runtime::PluginSpec{topo.mpirun ? "mpi" : "gloo", "", {}};
    g.why = "default: ranks on " + std::to_string(g.hosts.size()) + " hosts, " +
            (topo.mpirun ? "launched by mpirun" : "launched with --nnodes");
  }
  return g;
}

std::string DescribeGroup(const GroupComm& g, int32_t index) {
  std::string hosts;
  for (const std::string& h : g.hosts) hosts += (hosts.empty() ? "" : ", ") + h;
  std::string name = g.spec.name.empty() ? g.spec.path : g.spec.name;
  return g.group + (g.group == "world" ? "" : " group " + std::to_string(index)) + " (ranks " +
         Join(g.ranks) + " on " + (g.hosts.size() == 1 ? "host " : "hosts ") + hosts +
         "): comm '" + name + "', " + g.why + g.reach;
}

// A group's plugin from the registry, which keeps one per name, so groups share it.
StatusOr<std::shared_ptr<runtime::CommPlugin>> LoadPlugin(const runtime::PluginSpec& spec,
                                                         const runtime::RuntimeConfig& config) {
  if (!spec.path.empty()) return runtime::LoadCommFromPath(spec.path, spec.params);
  return runtime::PluginRegistry::Global().LoadComm(
      spec.name, runtime::PluginSearchPath(config.extra_search_path), spec.params);
}

// Loads a group's plugin and logs the choice.
StatusOr<std::shared_ptr<runtime::CommPlugin>> LoadSpec(const runtime::PluginSpec& spec,
                                                       const runtime::RuntimeConfig& config,
                                                       const std::string& why) {
  PC_ASSIGN_OR_RETURN(auto comm, LoadPlugin(spec, config));
  runtime::Log().info("comm plugin '{}' {} selected by {}", comm->name(), comm->version(), why);
  return comm;
}

// Whether a group's plugin can join ranks of several hosts: what the plugin declares
// (pc_comm_iface_t.reach, ABI 1.3); for an older plugin, one that does not say or one that
// does not load here, the guess made before the ABI carried it (only shm stays on one host).
struct Reach {
  bool crosses_hosts = true;
  std::string text;  // for the log: "one host (declared)", "crosses hosts (guessed: ...)"
};
Reach ReachOf(const runtime::PluginSpec& spec, const runtime::RuntimeConfig& config) {
  auto plugin = LoadPlugin(spec, config);
  if (plugin.ok() && (*plugin)->reach() != runtime::CommReach::kUnknown) {
    const runtime::CommReach reach = (*plugin)->reach();
    return {reach == runtime::CommReach::kCrossesHosts,
            std::string(runtime::CommReachName(reach)) + " (declared)"};
  }
  const bool one_host = spec.path.empty() && spec.name == "shm";
  std::string guess = one_host ? "one host" : "crosses hosts";
  if (plugin.ok()) {
    guess += " (guessed from the name: the ABI " + std::to_string((*plugin)->abi_major()) + "." +
             std::to_string((*plugin)->abi_minor()) + " plugin does not declare it)";
  } else {
    guess += " (guessed from the name: not loadable here)";
  }
  return {!one_host, guess};
}

// Every group of the job: the world, the tensor group of each stage, the pipeline group of
// each tensor position.
struct JobComms {
  GroupComm world;
  std::vector<GroupComm> tp, pp;  // by stage; by tensor rank
  std::vector<std::string> Describe() const {
    std::vector<std::string> lines{DescribeGroup(world, 0)};
    for (size_t i = 0; i < tp.size(); ++i) lines.push_back(DescribeGroup(tp[i], int32_t(i)));
    for (size_t i = 0; i < pp.size(); ++i) lines.push_back(DescribeGroup(pp[i], int32_t(i)));
    return lines;
  }
  std::vector<GroupComm*> All() {
    std::vector<GroupComm*> all{&world};
    for (GroupComm& g : tp) all.push_back(&g);
    for (GroupComm& g : pp) all.push_back(&g);
    return all;
  }
};

JobComms ChooseJobComms(const Topology& topo, int32_t tp, int32_t pp,
                        const runtime::RuntimeConfig& config,
                        const LaunchFlags& flags) {
  JobComms j;
  std::vector<int32_t> all(topo.rank_hosts.size());
  for (int32_t r = 0; r < int32_t(all.size()); ++r) all[r] = r;
  j.world = ChooseGroupComm("world", all, topo, config, flags);
  for (int32_t s = 0; s < pp && tp > 1; ++s) {
    std::vector<int32_t> ranks;
    for (int32_t t = 0; t < tp; ++t) ranks.push_back(s * tp + t);
    j.tp.push_back(ChooseGroupComm("tp", ranks, topo, config, flags));
  }
  for (int32_t t = 0; t < tp && pp > 1; ++t) {
    std::vector<int32_t> ranks;
    for (int32_t s = 0; s < pp; ++s) ranks.push_back(s * tp + t);
    j.pp.push_back(ChooseGroupComm("pp", ranks, topo, config, flags));
  }
  return j;
}

// Asks each group's plugin for its reach (adding it to the description) and warns of a group
// spanning hosts on a plugin that cannot cross them. Logged by rank 0 (all of them).
void CheckReach(JobComms& j, const runtime::RuntimeConfig& config, bool log) {
  std::vector<GroupComm*> groups = j.All();
  for (size_t n = 0; n < groups.size(); ++n) {
    GroupComm& g = *groups[n];
    const Reach reach = ReachOf(g.spec, config);
    g.reach = "; reach: " + reach.text;
    g.crosses_hosts = reach.crosses_hosts;
    if (!log) continue;
    const int32_t index = n == 0 ? 0 : int32_t(n <= j.tp.size() ? n - 1 : n - 1 - j.tp.size());
    runtime::Log().info("dist: {}", DescribeGroup(g, index));
    if (g.hosts.size() > 1 && !reach.crosses_hosts) {
      runtime::Log().warn("dist: {} group of ranks {} spans {} hosts but its comm '{}' ({}) "
                          "reaches only the ranks of one host: creating it will fail",
                          g.group, Join(g.ranks), g.hosts.size(), g.spec.name, g.why);
    }
  }
}

// This rank's communicator of group `g` (key: the group's name in the store). A group on the
// world's plugin is split from the world (mpi can only make communicators that way); another
// is created through the store, its id published by the group's first rank.
bool OnWorldPlugin(const GroupComm& g, const Communicator& world) {
  return g.spec.path.empty() && g.spec.name == world.plugin().name();
}

// Splitting is collective over the world, so either every group of a kind is split or none.
bool SplitAll(const std::vector<GroupComm>& groups, const Communicator& world) {
  return std::all_of(groups.begin(), groups.end(),
                     [&](const GroupComm& g) { return OnWorldPlugin(g, world); });
}

StatusOr<std::unique_ptr<Communicator>> CreateGroup(const GroupComm& g, bool split,
                                                    const std::string& key, int32_t color,
                                                    Communicator& world,
                                                    const runtime::RuntimeConfig& config,
                                                    runtime::KvStore& kv, int64_t timeout) {
  const int32_t me = world.rank();
  const int32_t index = int32_t(std::find(g.ranks.begin(), g.ranks.end(), me) - g.ranks.begin());
  if (split) return world.Split(color, index);
  PC_ASSIGN_OR_RETURN(auto plugin,
                      LoadSpec(g.spec, config, g.why + " for the " + g.group + " group"));
  return Communicator::Create(plugin, kv, key, int32_t(g.ranks.size()), index, timeout);
}

}  // namespace

namespace {

// "emu:0,1" -> rank r's "emu:<r-th id>". No list: every rank takes its process's default.
StatusOr<std::string> RankDeviceFlag(const std::string& device_flag, int32_t rank, int32_t size) {
  if (device_flag.empty()) return std::string();
  PC_ASSIGN_OR_RETURN(runtime::DeviceSelection sel, runtime::ParseDeviceFlag(device_flag));
  if (sel.physical.empty()) return sel.backend;
  if (int32_t(sel.physical.size()) < size) {
    return InvalidArgument("--device " + device_flag + " lists " +
                           std::to_string(sel.physical.size()) + " device(s) for " +
                           std::to_string(size) + " ranks (one device per rank)");
  }
  return sel.backend + ":" + std::to_string(sel.physical[rank]);
}

// ---- the step protocol ----------------------------------------------------------------------
// Each step: a header {kind, payload int32 count} then the payload, both broadcast from rank 0.
// payload: n_seqs, then per sequence: seq_id (2 words), start_pos, logits mode, n_tokens,
// n_blocks, n_window_blocks, tokens..., blocks..., window blocks...
enum : int64_t { kStop = 0, kStep = 1 };

std::vector<int32_t> Encode(std::span<const SequenceStep> batch) {
  std::vector<int32_t> p;
  p.push_back(int32_t(batch.size()));
  for (const SequenceStep& s : batch) {
    p.push_back(int32_t(uint64_t(s.seq_id) & 0xffffffffu));
    p.push_back(int32_t(uint64_t(s.seq_id) >> 32));
    p.push_back(s.start_pos);
    p.push_back(int32_t(s.logits));
    p.push_back(int32_t(s.tokens.size()));
    p.push_back(int32_t(s.block_table.size()));
    p.push_back(int32_t(s.window_block_table.size()));
    p.insert(p.end(), s.tokens.begin(), s.tokens.end());
    p.insert(p.end(), s.block_table.begin(), s.block_table.end());
    p.insert(p.end(), s.window_block_table.begin(), s.window_block_table.end());
  }
  return p;
}

// The steps point into `p`, which must outlive them.
StatusOr<std::vector<SequenceStep>> Decode(const std::vector<int32_t>& p) {
  std::vector<SequenceStep> batch;
  size_t i = 0;
  auto need = [&](size_t n) { return i + n <= p.size(); };
  if (!need(1)) return Internal("dist: empty step message");
  const int32_t n = p[i++];
  for (int32_t k = 0; k < n; ++k) {
    if (!need(7)) return Internal("dist: truncated step message");
    SequenceStep s;
    s.seq_id = int64_t(uint64_t(uint32_t(p[i])) | (uint64_t(uint32_t(p[i + 1])) << 32));
    s.start_pos = p[i + 2];
    s.logits = static_cast<engine::LogitsMode>(p[i + 3]);
    const size_t n_tok = size_t(uint32_t(p[i + 4])), n_blk = size_t(uint32_t(p[i + 5])),
                 n_win = size_t(uint32_t(p[i + 6]));
    i += 7;
    if (!need(n_tok + n_blk + n_win)) return Internal("dist: truncated step message");
    s.tokens = {p.data() + i, n_tok};
    s.block_table = {p.data() + i + n_tok, n_blk};
    s.window_block_table = {p.data() + i + n_tok + n_blk, n_win};
    i += n_tok + n_blk + n_win;
    batch.push_back(s);
  }
  return batch;
}

// The hooks of the model, one per communicator. A comm plugin that reads this backend's device
// memory (as NCCL or BKCL do) gets the hidden states where they are, on the runner's stream,
// with no copy (`on_device`); otherwise they go through a host buffer (D2H, collective, H2D),
// whose bytes `staged_bytes` counts for /metrics.
struct HostStaging {
  Communicator* comm = nullptr;
  int64_t n_embd = 0;
  bool on_device = false;
  std::vector<float> host;  // [n_rows, n_embd]
  std::atomic<uint64_t> staged_bytes{0};  // through host memory, both directions

  HostStaging() = default;
  HostStaging(Communicator* c, int64_t embd) : comm(c), n_embd(embd) {}

  // The hooks receive the runner's stream as const (as every launch does); copies need it
  // mutable, and the runner owns it, so this is safe. `host` stays untouched until the next
  // call, which synchronizes the stream before writing it.
  Status ToHost(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows) {
    auto& s = const_cast<runtime::Stream&>(stream);
    host.resize(uint64_t(n_rows) * n_embd);
    staged_bytes += host.size() * 4;
    PC_RETURN_IF_ERROR(s.CopyD2H(host.data(), x, host.size() * 4));
    return s.Synchronize();
  }
  Status ToDevice(const runtime::Stream& stream, runtime::DevPtr x) {
    staged_bytes += host.size() * 4;
    return const_cast<runtime::Stream&>(stream).CopyH2D(x, host.data(), host.size() * 4);
  }
  Status AllReduce(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows) {
    const uint64_t n = uint64_t(n_rows) * n_embd;
    if (on_device) return comm->AllReduceOn(stream, x, x, n, DType::kF32, runtime::ReduceOp::kSum);
    PC_RETURN_IF_ERROR(ToHost(stream, x, n_rows));
    PC_RETURN_IF_ERROR(comm->AllReduce(host.data(), host.data(), host.size(), DType::kF32,
                                       runtime::ReduceOp::kSum));
    return ToDevice(stream, x);
  }
  Status Send(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows, int32_t peer) {
    if (on_device) return comm->SendOn(stream, x, uint64_t(n_rows) * n_embd, DType::kF32, peer);
    PC_RETURN_IF_ERROR(ToHost(stream, x, n_rows));
    return comm->Send(host.data(), host.size(), DType::kF32, peer);
  }
  Status Recv(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows, int32_t peer) {
    if (on_device) return comm->RecvOn(stream, x, uint64_t(n_rows) * n_embd, DType::kF32, peer);
    PC_RETURN_IF_ERROR(const_cast<runtime::Stream&>(stream).Synchronize());
    host.resize(uint64_t(n_rows) * n_embd);
    PC_RETURN_IF_ERROR(comm->Recv(host.data(), host.size(), DType::kF32, peer));
    return ToDevice(stream, x);
  }
};

// Whether `comm` reads the memory of `backend`'s devices; FAILED_PRECONDITION when it reads
// another backend's (it cannot take host memory, and this one's memory is not what it reads).
StatusOr<bool> OnDevice(const Communicator* comm, const std::string& group,
                        const std::string& backend) {
  if (comm == nullptr || !comm->plugin().reads_device_memory()) return false;
  if (comm->plugin().device_plugin() == backend) return true;
  return FailedPrecondition("dist: the " + group + " group's comm plugin '" +
                            comm->plugin().name() + "' reads the device memory of backend '" +
                            comm->plugin().device_plugin() + "', but the model runs on '" +
                            backend + "'; choose a comm plugin for " + backend +
                            " or one that reads host memory");
}

// What a rank holds besides its runner: the communicators (world; the tensor-parallel group of
// its stage; the pipeline group of its tensor-parallel position) and their staging buffers.
struct Groups {
  int32_t tp = 1, pp = 1;
  std::unique_ptr<Communicator> world, tp_comm, pp_comm;
  // The tensor-parallel group again, over the world's (host-memory) plugin, for the logits,
  // which go to the host anyway: only when tp_comm reads device memory.
  std::unique_ptr<Communicator> tp_host;
  HostStaging tp_stage, pp_stage;
  Communicator* TpHost() const { return tp_host ? tp_host.get() : tp_comm.get(); }
  int32_t LogitsRank() const { return (pp - 1) * tp; }  // last stage, tensor rank 0
};

// After a step, the last stage's tensor rank 0 sends the logits to rank 0 (pipeline only).
Status ShareLogits(Groups& g, std::vector<float>* logits) {
  const int32_t src = g.LogitsRank();
  if (g.pp == 1 || src == 0 || logits->empty()) return Status::Ok();
  if (g.world->rank() == src) return g.world->Send(logits->data(), logits->size(), DType::kF32, 0);
  if (g.world->rank() == 0) return g.world->Recv(logits->data(), logits->size(), DType::kF32, src);
  return Status::Ok();
}

// Rank 0's runner: broadcasts each step, then runs its own shard.
class TpRunner : public engine::ModelRunner {
 public:
  TpRunner(World world, std::unique_ptr<Groups> groups,
           std::unique_ptr<model::TransformerRunner> local, std::vector<std::string> comms)
      : comms_(std::move(comms)),
        world_(std::move(world)),
        groups_(std::move(groups)),
        comm_(groups_->world.get()),
        local_(std::move(local)) {}

  ~TpRunner() override {
    if (!failed_) {
      int64_t header[2] = {kStop, 0};
      Status s = comm_->Broadcast(header, header, 2, DType::kI64, 0);
      if (!s.ok()) runtime::Log().warn("dist: stopping the other ranks: {}", s.ToString());
    }
    for (const auto& [group, stage] :
         {std::pair{"tp", &groups_->tp_stage}, std::pair{"pp", &groups_->pp_stage}}) {
      if (stage->comm == nullptr) continue;
      runtime::Log().info("dist: {} group through '{}' ({}): {} bytes staged through host memory",
                          group, stage->comm->plugin().name(),
                          stage->on_device ? "device memory" : "host memory",
                          stage->staged_bytes.load());
    }
    local_.reset();
    // The others exit once they see the stop (or the abort); do not wait for long.
    ReapChildren(world_, std::chrono::seconds(10));
    groups_.reset();
    runtime::Log().info("dist: {} collectives, {:.3f} s in collectives", n_ops_, comm_seconds_);
  }

  int64_t vocab_size() const override { return local_->vocab_size(); }
  int64_t context_length() const override { return local_->context_length(); }
  int64_t block_size() const override { return local_->block_size(); }
  int64_t num_kv_blocks() const override { return local_->num_kv_blocks(); }
  int64_t num_window_kv_blocks() const override { return local_->num_window_kv_blocks(); }
  int64_t kv_window() const override { return local_->kv_window(); }
  int64_t hidden_size() const override { return local_->hidden_size(); }

  Status Forward(std::span<const SequenceStep> batch, std::vector<float>* logits) override {
    if (failed_) return Unavailable("dist: a rank failed earlier; the job cannot continue");
    std::vector<int32_t> payload = Encode(batch);
    int64_t header[2] = {kStep, int64_t(payload.size())};
    Status s = comm_->Broadcast(header, header, 2, DType::kI64, 0);
    if (s.ok())
      s = comm_->Broadcast(payload.data(), payload.data(), payload.size(), DType::kI32, 0);
    if (s.ok()) s = local_->Forward(batch, logits);
    if (s.ok()) s = ShareLogits(*groups_, logits);
    n_ops_ = comm_->n_ops();
    comm_seconds_ = comm_->seconds_in_ops();
    if (!s.ok()) {
      failed_ = true;
      comm_->Abort();  // the other ranks may be waiting in a collective of this step
    }
    return s;
  }

  // The local runner's metrics, and this rank's bytes staged through host memory per group:
  // zero for a comm plugin that reads the device's memory.
  void RenderMetrics(std::string* out) const override {
    local_->RenderMetrics(out);
    *out +=
        "# HELP polychip_comm_staged_bytes_total Bytes of hidden states this rank copied through "
        "host memory for its collectives (device to host and back), by group.\n"
        "# TYPE polychip_comm_staged_bytes_total counter\n";
    for (const auto& [group, stage] :
         {std::pair{"tp", &groups_->tp_stage}, std::pair{"pp", &groups_->pp_stage}}) {
      if (stage->comm == nullptr) continue;
      *out += std::string("polychip_comm_staged_bytes_total{group=\"") + group + "\",plugin=\"" +
              stage->comm->plugin().name() + "\",device_memory=\"" +
              (stage->on_device ? "true" : "false") + "\"} " +
              std::to_string(stage->staged_bytes.load()) + "\n";
    }
  }

  const model::TransformerRunner& local() const { return *local_; }
  int32_t tp() const { return groups_->tp; }
  int32_t pp() const { return groups_->pp; }
  const std::vector<std::string>& comms() const { return comms_; }

 private:
  std::vector<std::string> comms_;  // every group's comm plugin and why (DescribeComms)
  World world_;
  std::unique_ptr<Groups> groups_;
  Communicator* comm_;  // groups_->world
  std::unique_ptr<model::TransformerRunner> local_;
  bool failed_ = false;
  uint64_t n_ops_ = 0;
  double comm_seconds_ = 0;
};

// A follower: replays rank 0's steps until told to stop.
Status FollowSteps(Groups& g, model::TransformerRunner& runner) {
  Communicator& comm = *g.world;
  std::vector<float> logits;
  for (;;) {
    int64_t header[2] = {0, 0};
    PC_RETURN_IF_ERROR(comm.Broadcast(nullptr, header, 2, DType::kI64, 0));
    if (header[0] == kStop) return Status::Ok();
    std::vector<int32_t> payload(header[1]);
    PC_RETURN_IF_ERROR(comm.Broadcast(nullptr, payload.data(), payload.size(), DType::kI32, 0));
    PC_ASSIGN_OR_RETURN(std::vector<SequenceStep> batch, Decode(payload));
    Status s = runner.Forward(batch, &logits);
    if (s.ok()) s = ShareLogits(g, &logits);
    if (!s.ok()) {
      comm.Abort();
      return s;
    }
  }
}

}  // namespace

bool IsFollowerRank(const LaunchFlags& flags) {
  if (std::getenv(kRankEnv) != nullptr) return true;
  if (flags.nnodes > 1 && flags.node_rank != 0) return true;
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return mpi_rank != nullptr && std::atoi(mpi_rank) != 0;
}

StatusOr<std::vector<std::string>> PlanComms(const std::string& config_path,
                                             const std::string& device_flag, int32_t tp,
                                             int32_t pp, const LaunchFlags& flags) {
  tp = std::max(1, tp);
  pp = std::max(1, pp);
  const int32_t n_ranks = tp * pp;
  const int32_t nnodes = std::max(1, flags.nnodes);
  if (n_ranks % nnodes != 0) {
    return InvalidArgument(std::to_string(n_ranks) + " ranks (--tp-size x --pp-size) do not " +
                           "spread evenly over --nnodes " + std::to_string(nnodes));
  }
  PC_ASSIGN_OR_RETURN(runtime::RuntimeConfig config,
                      runtime::ResolveRuntimeConfig(config_path, device_flag));
  Topology topo;
  topo.mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  for (int32_t r = 0; r < n_ranks; ++r) {
    topo.rank_hosts.push_back("node" + std::to_string(r / (n_ranks / nnodes)));
  }
  JobComms comms = ChooseJobComms(topo, tp, pp, config, flags);
  CheckReach(comms, config, /*log=*/false);
  std::vector<std::string> lines = comms.Describe();
  for (GroupComm* g : comms.All()) {
    if (g->hosts.size() > 1 && !g->crosses_hosts) {
      lines.push_back("warning: the " + g->group + " group of ranks " + Join(g->ranks) +
                      " spans " + std::to_string(g->hosts.size()) + " hosts but its comm '" +
                      g->spec.name + "' reaches only the ranks of one host");
    }
  }
  return lines;
}

std::vector<std::string> DescribeComms(const engine::ModelRunner& runner) {
  if (auto* tp = dynamic_cast<const TpRunner*>(&runner)) return tp->comms();
  return {};
}

std::string DescribeRunner(const engine::ModelRunner& runner) {
  char buf[256];
  if (auto* tp = dynamic_cast<const TpRunner*>(&runner)) {
    const model::TransformerRunner& r = tp->local();
    std::snprintf(buf, sizeof(buf),
                  "tensor parallel x%d, pipeline x%d, rank 0 on %s, %.1f MiB of weights on rank 0",
                  tp->tp(), tp->pp(), r.device().props().name.c_str(),
                  r.weight_bytes() / 1048576.0);
  } else if (auto* r = dynamic_cast<const model::TransformerRunner*>(&runner)) {
    std::snprintf(buf, sizeof(buf), "%s, %.1f MiB of weights", r->device().props().name.c_str(),
                  r->weight_bytes() / 1048576.0);
  } else {
    return "model runner";
  }
  return buf;
}

StatusOr<std::unique_ptr<engine::ModelRunner>> CreateRunner(
    const model::ModelFile& file, const std::string& config_path, const std::string& device_flag,
    int threads, const model::RunnerOptions& options, const ParallelOptions& parallel) {
  const bool follower = IsFollowerRank(parallel.launch);
  const int32_t tp = std::max(1, parallel.tp_size), pp = std::max(1, parallel.pp_size);
  const int32_t n_ranks = tp * pp;
  if (n_ranks == 1 && !follower) {
    PC_ASSIGN_OR_RETURN(auto device, model::OpenDevice(config_path, device_flag, threads));
    PC_ASSIGN_OR_RETURN(auto runner,
                        model::TransformerRunner::Create(*file.file, file.config, device, options));
    return std::unique_ptr<engine::ModelRunner>(std::move(runner));
  }
  // Checks that need no other rank come first: a bad device list or an indivisible model fails
  // before any process is started.
  PC_RETURN_IF_ERROR(model::ShardConfig(file.config, tp).status());
  if (pp > file.config.n_layer) {
    return InvalidArgument("--pp-size " + std::to_string(pp) + " exceeds the model's " +
                           std::to_string(file.config.n_layer) + " layers");
  }
  const LaunchFlags& flags = parallel.launch;
  if (flags.nnodes <= 1) PC_RETURN_IF_ERROR(RankDeviceFlag(device_flag, 0, n_ranks).status());
  PC_ASSIGN_OR_RETURN(runtime::RuntimeConfig config,
                      runtime::ResolveRuntimeConfig(config_path, device_flag));
  const int64_t timeout = BootstrapTimeout(parallel);

  World world;
  if (auto mpirun = MpirunWorldShape()) {
    PC_ASSIGN_OR_RETURN(world, MpirunWorld(std::move(*mpirun), config_path, parallel));
  } else if (std::getenv(kRankEnv) != nullptr) {
    PC_ASSIGN_OR_RETURN(world, FollowerWorld(parallel));
  } else {
    PC_ASSIGN_OR_RETURN(world, StartNode(device_flag, n_ranks, parallel));
  }
  if (world.size != n_ranks) {
    return InvalidArgument("rank " + std::to_string(world.rank) + ": started for " +
                           std::to_string(world.size) + " ranks, --tp-size x --pp-size says " +
                           std::to_string(n_ranks));
  }
  // From here on a failure must not leave other processes waiting: every error path leaves the
  // store cleanly (an error is not a death) and reaps this node's ranks.
  auto fail = [&](Status s) -> Status {
    if (follower) {
      std::fprintf(stderr, "rank %d: %s\n", world.rank, s.ToString().c_str());
      world.Leave();
      std::exit(1);
    }
    ReapChildren(world, std::chrono::seconds(5));
    return s;
  };
  if (Status s = JoinWorld(world, parallel); !s.ok()) return fail(s);
  // Rank r is tensor rank r % tp of pipeline stage r / tp.
  const int32_t stage = world.rank / tp, tp_rank = world.rank % tp;
  Topology topo{{}, world.mpirun};
  for (const RankInfo& r : world.ranks) topo.rank_hosts.push_back(r.host);
  JobComms comms = ChooseJobComms(topo, tp, pp, config, flags);
  if (world.rank == 0) CheckReach(comms, config, /*log=*/true);
  auto g = std::make_unique<Groups>();
  g->tp = tp;
  g->pp = pp;
  auto create = [&]() -> Status {
    if (world.mpi_bootstrap && comms.world.spec.name == "mpi" && comms.world.spec.path.empty()) {
      g->world = std::move(world.mpi_bootstrap);  // MPI's world is already there
      runtime::Log().info("comm plugin 'mpi' {} selected by {}", g->world->plugin().version(),
                          comms.world.why);
    } else {
      PC_ASSIGN_OR_RETURN(auto plugin, LoadSpec(comms.world.spec, config, comms.world.why));
      PC_ASSIGN_OR_RETURN(g->world, Communicator::Create(plugin, *world.kv, "world", world.size,
                                                         world.rank, timeout));
    }
    if (tp > 1) {
      PC_ASSIGN_OR_RETURN(g->tp_comm, CreateGroup(comms.tp[stage], SplitAll(comms.tp, *g->world),
                                                  "tp/" + std::to_string(stage), stage, *g->world,
                                                  config, *world.kv, timeout));
    }
    if (pp > 1) {
      PC_ASSIGN_OR_RETURN(g->pp_comm, CreateGroup(comms.pp[tp_rank], SplitAll(comms.pp, *g->world),
                                                  "pp/" + std::to_string(tp_rank), tp_rank,
                                                  *g->world, config, *world.kv, timeout));
    }
    // A tensor group on device memory (on any stage: the split is collective over the world)
    // gets a host-memory twin for the logits.
    int32_t device_tp = tp > 1 && g->tp_comm->plugin().reads_device_memory() ? 1 : 0;
    std::vector<int32_t> all_device_tp(world.size, 0);
    PC_RETURN_IF_ERROR(g->world->AllGather(&device_tp, all_device_tp.data(), 1, DType::kI32));
    if (std::ranges::find(all_device_tp, 1) != all_device_tp.end()) {
      PC_ASSIGN_OR_RETURN(g->tp_host, g->world->Split(stage, tp_rank));
    }
    return Status::Ok();
  };
  if (Status s = create(); !s.ok()) {
    g.reset();
    return fail(s);
  }
  g->tp_stage.comm = g->tp_comm.get();
  g->tp_stage.n_embd = file.config.n_embd;
  g->pp_stage.comm = g->pp_comm.get();
  g->pp_stage.n_embd = file.config.n_embd;

  // Every rank loads its shard, then all agree that every rank succeeded.
  model::RunnerOptions ro = options;
  Groups* gp = g.get();
  if (tp > 1) {
    ro.tensor_parallel.rank = tp_rank;
    ro.tensor_parallel.size = tp;
    ro.tensor_parallel.all_reduce = [gp](const runtime::Stream& s, runtime::DevPtr x, int64_t n) {
      return gp->tp_stage.AllReduce(s, x, n);
    };
    ro.tensor_parallel.all_gather = [gp](const float* send, float* out, int64_t count) {
      return gp->TpHost()->AllGather(send, out, uint64_t(count), DType::kF32);
    };
  }
  if (pp > 1) {
    ro.pipeline.stage = stage;
    ro.pipeline.n_stages = pp;
    std::tie(ro.pipeline.first_layer, ro.pipeline.end_layer) =
        model::StageLayers(file.config.n_layer, stage, pp);
    ro.pipeline.send = [gp, stage](const runtime::Stream& s, runtime::DevPtr x, int64_t n) {
      return gp->pp_stage.Send(s, x, n, stage + 1);
    };
    ro.pipeline.recv = [gp, stage](const runtime::Stream& s, runtime::DevPtr x, int64_t n) {
      return gp->pp_stage.Recv(s, x, n, stage - 1);
    };
  }
  auto load = [&]() -> StatusOr<std::unique_ptr<model::TransformerRunner>> {
    PC_ASSIGN_OR_RETURN(std::string flag,
                        RankDeviceFlag(device_flag, world.local_rank, world.local_rank + 1));
    PC_ASSIGN_OR_RETURN(auto device, model::OpenDevice(config_path, flag, threads));
    const std::string backend = device->backend()->name();
    PC_ASSIGN_OR_RETURN(gp->tp_stage.on_device, OnDevice(gp->tp_comm.get(), "tensor", backend));
    PC_ASSIGN_OR_RETURN(gp->pp_stage.on_device, OnDevice(gp->pp_comm.get(), "pipeline", backend));
    return model::TransformerRunner::Create(*file.file, file.config, device, ro);
  };
  auto local = load();
  if (!local.ok() && follower) {
    std::fprintf(stderr, "rank %d: %s\n", world.rank, local.status().ToString().c_str());
  }
  int32_t ok = local.ok() ? 1 : 0;
  std::vector<int32_t> all_ok(world.size, 0);
  Status agreed = g->world->AllGather(&ok, all_ok.data(), 1, DType::kI32);
  std::string failed_ranks;
  for (int32_t r = 0; r < world.size; ++r) {
    if (!all_ok[r]) failed_ranks += (failed_ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!agreed.ok() || !failed_ranks.empty()) {
    if (follower) {
      world.Leave();
      std::exit(1);
    }
    g.reset();
    ReapChildren(world, std::chrono::seconds(5));
    if (!local.ok()) return local.status();
    if (!agreed.ok()) return agreed;
    return Unavailable("rank(s) " + failed_ranks + " failed to load their shard (see above)");
  }
  runtime::Log().info("dist: rank {} of {} (stage {}, tensor rank {}) ready ({})", world.rank,
                      world.size, stage, tp_rank, DescribeRunner(**local));

  if (follower) {
    Status s = FollowSteps(*g, **local);
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", world.rank, s.ToString().c_str());
      world.Leave();
      std::exit(1);
    }
    local->reset();
    g.reset();
    ReapChildren(world, std::chrono::seconds(10));  // a node leader's own ranks
    std::exit(0);
  }
  return std::unique_ptr<engine::ModelRunner>(
      std::make_unique<TpRunner>(std::move(world), std::move(g), std::move(*local),
                                 comms.Describe()));
}

}  // namespace polychip::dist
