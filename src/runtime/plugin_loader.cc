#include "runtime/plugin_loader.h"

#include <dlfcn.h>
#include "runtime/log.h"
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "runtime/abi_internal.h"

namespace polychip::runtime {
namespace fs = std::filesystem;

namespace {

// Serializes loading (dlopen + initialize) across threads; recursive because loading by name
// loads by path.
std::recursive_mutex& LoadMutex() {
  static std::recursive_mutex mu;
  return mu;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string CanonicalPath(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

std::string ExecutableDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return fs::path(buf).parent_path().string();
}

std::string AbiPair(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// libpolychip_backend_emu.so -> emu.
std::string NameFromFile(const std::string& path, PluginKind kind) {
  std::string base = fs::path(path).filename().string();
  std::string prefix = std::string("libpolychip_") + PluginKindName(kind) + "_";
  if (base.rfind(prefix, 0) == 0) base = base.substr(prefix.size());
  if (base.size() > 3 && base.compare(base.size() - 3, 3, ".so") == 0) {
    base = base.substr(0, base.size() - 3);
  }
  return base;
}

Status Fail(LoadReport* report, const char* stage, std::string reason) {
  report->usable = false;
  report->stage = stage;
  report->reason = std::move(reason);
  return FailedPrecondition(report->ToString());
}

// Runs the optional probe. Fails when the score is 0 (or negative).
Status RunProbe(void* probe_sym, LoadReport* report) {
  if (probe_sym == nullptr) return Status::Ok();
  pc_probe_result_t result{};
  result.struct_size = sizeof(result);
  reinterpret_cast<pc_backend_probe_fn>(probe_sym)(&result);
  result.reason[sizeof(result.reason) - 1] = '\0';
  report->probe_score = result.score;
  report->probe_reason = result.reason;
  if (result.score <= 0) {
    return Fail(report, "probe",
                "probe: unusable (score " + std::to_string(result.score) + "): " +
                    (result.reason[0] != '\0' ? result.reason : "no reason given"));
  }
  return Status::Ok();
}

// Checks struct_size covers the header, then the ABI major. Shared by backend and comm.
template <typename Table>
Status CheckHeader(const Table* table, const char* what) {
  if (table == nullptr) return FailedPrecondition(std::string(what) + " table is NULL");
  const size_t header = offsetof(Table, abi_minor) + sizeof(uint32_t);
  if (table->struct_size < header) {
    return FailedPrecondition("table struct_size " + std::to_string(table->struct_size) +
                              " is too small to hold the ABI version (" +
                              std::to_string(header) + " bytes)");
  }
  if (table->abi_major != PC_ABI_MAJOR) {
    return FailedPrecondition("ABI major version mismatch: plugin ABI " +
                              AbiPair(table->abi_major, table->abi_minor) + ", host ABI " +
                              AbiPair(PC_ABI_MAJOR, PC_ABI_MINOR));
  }
  return Status::Ok();
}

// "required member 'x' is NULL" for the first NULL member of a list.
struct Member {
  const char* name;
  const void* ptr;
};
Status CheckRequired(std::initializer_list<Member> members) {
  for (const Member& m : members) {
    if (m.ptr == nullptr) {
      return FailedPrecondition(std::string("required member '") + m.name + "' is NULL");
    }
  }
  return Status::Ok();
}

#define PC_MEMBER(t, m) Member{#m, reinterpret_cast<const void*>(t->m)}

}  // namespace

// ---- names and discovery -----------------------------------------------------------------

const char* PluginKindName(PluginKind kind) {
  return kind == PluginKind::kBackend ? "backend" : "comm";
}

std::string PluginFileName(PluginKind kind, std::string_view name) {
  return std::string("libpolychip_") + PluginKindName(kind) + "_" + std::string(name) + ".so";
}

std::vector<std::string> PluginSearchPath(const std::vector<std::string>& extra) {
  std::vector<std::string> dirs = extra;
  if (const char* env = std::getenv("POLYCHIP_PLUGIN_PATH")) {
    std::istringstream in(env);
    std::string dir;
    while (std::getline(in, dir, ':')) {
      if (!dir.empty()) dirs.push_back(dir);
    }
  }
  std::string exe_dir = ExecutableDir();
  if (!exe_dir.empty()) dirs.push_back(CanonicalPath(exe_dir + "/../lib/polychip"));
  // Drop duplicates, keeping the first occurrence (search order matters).
  std::vector<std::string> unique;
  std::set<std::string> seen;
  for (const auto& d : dirs) {
    if (seen.insert(CanonicalPath(d)).second) unique.push_back(d);
  }
  return unique;
}

std::vector<PluginFile> DiscoverPlugins(const std::vector<std::string>& dirs) {
  std::vector<PluginFile> files;
  std::set<std::pair<PluginKind, std::string>> seen;
  for (const auto& dir : dirs) {
    std::error_code ec;
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    for (const auto& base : names) {
      for (PluginKind kind : {PluginKind::kBackend, PluginKind::kComm}) {
        std::string prefix = std::string("libpolychip_") + PluginKindName(kind) + "_";
        if (base.rfind(prefix, 0) != 0 || base.size() <= prefix.size() + 3 ||
            base.compare(base.size() - 3, 3, ".so") != 0) {
          continue;
        }
        PluginFile f{kind, NameFromFile(base, kind), dir + "/" + base, false};
        f.shadowed = !seen.insert({kind, f.name}).second;
        files.push_back(f);
      }
    }
  }
  return files;
}

std::string LoadReport::ToString() const {
  if (usable) {
    return path + ": ok (" + name + " " + version + ", ABI " + AbiPair(abi_major, abi_minor) + ")";
  }
  return path + ": " + reason;
}

// ---- the library -------------------------------------------------------------------------

StatusOr<std::unique_ptr<PluginLibrary>> PluginLibrary::Open(const std::string& path,
                                                             LoadReport* report) {
  LoadReport local;
  if (report == nullptr) report = &local;
  report->path = path;
  if (!FileExists(path)) {
    report->stage = "not found";
    report->reason = "no such file";
    return NotFound(report->ToString());
  }
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    std::string reason = std::string("dlopen failed: ") + (err != nullptr ? err : "unknown error");
    report->missing_libraries = MissingLibraries(path);
    if (!report->missing_libraries.empty()) {
      reason += "; unresolved dependency: ";
      for (size_t i = 0; i < report->missing_libraries.size(); ++i) {
        reason += (i ? ", " : "") + report->missing_libraries[i];
      }
      reason += " not found (searched RPATH/RUNPATH, LD_LIBRARY_PATH, ld.so.conf dirs)";
    }
    return Fail(report, "dlopen", reason);
  }
  return std::unique_ptr<PluginLibrary>(new PluginLibrary(path, handle));
}

PluginLibrary::~PluginLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

void* PluginLibrary::Symbol(const char* name) const {
  dlerror();
  return dlsym(handle_, name);
}

// ---- validation --------------------------------------------------------------------------

Status ValidateBackendTable(const pc_backend_iface_t* t) {
  PC_RETURN_IF_ERROR(CheckHeader(t, "backend"));
  // Host ABI 1.0: every member up to op_launch exists; the counters are optional tail members.
  const size_t need = offsetof(pc_backend_iface_t, op_launch) + sizeof(t->op_launch);
  if (t->struct_size < need) {
    return FailedPrecondition("table struct_size " + std::to_string(t->struct_size) +
                              " is smaller than the " + std::to_string(need) +
                              " bytes ABI " + AbiPair(t->abi_major, t->abi_minor) + " requires");
  }
  PC_RETURN_IF_ERROR(CheckRequired({
      PC_MEMBER(t, name), PC_MEMBER(t, version), PC_MEMBER(t, error_code),
      PC_MEMBER(t, error_message), PC_MEMBER(t, error_destroy), PC_MEMBER(t, initialize),
      PC_MEMBER(t, shutdown), PC_MEMBER(t, device_count), PC_MEMBER(t, device_get_props),
      PC_MEMBER(t, device_open), PC_MEMBER(t, device_close), PC_MEMBER(t, mem_alloc),
      PC_MEMBER(t, mem_free), PC_MEMBER(t, mem_get_info), PC_MEMBER(t, memcpy_h2d),
      PC_MEMBER(t, memcpy_d2h), PC_MEMBER(t, memcpy_d2d), PC_MEMBER(t, memset),
      PC_MEMBER(t, stream_create), PC_MEMBER(t, stream_destroy),
      PC_MEMBER(t, stream_synchronize), PC_MEMBER(t, event_create), PC_MEMBER(t, event_destroy),
      PC_MEMBER(t, event_record), PC_MEMBER(t, stream_wait_event), PC_MEMBER(t, event_query),
      PC_MEMBER(t, event_synchronize), PC_MEMBER(t, op_supports), PC_MEMBER(t, op_launch),
  }));
  if (t->weight_upload != nullptr && t->weight_free == nullptr) {
    return FailedPrecondition("member 'weight_free' is NULL but 'weight_upload' is set");
  }
  if ((t->host_alloc == nullptr) != (t->host_free == nullptr)) {
    return FailedPrecondition("members 'host_alloc' and 'host_free' must be set together");
  }
  return Status::Ok();
}

Status ValidateCommTable(const pc_comm_iface_t* t) {
  PC_RETURN_IF_ERROR(CheckHeader(t, "comm"));
  const size_t need = offsetof(pc_comm_iface_t, barrier) + sizeof(t->barrier);
  if (t->struct_size < need) {
    return FailedPrecondition("table struct_size " + std::to_string(t->struct_size) +
                              " is smaller than the " + std::to_string(need) +
                              " bytes ABI " + AbiPair(t->abi_major, t->abi_minor) + " requires");
  }
  PC_RETURN_IF_ERROR(CheckRequired({
      PC_MEMBER(t, name), PC_MEMBER(t, version), PC_MEMBER(t, error_code),
      PC_MEMBER(t, error_message), PC_MEMBER(t, error_destroy), PC_MEMBER(t, initialize),
      PC_MEMBER(t, shutdown), PC_MEMBER(t, get_unique_id), PC_MEMBER(t, comm_init_rank),
      PC_MEMBER(t, comm_split), PC_MEMBER(t, comm_destroy), PC_MEMBER(t, comm_abort),
      PC_MEMBER(t, comm_rank), PC_MEMBER(t, comm_size), PC_MEMBER(t, all_reduce),
      PC_MEMBER(t, all_gather), PC_MEMBER(t, reduce_scatter), PC_MEMBER(t, broadcast),
      PC_MEMBER(t, send), PC_MEMBER(t, recv), PC_MEMBER(t, barrier),
  }));
  if (t->memory_kind == PC_COMM_MEMORY_DEVICE && t->device_plugin == nullptr) {
    return FailedPrecondition("memory_kind is DEVICE but 'device_plugin' is NULL");
  }
  if ((t->group_start == nullptr) != (t->group_end == nullptr)) {
    return FailedPrecondition("members 'group_start' and 'group_end' must be set together");
  }
  return Status::Ok();
}

// ---- raw loading -------------------------------------------------------------------------

namespace {

// dlopen + probe + get_api + validation, for either kind. *table_out is set whenever get_api
// returned a table (even an invalid one).
Status OpenRaw(const std::string& path, PluginKind kind, LoadReport* report,
               std::unique_ptr<PluginLibrary>* lib_out, void** get_api_out, void** probe_out,
               const void** table_out) {
  report->path = path;
  report->kind = kind;
  report->name = NameFromFile(path, kind);
  auto lib = PluginLibrary::Open(path, report);
  if (!lib.ok()) return lib.status();
  *lib_out = std::move(lib).value();
  const PluginLibrary& l = **lib_out;

  const bool backend = kind == PluginKind::kBackend;
  const char* get_api_sym = backend ? PC_BACKEND_GET_API_SYMBOL : PC_COMM_GET_API_SYMBOL;
  const char* probe_sym = backend ? PC_BACKEND_PROBE_SYMBOL : PC_COMM_PROBE_SYMBOL;
  void* get_api = l.Symbol(get_api_sym);
  if (get_api == nullptr) {
    return Fail(report, "symbol",
                std::string("missing symbol '") + get_api_sym + "': not a polychip " +
                    PluginKindName(kind) + " plugin, or the symbol is not exported (PC_EXPORT)");
  }
  *get_api_out = get_api;
  *probe_out = l.Symbol(probe_sym);
  PC_RETURN_IF_ERROR(RunProbe(*probe_out, report));

  const void* table;
  if (backend) {
    table = reinterpret_cast<pc_backend_get_api_fn>(get_api)(PC_ABI_MAJOR, PC_ABI_MINOR,
                                                             HostServices());
  } else {
    table = reinterpret_cast<pc_comm_get_api_fn>(get_api)(PC_ABI_MAJOR, PC_ABI_MINOR,
                                                          HostServices());
  }
  *table_out = table;
  if (table == nullptr) {
    return Fail(report, "get_api",
                std::string(get_api_sym) + " returned NULL for host ABI " +
                    AbiPair(PC_ABI_MAJOR, PC_ABI_MINOR) +
                    " (the plugin does not support this host version)");
  }
  Status valid;
  if (backend) {
    auto* t = static_cast<const pc_backend_iface_t*>(table);
    if (t->struct_size >= offsetof(pc_backend_iface_t, abi_minor) + sizeof(uint32_t)) {
      report->abi_major = t->abi_major;
      report->abi_minor = t->abi_minor;
    }
    valid = ValidateBackendTable(t);
    if (valid.ok()) {
      report->name = t->name;
      report->version = t->version;
    }
  } else {
    auto* t = static_cast<const pc_comm_iface_t*>(table);
    if (t->struct_size >= offsetof(pc_comm_iface_t, abi_minor) + sizeof(uint32_t)) {
      report->abi_major = t->abi_major;
      report->abi_minor = t->abi_minor;
    }
    valid = ValidateCommTable(t);
    if (valid.ok()) {
      report->name = t->name;
      report->version = t->version;
    }
  }
  if (!valid.ok()) {
    const bool abi = valid.message().find("ABI major") != std::string::npos;
    return Fail(report, abi ? "abi" : "validate", valid.message());
  }
  report->usable = true;
  report->stage.clear();
  report->reason.clear();
  return Status::Ok();
}

std::string ParamsText(const PluginParams& params) {
  std::string s;
  for (const auto& [k, v] : params) s += (s.empty() ? "" : ", ") + k + "=" + v;
  return s;
}

Status TakeInitError(const pc_backend_iface_t* t, pc_error_t* e) {
  return TakeError(t, e, "initialize");
}
Status TakeInitError(const pc_comm_iface_t* t, pc_error_t* e) {
  return TakeCommError(t, e, "initialize");
}

// initialize(params) of a validated table; wraps it into the C++ object (Backend or CommPlugin)
// that owns the library and calls shutdown when released.
template <typename Plugin, typename Impl, typename Table>
StatusOr<std::shared_ptr<Plugin>> MakePlugin(const char* kind, std::unique_ptr<PluginLibrary> lib,
                                             const Table* table, const std::string& path,
                                             const PluginParams& params, LoadReport* report) {
  std::vector<pc_param_t> c_params;
  for (const auto& [k, v] : params) c_params.push_back({k.c_str(), v.c_str()});
  Status init = TakeInitError(table, table->initialize(c_params.data(), c_params.size()));
  if (!init.ok()) return Fail(report, "initialize", init.ToString());
  auto impl = std::make_unique<Impl>();
  impl->library = std::move(lib);
  impl->table = table;
  impl->name = table->name;
  impl->path = path;
  impl->version = table->version;
  impl->initialized = true;
  Log().info("loaded {} '{}' {} (ABI {}) from {}{}", kind, impl->name, impl->version,
             AbiPair(table->abi_major, table->abi_minor), path,
             params.empty() ? "" : " with " + ParamsText(params));
  return std::make_shared<Plugin>(std::move(impl));
}

StatusOr<std::shared_ptr<Backend>> MakeBackend(std::unique_ptr<PluginLibrary> lib,
                                               const pc_backend_iface_t* table,
                                               const std::string& path,
                                               const PluginParams& params, LoadReport* report) {
  return MakePlugin<Backend, BackendImpl>("backend", std::move(lib), table, path, params, report);
}

StatusOr<std::shared_ptr<CommPlugin>> MakeComm(std::unique_ptr<PluginLibrary> lib,
                                               const pc_comm_iface_t* table,
                                               const std::string& path,
                                               const PluginParams& params, LoadReport* report) {
  return MakePlugin<CommPlugin, CommImpl>("comm", std::move(lib), table, path, params, report);
}

}  // namespace

Status OpenRawBackend(const std::string& path, RawBackend* out, LoadReport* report) {
  LoadReport local;
  if (report == nullptr) report = &local;
  void* get_api = nullptr;
  void* probe = nullptr;
  const void* table = nullptr;
  Status s = OpenRaw(path, PluginKind::kBackend, report, &out->library, &get_api, &probe, &table);
  out->get_api = reinterpret_cast<pc_backend_get_api_fn>(get_api);
  out->probe = reinterpret_cast<pc_backend_probe_fn>(probe);
  out->table = static_cast<const pc_backend_iface_t*>(table);
  return s;
}

Status OpenRawComm(const std::string& path, RawComm* out, LoadReport* report) {
  LoadReport local;
  if (report == nullptr) report = &local;
  void* get_api = nullptr;
  void* probe = nullptr;
  const void* table = nullptr;
  Status s = OpenRaw(path, PluginKind::kComm, report, &out->library, &get_api, &probe, &table);
  out->probe = reinterpret_cast<pc_comm_probe_fn>(probe);
  out->table = static_cast<const pc_comm_iface_t*>(table);
  return s;
}

LoadReport DiagnosePlugin(const std::string& path, PluginKind kind) {
  LoadReport report;
  report.path = path;
  report.kind = kind;
  const std::string canon = CanonicalPath(path);
  {  // Already loaded: report the live object rather than touching it again.
    PluginRegistry& reg = PluginRegistry::Global();
    std::lock_guard<std::mutex> lock(reg.mu_);
    if (kind == PluginKind::kBackend && reg.backends_by_path_.count(canon)) {
      const auto& b = reg.backends_by_path_[canon];
      report.usable = true;
      report.name = b->name();
      report.version = b->version();
      report.abi_major = b->abi_major();
      report.abi_minor = b->abi_minor();
      return report;
    }
    if (kind == PluginKind::kComm && reg.comms_by_path_.count(canon)) {
      const auto& c = reg.comms_by_path_[canon];
      report.usable = true;
      report.name = c->name();
      report.version = c->version();
      report.abi_major = c->abi_major();
      report.abi_minor = c->abi_minor();
      return report;
    }
  }
  std::unique_ptr<PluginLibrary> lib;
  void* get_api = nullptr;
  void* probe = nullptr;
  const void* table = nullptr;
  (void)OpenRaw(path, kind, &report, &lib, &get_api, &probe, &table);
  return report;
}

// ---- loading -----------------------------------------------------------------------------

StatusOr<std::shared_ptr<Backend>> LoadBackendFromPath(const std::string& path,
                                                       const PluginParams& params,
                                                       LoadReport* report) {
  std::lock_guard<std::recursive_mutex> load_lock(LoadMutex());
  LoadReport local;
  if (report == nullptr) report = &local;
  PluginRegistry& reg = PluginRegistry::Global();
  const std::string canon = CanonicalPath(path);
  {
    std::lock_guard<std::mutex> lock(reg.mu_);
    auto it = reg.backends_by_path_.find(canon);
    if (it != reg.backends_by_path_.end()) {
      *report = LoadReport{path, PluginKind::kBackend, it->second->name(), true};
      report->version = it->second->version();
      report->abi_major = it->second->abi_major();
      report->abi_minor = it->second->abi_minor();
      return it->second;
    }
  }
  RawBackend raw;
  PC_RETURN_IF_ERROR(OpenRawBackend(path, &raw, report));
  if (auto existing = reg.FindBackend(raw.table->name)) {
    return Fail(report, "validate",
                std::string("a backend named '") + raw.table->name + "' is already loaded from " +
                    existing->path());
  }
  PC_ASSIGN_OR_RETURN(auto backend,
                      MakeBackend(std::move(raw.library), raw.table, path, params, report));
  std::lock_guard<std::mutex> lock(reg.mu_);
  reg.backends_[backend->name()] = backend;
  reg.backends_by_path_[canon] = backend;
  return backend;
}

StatusOr<std::shared_ptr<CommPlugin>> LoadCommFromPath(const std::string& path,
                                                       const PluginParams& params,
                                                       LoadReport* report) {
  std::lock_guard<std::recursive_mutex> load_lock(LoadMutex());
  LoadReport local;
  if (report == nullptr) report = &local;
  PluginRegistry& reg = PluginRegistry::Global();
  const std::string canon = CanonicalPath(path);
  {
    std::lock_guard<std::mutex> lock(reg.mu_);
    auto it = reg.comms_by_path_.find(canon);
    if (it != reg.comms_by_path_.end()) {
      *report = LoadReport{path, PluginKind::kComm, it->second->name(), true};
      report->version = it->second->version();
      return it->second;
    }
  }
  std::unique_ptr<PluginLibrary> lib;
  void* get_api = nullptr;
  void* probe = nullptr;
  const void* table = nullptr;
  PC_RETURN_IF_ERROR(OpenRaw(path, PluginKind::kComm, report, &lib, &get_api, &probe, &table));
  auto* t = static_cast<const pc_comm_iface_t*>(table);
  if (auto existing = reg.FindComm(t->name)) {
    return Fail(report, "validate",
                std::string("a comm plugin named '") + t->name + "' is already loaded from " +
                    existing->path());
  }
  PC_ASSIGN_OR_RETURN(auto comm, MakeComm(std::move(lib), t, path, params, report));
  std::lock_guard<std::mutex> lock(reg.mu_);
  reg.comms_[comm->name()] = comm;
  reg.comms_by_path_[canon] = comm;
  return comm;
}

// ---- registry ----------------------------------------------------------------------------

PluginRegistry& PluginRegistry::Global() {
  static PluginRegistry* registry = new PluginRegistry();  // plugins outlive static dtors
  return *registry;
}

namespace {

// Tries `name` in each directory; the error lists every path tried.
template <typename T, typename LoadFn>
StatusOr<std::shared_ptr<T>> LoadByName(PluginKind kind, const std::string& name,
                                        const std::vector<std::string>& search_path,
                                        const PluginParams& params,
                                        std::vector<LoadReport>* reports, LoadFn load) {
  std::vector<LoadReport> local;
  if (reports == nullptr) reports = &local;
  bool any_file = false;
  for (const auto& dir : search_path) {
    LoadReport report;
    report.kind = kind;
    report.name = name;
    const std::string path = dir + "/" + PluginFileName(kind, name);
    StatusOr<std::shared_ptr<T>> loaded = load(path, params, &report);
    report.path = path;
    reports->push_back(report);
    if (loaded.ok()) return loaded;
    if (report.stage != "not found") {
      any_file = true;
      Log().warn("{} '{}': {}", PluginKindName(kind), name, report.ToString());
    }
  }
  std::string msg = std::string(PluginKindName(kind)) + " '" + name + "' " +
                    (any_file ? "cannot be loaded" : "not found") + "; paths tried:";
  if (search_path.empty()) msg += " none (the search path is empty: set POLYCHIP_PLUGIN_PATH)";
  for (const auto& r : *reports) msg += "\n  " + r.ToString();
  if (!any_file) {
    // Say what to do next: which names do exist, and how to add a folder.
    std::string available;
    for (const PluginFile& f : DiscoverPlugins(search_path)) {
      if (f.kind == kind && !f.shadowed) available += (available.empty() ? "" : ", ") + f.name;
    }
    msg += "\navailable " + std::string(PluginKindName(kind)) + " plugins: " +
           (available.empty() ? "none" : available) +
           "; add a folder with POLYCHIP_PLUGIN_PATH, or run `polychip doctor`";
  }
  return any_file ? FailedPrecondition(msg) : NotFound(msg);
}

}  // namespace

StatusOr<std::shared_ptr<Backend>> PluginRegistry::LoadBackend(
    const std::string& name, const std::vector<std::string>& search_path,
    const PluginParams& params, std::vector<LoadReport>* reports) {
  if (auto b = FindBackend(name)) return b;
  return LoadByName<Backend>(PluginKind::kBackend, name, search_path, params, reports,
                             &LoadBackendFromPath);
}

StatusOr<std::shared_ptr<CommPlugin>> PluginRegistry::LoadComm(
    const std::string& name, const std::vector<std::string>& search_path,
    const PluginParams& params, std::vector<LoadReport>* reports) {
  if (auto c = FindComm(name)) return c;
  return LoadByName<CommPlugin>(PluginKind::kComm, name, search_path, params, reports,
                                &LoadCommFromPath);
}

StatusOr<std::shared_ptr<Backend>> PluginRegistry::RegisterBackendTable(
    const pc_backend_iface* table, const PluginParams& params, const std::string& source) {
  std::lock_guard<std::recursive_mutex> load_lock(LoadMutex());
  const std::string path = source.empty() ? "<registered from code>" : source;
  LoadReport report;
  report.path = path;
  Status valid = ValidateBackendTable(table);
  if (!valid.ok()) return FailedPrecondition(path + ": " + valid.message());
  if (auto existing = FindBackend(table->name)) {
    return FailedPrecondition(path + ": a backend named '" + table->name +
                              "' is already loaded from " + existing->path());
  }
  PC_ASSIGN_OR_RETURN(auto backend, MakeBackend(nullptr, table, path, params, &report));
  std::lock_guard<std::mutex> lock(mu_);
  backends_[backend->name()] = backend;
  return backend;
}

StatusOr<std::shared_ptr<Backend>> PluginRegistry::RegisterBackendPath(
    const std::string& path, const PluginParams& params) {
  return LoadBackendFromPath(path, params);
}

StatusOr<std::shared_ptr<CommPlugin>> PluginRegistry::RegisterCommTable(
    const pc_comm_iface* table, const PluginParams& params, const std::string& source) {
  std::lock_guard<std::recursive_mutex> load_lock(LoadMutex());
  const std::string path = source.empty() ? "<registered from code>" : source;
  LoadReport report;
  report.path = path;
  Status valid = ValidateCommTable(table);
  if (!valid.ok()) return FailedPrecondition(path + ": " + valid.message());
  if (auto existing = FindComm(table->name)) {
    return FailedPrecondition(path + ": a comm plugin named '" + table->name +
                              "' is already loaded from " + existing->path());
  }
  PC_ASSIGN_OR_RETURN(auto comm, MakeComm(nullptr, table, path, params, &report));
  std::lock_guard<std::mutex> lock(mu_);
  comms_[comm->name()] = comm;
  return comm;
}

std::shared_ptr<Backend> PluginRegistry::FindBackend(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = backends_.find(name);
  return it == backends_.end() ? nullptr : it->second;
}

std::shared_ptr<CommPlugin> PluginRegistry::FindComm(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(name);
  return it == comms_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Backend>> PluginRegistry::Backends() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Backend>> out;
  for (const auto& [name, b] : backends_) out.push_back(b);
  return out;
}

std::vector<std::shared_ptr<CommPlugin>> PluginRegistry::Comms() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<CommPlugin>> out;
  for (const auto& [name, c] : comms_) out.push_back(c);
  return out;
}

void PluginRegistry::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  backends_.clear();
  comms_.clear();
  backends_by_path_.clear();
  comms_by_path_.clear();
}

