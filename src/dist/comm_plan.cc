#include "dist/comm_plan.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <tuple>

#include "runtime/log.h"
#include "runtime/plugin_loader.h"

namespace polychip::dist {
namespace {

using runtime::Communicator;

std::string Join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// "one host, host memory, probe score 10": what a candidate declared, for the log.
std::string Declared(const CommCandidate& c) {
  return std::string("'") + c.name + "': reach " + runtime::CommReachName(c.reach) + ", " +
         (c.device_plugin.empty() ? std::string("host memory") : c.device_plugin + " memory") +
         ", probe score " + std::to_string(c.score);
}

// The candidates, discovered on first use: a job whose groups are all pinned never looks.
class CandidatesOnce {
 public:
  explicit CandidatesOnce(const runtime::RuntimeConfig& config) : config_(config) {}
  const std::vector<CommCandidate>& Get() {
    if (!found_) found_ = DiscoverCommCandidates(config_);
    return *found_;
  }

 private:
  const runtime::RuntimeConfig& config_;
  std::optional<std::vector<CommCandidate>> found_;
};

GroupComm ChooseGroupComm(const std::string& group, std::vector<int32_t> ranks,
                          const Topology& topo, const runtime::RuntimeConfig& config,
                          const LaunchFlags& f, CandidatesOnce& candidates,
                          const std::string& backend) {
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
  } else {
    g.why = g.hosts.size() == 1
                ? "default: every rank on host " + g.hosts[0]
                : "default: ranks on " + std::to_string(g.hosts.size()) + " hosts, " +
                      (topo.mpirun ? "launched by mpirun" : "launched with --nnodes");
    std::optional<CommCandidate> best = DefaultComm(candidates.Get(), g.hosts.size(), backend);
    if (best) {
      g.spec = runtime::PluginSpec{best->name, "", {}};
      g.why += " (" + Declared(*best) + "; best of " + std::to_string(candidates.Get().size()) +
               " comm plugin(s) found)";
    } else {
      // Nothing fits: name what would, so that creating the group fails saying so.
      g.spec = runtime::PluginSpec{"<none>", "", {}};
      g.why += "; no comm plugin on the search path " +
               std::string(g.hosts.size() == 1 ? "can join it" : "crosses hosts") +
               " (polychip devices lists them)";
    }
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

// Whether a group's plugin can join ranks of several hosts, as it declares (pc_comm_iface_t.reach,
// ABI 1.3). A plugin that does not say, or does not load here, is taken to cross them: the
// framework cannot tell, and the group then fails at creation rather than by a warning.
struct Reach {
  bool crosses_hosts = true;
  std::string text;  // for the log: "one host (declared)", "crosses hosts (not declared: ...)"
};
Reach ReachOf(const runtime::PluginSpec& spec, const runtime::RuntimeConfig& config) {
  auto plugin = LoadPlugin(spec, config);
  if (plugin.ok() && (*plugin)->reach() != runtime::CommReach::kUnknown) {
    const runtime::CommReach reach = (*plugin)->reach();
    return {reach == runtime::CommReach::kCrossesHosts,
            std::string(runtime::CommReachName(reach)) + " (declared)"};
  }
  if (plugin.ok()) {
    return {true, "unknown (the ABI " + std::to_string((*plugin)->abi_major()) + "." +
                      std::to_string((*plugin)->abi_minor()) + " plugin does not declare it)"};
  }
  return {true, "unknown (not loadable here)"};
}

// Whether `g` uses the plugin the world was made with.
bool OnWorldPlugin(const GroupComm& g, const Communicator& world) {
  return g.spec.path.empty() && g.spec.name == world.plugin().name();
}

}  // namespace

std::vector<std::string> JobComms::Describe() const {
  std::vector<std::string> lines{DescribeGroup(world, 0)};
  for (size_t i = 0; i < tp.size(); ++i) lines.push_back(DescribeGroup(tp[i], int32_t(i)));
  for (size_t i = 0; i < pp.size(); ++i) lines.push_back(DescribeGroup(pp[i], int32_t(i)));
  return lines;
}

std::vector<GroupComm*> JobComms::All() {
  std::vector<GroupComm*> all{&world};
  for (GroupComm& g : tp) all.push_back(&g);
  for (GroupComm& g : pp) all.push_back(&g);
  return all;
}

std::vector<CommCandidate> DiscoverCommCandidates(const runtime::RuntimeConfig& config) {
  std::vector<runtime::PluginFile> files;
  for (const runtime::PluginFile& f :
       runtime::DiscoverPlugins(runtime::PluginSearchPath(config.extra_search_path))) {
    if (f.kind == runtime::PluginKind::kComm && !f.shadowed) files.push_back(f);
  }
  std::vector<runtime::LoadReport> skipped;
  std::vector<CommCandidate> out;
  for (const runtime::PluginFile& f : runtime::ProbedSafely(files, &skipped)) {
    const runtime::LoadReport r = runtime::DiagnosePlugin(f.path, runtime::PluginKind::kComm);
    if (!r.usable || r.probe_score == 0) continue;
    // A plugin without a probe is usable wherever it loads: the lowest positive score.
    out.push_back({r.name, std::max(1, r.probe_score), r.comm_reach, r.comm_device_plugin});
  }
  return out;
}

std::optional<CommCandidate> DefaultComm(const std::vector<CommCandidate>& candidates,
                                         size_t n_hosts, const std::string& backend) {
  std::optional<CommCandidate> best;
  // Lower ranks first: (confined to one host when the group is, score descending, name).
  auto rank = [&](const CommCandidate& c) {
    const bool local = n_hosts == 1 && c.reach == runtime::CommReach::kOneHost;
    return std::tuple(!local, -c.score, c.name);
  };
  for (const CommCandidate& c : candidates) {
    if (n_hosts > 1 && c.reach == runtime::CommReach::kOneHost) continue;
    if (!c.device_plugin.empty() && c.device_plugin != backend) continue;
    if (!best || rank(c) < rank(*best)) best = c;
  }
  return best;
}

JobComms ChooseJobComms(const Topology& topo, int32_t tp, int32_t pp,
                        const runtime::RuntimeConfig& config,
                        const LaunchFlags& flags) {
  JobComms j;
  CandidatesOnce candidates(config);
  const std::string backend = config.backend ? config.backend->name : "";
  auto choose = [&](const char* group, std::vector<int32_t> ranks) {
    return ChooseGroupComm(group, std::move(ranks), topo, config, flags, candidates, backend);
  };
  std::vector<int32_t> all(topo.rank_hosts.size());
  for (int32_t r = 0; r < int32_t(all.size()); ++r) all[r] = r;
  j.world = choose("world", all);
  for (int32_t s = 0; s < pp && tp > 1; ++s) {
    std::vector<int32_t> ranks;
    for (int32_t t = 0; t < tp; ++t) ranks.push_back(s * tp + t);
    j.tp.push_back(choose("tp", ranks));
  }
  for (int32_t t = 0; t < tp && pp > 1; ++t) {
    std::vector<int32_t> ranks;
    for (int32_t s = 0; s < pp; ++s) ranks.push_back(s * tp + t);
    j.pp.push_back(choose("pp", ranks));
  }
  return j;
}

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

StatusOr<std::shared_ptr<runtime::CommPlugin>> LoadSpec(const runtime::PluginSpec& spec,
                                                       const runtime::RuntimeConfig& config,
                                                       const std::string& why) {
  PC_ASSIGN_OR_RETURN(auto comm, LoadPlugin(spec, config));
  runtime::Log().info("comm plugin '{}' {} selected by {}", comm->name(), comm->version(), why);
  return comm;
}

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
StatusOr<std::shared_ptr<runtime::CommPlugin>> LoadComm(const std::string& config_path,
                                                         const std::string& device_flag) {
  PC_ASSIGN_OR_RETURN(runtime::RuntimeConfig config,
                      runtime::ResolveRuntimeConfig(config_path, device_flag));
  runtime::PluginSpec spec;
  std::string source = config.comm_source;
  if (config.comm) {
    spec = *config.comm;
  } else {
    const std::string backend = config.backend ? config.backend->name : "";
    std::optional<CommCandidate> best = DefaultComm(DiscoverCommCandidates(config), 1, backend);
    if (!best) {
      return NotFound("no comm plugin on the search path can join ranks of one host; "
                      "`polychip devices` lists the plugins found");
    }
    spec = runtime::PluginSpec{best->name, "", {}};
    source = "default (no comm configured): " + Declared(*best);
  }
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

}  // namespace polychip::dist
