#include "dist/parallel.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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
constexpr char kKvEnv[] = "POLYCHIP_DIST_KV";

struct World {
  int32_t rank = 0;
  int32_t size = 1;
  std::string kv_dir;
  std::vector<pid_t> children;  // rank 0 only
};

StatusOr<std::vector<std::string>> OwnCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  if (!in) return Unavailable("cannot read /proc/self/cmdline to start the other ranks");
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  if (args.empty()) return Unavailable("empty /proc/self/cmdline");
  return args;
}

// Rank 0: starts ranks 1..size-1 as copies of this process. A child dies with its parent
// (PR_SET_PDEATHSIG), so a killed rank 0 never leaves orphans computing.
StatusOr<World> StartWorld(int32_t size) {
  World w;
  w.size = size;
  char dir[] = "/tmp/polychip-dist-XXXXXX";
  if (mkdtemp(dir) == nullptr) return Unavailable("cannot create a directory in /tmp");
  w.kv_dir = dir;
  PC_ASSIGN_OR_RETURN(std::vector<std::string> args, OwnCommandLine());
  for (int32_t r = 1; r < size; ++r) {
    const pid_t pid = fork();
    if (pid < 0) return Unavailable("fork failed starting rank " + std::to_string(r));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      // Ctrl-C reaches the whole process group: rank 0 alone decides when the job ends.
      signal(SIGINT, SIG_IGN);
      setenv(kRankEnv, std::to_string(r).c_str(), 1);
      setenv(kSizeEnv, std::to_string(size).c_str(), 1);
      setenv(kKvEnv, w.kv_dir.c_str(), 1);
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
  runtime::Log().info("dist: started {} more rank(s) (pids{}), bootstrap in {}", size - 1,
                      [&] {
                        std::string s;
                        for (pid_t p : w.children) s += " " + std::to_string(p);
                        return s;
                      }(),
                      w.kv_dir);
  return w;
}

// Under mpirun (Open MPI's environment) the ranks are mpirun's processes: nothing is started,
// and the bootstrap directory is named after mpirun's job (ranks on one host; across hosts use
// a comm plugin whose ids need no exchange, such as mpi, with a shared /tmp or one host).
std::optional<World> MpirunWorld() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (rank == nullptr || size == nullptr) return std::nullopt;
  const char* job = std::getenv("OMPI_MCA_ess_base_jobid");
  World w;
  w.rank = std::atoi(rank);
  w.size = std::atoi(size);
  w.kv_dir = std::string("/tmp/polychip-dist-mpirun-") + (job != nullptr ? job : "0");
  return w;
}

StatusOr<World> FollowerWorld() {
  World w;
  w.rank = std::atoi(std::getenv(kRankEnv));
  const char* size = std::getenv(kSizeEnv);
  const char* kv = std::getenv(kKvEnv);
  if (size == nullptr || kv == nullptr) {
    return InvalidArgument(std::string(kRankEnv) + " is set but " + kSizeEnv + "/" + kKvEnv +
                           " are not");
  }
  w.size = std::atoi(size);
  w.kv_dir = kv;
  return w;
}

// Waits for the other ranks to exit, at most `patience`; then kills them.
void ReapChildren(const World& world, std::chrono::seconds patience) {
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
  std::error_code ec;
  std::filesystem::remove_all(world.kv_dir, ec);
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
// n_blocks, tokens..., blocks...
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
    p.insert(p.end(), s.tokens.begin(), s.tokens.end());
    p.insert(p.end(), s.block_table.begin(), s.block_table.end());
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
    if (!need(6)) return Internal("dist: truncated step message");
    SequenceStep s;
    s.seq_id = int64_t(uint64_t(uint32_t(p[i])) | (uint64_t(uint32_t(p[i + 1])) << 32));
    s.start_pos = p[i + 2];
    s.logits = static_cast<engine::LogitsMode>(p[i + 3]);
    const size_t n_tok = size_t(p[i + 4]), n_blk = size_t(p[i + 5]);
    i += 6;
    if (!need(n_tok + n_blk)) return Internal("dist: truncated step message");
    s.tokens = {p.data() + i, n_tok};
    s.block_table = {p.data() + i + n_tok, n_blk};
    i += n_tok + n_blk;
    batch.push_back(s);
  }
  return batch;
}

// The hooks of the model: the comm plugin reads host memory, so hidden states go through a
// host buffer (D2H, collective, H2D). One per communicator.
struct HostStaging {
  Communicator* comm = nullptr;
  int64_t n_embd = 0;
  std::vector<float> host;  // [n_rows, n_embd]

  // The hooks receive the runner's stream as const (as every launch does); copies need it
  // mutable, and the runner owns it, so this is safe. `host` stays untouched until the next
  // call, which synchronizes the stream before writing it.
  Status ToHost(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows) {
    auto& s = const_cast<runtime::Stream&>(stream);
    host.resize(uint64_t(n_rows) * n_embd);
    PC_RETURN_IF_ERROR(s.CopyD2H(host.data(), x, host.size() * 4));
    return s.Synchronize();
  }
  Status ToDevice(const runtime::Stream& stream, runtime::DevPtr x) {
    return const_cast<runtime::Stream&>(stream).CopyH2D(x, host.data(), host.size() * 4);
  }
  Status AllReduce(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows) {
    PC_RETURN_IF_ERROR(ToHost(stream, x, n_rows));
    PC_RETURN_IF_ERROR(comm->AllReduce(host.data(), host.data(), host.size(), DType::kF32,
                                       runtime::ReduceOp::kSum));
    return ToDevice(stream, x);
  }
  Status Send(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows, int32_t peer) {
    PC_RETURN_IF_ERROR(ToHost(stream, x, n_rows));
    return comm->Send(host.data(), host.size(), DType::kF32, peer);
  }
  Status Recv(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows, int32_t peer) {
    PC_RETURN_IF_ERROR(const_cast<runtime::Stream&>(stream).Synchronize());
    host.resize(uint64_t(n_rows) * n_embd);
    PC_RETURN_IF_ERROR(comm->Recv(host.data(), host.size(), DType::kF32, peer));
    return ToDevice(stream, x);
  }
};