// ---- selection ---------------------------------------------------------------------------

StatusOr<Selection> SelectPlugins(const RuntimeConfig& config, bool load_all_if_unset) {
  Selection sel;
  const std::vector<std::string> search = PluginSearchPath(config.extra_search_path);
  PluginRegistry& reg = PluginRegistry::Global();
  const std::string source =
      config.backend_source.empty() ? std::string("code") : config.backend_source;
  if (config.backend) {
    const PluginSpec& spec = *config.backend;
    if (!spec.path.empty()) {
      LoadReport report;
      auto b = LoadBackendFromPath(spec.path, spec.params, &report);
      sel.reports.push_back(report);
      if (!b.ok()) {
        return Status(b.status().code(), "backend " +
                                             (spec.name.empty() ? "" : "'" + spec.name + "' ") +
                                             "(selected by " + source +
                                             ") cannot be loaded; path tried:\n  " +
                                             report.ToString());
      }
      if (!spec.name.empty() && (*b)->name() != spec.name) {
        return FailedPrecondition(spec.path + " is backend '" + (*b)->name() + "', but '" +
                                  spec.name + "' was asked for (selected by " + source + ")");
      }
      sel.backend = *b;
    } else {
      auto b = reg.LoadBackend(spec.name, search, spec.params, &sel.reports);
      if (!b.ok()) {
        return Status(b.status().code(), b.status().message() + "\n(selected by " + source + ")");
      }
      sel.backend = *b;
    }
    Log().info("backend '{}' selected by {}", sel.backend->name(), source);
  } else if (load_all_if_unset) {
    int best_score = INT32_MIN;
    for (const PluginFile& f : DiscoverPlugins(search)) {
      if (f.kind != PluginKind::kBackend || f.shadowed) continue;
      LoadReport report;
      auto b = LoadBackendFromPath(f.path, {}, &report);
      sel.reports.push_back(report);
      if (!b.ok()) {
        Log().warn("skipping {}", report.ToString());
        continue;
      }
      // A plugin without a probe ranks as score 1.
      int score = report.probe_score < 0 ? 1 : report.probe_score;
      if (score > best_score) {
        best_score = score;
        sel.backend = *b;
      }
    }
  }
  if (config.comm) {
    const PluginSpec& spec = *config.comm;
    if (!spec.path.empty()) {
      LoadReport report;
      auto c = LoadCommFromPath(spec.path, spec.params, &report);
      sel.reports.push_back(report);
      if (!c.ok()) {
        return Status(c.status().code(),
                      "comm plugin cannot be loaded; path tried:\n  " + report.ToString());
      }
      sel.comm = *c;
    } else {
      PC_ASSIGN_OR_RETURN(sel.comm, reg.LoadComm(spec.name, search, spec.params, &sel.reports));
    }
  }
  return sel;
}

}  // namespace polychip::runtime
