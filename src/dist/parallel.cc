// Tensor and pipeline parallel model execution (parallel.h): rank 0's runner, which broadcasts
// each step and runs its own shard, and the followers' loop, which replays the steps. The
// processes are world.h's, the communicators comm_plan.h's, the messages step_protocol.h's.
#include "dist/parallel.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "dist/comm_plan.h"
#include "dist/step_protocol.h"
#include "dist/world.h"
#include "model/lora.h"
#include "runtime/config.h"
#include "runtime/log.h"

namespace polychip::dist {
namespace {

using engine::SequenceStep;
using runtime::Communicator;

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
  int64_t kv_blocks_per_pool() const override { return local_->kv_blocks_per_pool(); }
  int64_t num_window_kv_blocks() const override { return local_->num_window_kv_blocks(); }
  int64_t kv_window() const override { return local_->kv_window(); }
  int64_t hidden_size() const override { return local_->hidden_size(); }

  Status Forward(std::span<const SequenceStep> batch, std::vector<float>* logits) override {
    if (failed_) return Unavailable("dist: a rank failed earlier; the job cannot continue");
    // The step's adapters, those the other ranks have not opened yet marked fresh, and those
    // gone everywhere (unloaded, and out of this rank's device cache, so out of every rank's:
    // the caches see the same steps) for them to forget.
    std::vector<StepAdapter> adapters;
    bool fresh = false;
    for (const SequenceStep& s : batch) {
      if (s.adapter == nullptr) continue;
      const int64_t id = s.adapter->id();
      if (std::ranges::any_of(adapters, [id](const StepAdapter& a) { return a.id == id; })) {
        continue;
      }
      const auto* a = dynamic_cast<const model::LoraAdapter*>(s.adapter);
      if (a == nullptr) return InvalidArgument("dist: the step's adapter is not a LoRA adapter");
      const bool new_here = !sent_adapters_.contains(id);
      fresh = fresh || new_here;
      adapters.push_back({id, new_here, a->default_scale(), a->name(), a->path()});
    }
    std::vector<int64_t> forget;
    for (auto it = sent_adapters_.begin(); it != sent_adapters_.end();) {
      if (!it->second.expired()) {
        ++it;
        continue;
      }
      forget.push_back(it->first);
      it = sent_adapters_.erase(it);
    }
    std::vector<int32_t> payload = EncodeStep(batch, adapters, forget);
    int64_t header[2] = {kStep, int64_t(payload.size())};
    Status s = comm_->Broadcast(header, header, 2, DType::kI64, 0);
    if (s.ok())
      s = comm_->Broadcast(payload.data(), payload.data(), payload.size(), DType::kI32, 0);
    if (s.ok() && fresh) {
      // Every rank says whether it opened the fresh adapters; if one could not, no rank runs
      // the step, the requests of this step fail and the job goes on.
      int32_t ok = 1;
      std::vector<int32_t> all_ok(size_t(comm_->size()), 0);
      s = comm_->AllGather(&ok, all_ok.data(), 1, DType::kI32);
      std::string failed_ranks;
      for (size_t r = 0; s.ok() && r < all_ok.size(); ++r) {
        if (!all_ok[r]) failed_ranks += (failed_ranks.empty() ? "" : ", ") + std::to_string(r);
      }
      if (s.ok() && !failed_ranks.empty()) {
        std::string names;
        for (const StepAdapter& a : adapters) {
          if (a.fresh) names += (names.empty() ? "'" : ", '") + a.name + "' (" + a.path + ")";
        }
        return FailedPrecondition("dist: rank(s) " + failed_ranks +
                                  " could not open the LoRA adapter(s) " + names +
                                  " (see their error above)");
      }
      for (const SequenceStep& st : batch) {
        if (st.adapter == nullptr) continue;
        const auto* a = static_cast<const model::LoraAdapter*>(st.adapter);
        sent_adapters_.try_emplace(a->id(), a->weak_from_this());
      }
    }
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
  // The adapters the other ranks hold (opened from the path sent), until gone here.
  std::map<int64_t, std::weak_ptr<const model::LoraAdapter>> sent_adapters_;
  uint64_t n_ops_ = 0;
  double comm_seconds_ = 0;
};

// A follower: replays rank 0's steps until told to stop. It opens each LoRA adapter rank 0
// sends (from its path, checked against `base`, the whole model's configuration) and keeps it
// until rank 0 says to forget it.
Status FollowSteps(Groups& g, model::TransformerRunner& runner, const model::ModelConfig& base) {
  Communicator& comm = *g.world;
  std::vector<float> logits;
  std::map<int64_t, std::shared_ptr<const model::LoraAdapter>> adapters;
  for (;;) {
    int64_t header[2] = {0, 0};
    PC_RETURN_IF_ERROR(comm.Broadcast(nullptr, header, 2, DType::kI64, 0));
    if (header[0] == kStop) return Status::Ok();
    std::vector<int32_t> payload(header[1]);
    PC_RETURN_IF_ERROR(comm.Broadcast(nullptr, payload.data(), payload.size(), DType::kI32, 0));
    PC_ASSIGN_OR_RETURN(DecodedStep step, DecodeStep(payload));
    for (int64_t id : step.forget) adapters.erase(id);
    bool fresh = false;
    Status opened = Status::Ok();
    for (const StepAdapter& a : step.adapters) {
      if (!a.fresh) continue;
      fresh = true;
      auto r = model::LoraAdapter::OpenReplica(a.path, base, a.id, a.name, a.default_scale);
      if (r.ok()) {
        adapters[a.id] = *std::move(r);
      } else if (opened.ok()) {
        opened = r.status();
      }
    }
    if (fresh) {  // as rank 0's Forward: all or none run the step
      int32_t ok = opened.ok() ? 1 : 0;
      std::vector<int32_t> all_ok(size_t(comm.size()), 0);
      PC_RETURN_IF_ERROR(comm.AllGather(&ok, all_ok.data(), 1, DType::kI32));
      if (!opened.ok()) std::fprintf(stderr, "rank %d: %s\n", comm.rank(), opened.ToString().c_str());
      if (std::ranges::find(all_ok, 0) != all_ok.end()) continue;
    }
    for (size_t k = 0; k < step.batch.size(); ++k) {
      if (step.adapter_of[k] < 0) continue;
      auto it = adapters.find(step.adapters[size_t(step.adapter_of[k])].id);
      if (it == adapters.end()) return Internal("dist: a step names a LoRA adapter never sent");
      step.batch[k].adapter = it->second.get();
    }
    Status s = runner.Forward(step.batch, &logits);
    if (s.ok()) s = ShareLogits(g, &logits);
    if (!s.ok()) {
      comm.Abort();
      return s;
    }
  }
}
}  // namespace

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

  PC_ASSIGN_OR_RETURN(World world, StartWorld(config_path, device_flag, n_ranks, parallel));
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
    Status s = FollowSteps(*g, **local, file.config);
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