// What a rank holds besides its runner: the communicators (world; the tensor-parallel group of
// its stage; the pipeline group of its tensor-parallel position) and their staging buffers.
struct Groups {
  int32_t tp = 1, pp = 1;
  std::unique_ptr<Communicator> world, tp_comm, pp_comm;
  HostStaging tp_stage, pp_stage;
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
           std::unique_ptr<model::TransformerRunner> local)
      : world_(std::move(world)),
        groups_(std::move(groups)),
        comm_(groups_->world.get()),
        local_(std::move(local)) {}

  ~TpRunner() override {
    if (!failed_) {
      int64_t header[2] = {kStop, 0};
      Status s = comm_->Broadcast(header, header, 2, DType::kI64, 0);
      if (!s.ok()) runtime::Log().warn("dist: stopping the other ranks: {}", s.ToString());
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

  Status Forward(std::span<const SequenceStep> batch, std::vector<float>* logits) override {
    if (failed_) return Unavailable("dist: a rank failed earlier; the job cannot continue");
    std::vector<int32_t> payload = Encode(batch);
    int64_t header[2] = {kStep, int64_t(payload.size())};
    Status s = comm_->Broadcast(header, header, 2, DType::kI64, 0);
    if (s.ok()) s = comm_->Broadcast(payload.data(), payload.data(), payload.size(), DType::kI32, 0);
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

  const model::TransformerRunner& local() const { return *local_; }
  int32_t tp() const { return groups_->tp; }
  int32_t pp() const { return groups_->pp; }

 private:
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

bool IsFollowerRank() {
  if (std::getenv(kRankEnv) != nullptr) return true;
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return mpi_rank != nullptr && std::atoi(mpi_rank) != 0;
}

std::string DescribeRunner(const engine::ModelRunner& runner) {
  char buf[256];
  if (auto* tp = dynamic_cast<const TpRunner*>(&runner)) {
    const model::TransformerRunner& r = tp->local();
    std::snprintf(buf, sizeof(buf),
                  "tensor parallel x%d, pipeline x%d, rank 0 on %s, %.1f MiB of weights on rank 0",
                  tp->tp(), tp->pp(), r.device().props().name.c_str(), r.weight_bytes() / 1048576.0);
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
  const bool follower = IsFollowerRank();
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
  PC_RETURN_IF_ERROR(RankDeviceFlag(device_flag, 0, n_ranks).status());
  PC_ASSIGN_OR_RETURN(auto plugin, LoadComm(config_path, device_flag));

  World world;
  if (auto mpirun = MpirunWorld()) {
    world = *mpirun;
  } else {
    PC_ASSIGN_OR_RETURN(world, follower ? FollowerWorld() : StartWorld(n_ranks));
  }
  if (follower && world.size != n_ranks) {
    return InvalidArgument("rank " + std::to_string(world.rank) + ": started for " +
                           std::to_string(world.size) + " ranks, --tp-size x --pp-size says " +
                           std::to_string(n_ranks));
  }
  runtime::FileKvStore kv(world.kv_dir);
  // Rank r is tensor rank r % tp of pipeline stage r / tp.
  auto g = std::make_unique<Groups>();
  g->tp = tp;
  g->pp = pp;
  PC_ASSIGN_OR_RETURN(g->world, Communicator::Create(plugin, kv, "world", world.size, world.rank,
                                                     parallel.timeout_ms));
  const int32_t stage = world.rank / tp, tp_rank = world.rank % tp;
  if (tp > 1) {
    PC_ASSIGN_OR_RETURN(g->tp_comm, g->world->Split(stage, tp_rank));
  }
  if (pp > 1) {
    PC_ASSIGN_OR_RETURN(g->pp_comm, g->world->Split(tp_rank, stage));
  }
  g->tp_stage = {g->tp_comm.get(), file.config.n_embd, {}};
  g->pp_stage = {g->pp_comm.get(), file.config.n_embd, {}};

  // Every rank loads its shard, then all agree that every rank succeeded.
  model::RunnerOptions ro = options;
  Groups* gp = g.get();
  if (tp > 1) {
    ro.tensor_parallel.rank = tp_rank;
    ro.tensor_parallel.size = tp;
    ro.tensor_parallel.all_reduce = [gp](const runtime::Stream& s, runtime::DevPtr x, int64_t n) {
      return gp->tp_stage.AllReduce(s, x, n);
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
    PC_ASSIGN_OR_RETURN(std::string flag, RankDeviceFlag(device_flag, world.rank, world.size));
    PC_ASSIGN_OR_RETURN(auto device, model::OpenDevice(config_path, flag, threads));
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
    if (follower) std::exit(1);
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
      std::exit(1);
    }
    local->reset();
    g.reset();
    std::exit(0);
  }
  return std::unique_ptr<engine::ModelRunner>(
      std::make_unique<TpRunner>(std::move(world), std::move(g), std::move(*local)));
}

}  // namespace polychip::dist
