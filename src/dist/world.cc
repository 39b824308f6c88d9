#include "dist/world.h"

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
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include "runtime/config.h"
#include "runtime/host_services.h"
#include "runtime/log.h"
#include "runtime/plugin_loader.h"

namespace polychip::dist {
namespace {

using runtime::Communicator;

constexpr char kRankEnv[] = "POLYCHIP_DIST_RANK";
constexpr char kSizeEnv[] = "POLYCHIP_DIST_SIZE";
constexpr char kStoreEnv[] = "POLYCHIP_DIST_STORE";      // node 0's store, HOST:PORT
constexpr char kTokenEnv[] = "POLYCHIP_DIST_TOKEN";      // also the user's --dist-token default
constexpr char kNodeEnv[] = "POLYCHIP_DIST_NODE";        // node rank, nnodes
constexpr char kLocalEnv[] = "POLYCHIP_DIST_LOCAL_RANK";  // index into this node's --device

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

// What is left of a wait until `deadline`, in ms (0 once it has passed).
int64_t MillisecondsLeft(std::chrono::steady_clock::time_point deadline) {
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                  deadline - std::chrono::steady_clock::now())
                                  .count());
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

}  // namespace

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

World::World() = default;
World::World(World&&) noexcept = default;
World& World::operator=(World&&) noexcept = default;
World::~World() = default;

void World::Leave() {
  if (watchdog) watchdog->Stop();
  if (kv) kv->Leave();
}

std::string RankInfo::Encode() const {
  return std::to_string(node) + "\t" + host + "\t" + std::to_string(pid);
}

RankInfo RankInfo::Decode(const std::string& s) {
  RankInfo r;
  const size_t a = s.find('\t'), b = s.rfind('\t');
  r.node = std::atoi(s.substr(0, a).c_str());
  r.host = s.substr(a + 1, b - a - 1);
  r.pid = std::atoll(s.substr(b + 1).c_str());
  return r;
}

int64_t BootstrapTimeout(const ParallelOptions& parallel) {
  const LaunchFlags& f = parallel.launch;
  return f.dist_timeout_ms > 0 ? f.dist_timeout_ms : parallel.timeout_ms;
}

namespace {

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
    const int64_t left = MillisecondsLeft(deadline);
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

}  // namespace

StatusOr<World> StartWorld(const std::string& config_path, const std::string& device_flag,
                           int32_t n_ranks, const ParallelOptions& parallel) {
  if (auto mpirun = MpirunWorldShape()) return MpirunWorld(std::move(*mpirun), config_path, parallel);
  if (std::getenv(kRankEnv) != nullptr) return FollowerWorld(parallel);
  return StartNode(device_flag, n_ranks, parallel);
}

Status JoinWorld(World& w, const ParallelOptions& parallel) {
  const int64_t timeout = BootstrapTimeout(parallel);
  const RankInfo me{w.node, HostIdentity(), int64_t(getpid())};
  PC_RETURN_IF_ERROR(w.kv->Register(Who(w.rank, me.pid, me.host)));
  PC_RETURN_IF_ERROR(w.kv->Set("rank/" + std::to_string(w.rank), me.Encode()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
  std::string missing;
  w.ranks.assign(w.size, RankInfo{});
  for (int32_t r = 0; r < w.size; ++r) {
    const int64_t left = MillisecondsLeft(deadline);
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
    const int64_t left = MillisecondsLeft(deadline);
    world.server->WaitRanksGone(left);
  }
  runtime::SetHostKvStore(nullptr);
  world.server.reset();
}

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

bool IsFollowerRank(const LaunchFlags& flags) {
  if (std::getenv(kRankEnv) != nullptr) return true;
  if (flags.nnodes > 1 && flags.node_rank != 0) return true;
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return mpi_rank != nullptr && std::atoi(mpi_rank) != 0;
}

}  // namespace polychip::dist
