#include "runtime/plugin_loader.h"

#include <dlfcn.h>
#include "runtime/log.h"
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <type_traits>

#include "runtime/abi_internal.h"
#include "runtime/isolated_diagnosis.h"

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

// Checks struct_size covers the header, then the ABI major.
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

namespace {

// "the file" or "its folder" when either may be written by users other than its owner and
// group (a folder with the sticky bit, such as /tmp, still lets anyone add a plugin), else null.
const char* WritableByOthers(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IWOTH) != 0) return "the file";
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (::stat(dir.empty() ? "." : dir.c_str(), &st) == 0 && (st.st_mode & S_IWOTH) != 0) {
    return "its folder";
  }
  return nullptr;
}

}  // namespace

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
  // Loading a plugin runs its code in this process: one that anybody could have written or
  // replaced is refused unless the operator says otherwise.
  if (const char* why = WritableByOthers(path)) {
    const char* allow = std::getenv("POLYCHIP_ALLOW_INSECURE_PLUGINS");
    if (allow == nullptr || std::string(allow) != "1") {
      return Fail(report, "permissions",
                  std::string(why) + " is writable by others; fix its mode, or set "
                                     "POLYCHIP_ALLOW_INSECURE_PLUGINS=1 to load it anyway");
    }
    Log().warn("{}: {} is writable by others, loaded as POLYCHIP_ALLOW_INSECURE_PLUGINS=1 "
               "allows", path, why);
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
  // mem_get_info, memset and event_query are optional since 1.5 (Kunlun's XRE has none of
  // them): the framework then sizes memory from total_memory, fills by copies and waits.
  const size_t need = offsetof(pc_backend_iface_t, op_launch) + sizeof(t->op_launch);
  if (t->struct_size < need) {
    return FailedPrecondition("table struct_size " + std::to_string(t->struct_size) +
                              " is smaller than the " + std::to_string(need) +
                              " bytes ABI " + AbiPair(t->abi_major, t->abi_minor) + " requires");
  }
  PC_RETURN_IF_ERROR(CheckRequired({
      PC_MEMBER(t, name),
      PC_MEMBER(t, version),
      PC_MEMBER(t, error_code),
      PC_MEMBER(t, error_message),
      PC_MEMBER(t, error_destroy),
      PC_MEMBER(t, initialize),
      PC_MEMBER(t, shutdown),
      PC_MEMBER(t, device_count),
      PC_MEMBER(t, device_get_props),
      PC_MEMBER(t, device_open),
      PC_MEMBER(t, device_close),
      PC_MEMBER(t, mem_alloc),
      PC_MEMBER(t, mem_free),
      PC_MEMBER(t, memcpy_h2d),
      PC_MEMBER(t, memcpy_d2h),
      PC_MEMBER(t, memcpy_d2d),
      PC_MEMBER(t, stream_create),
      PC_MEMBER(t, stream_destroy),
      PC_MEMBER(t, stream_synchronize),
      PC_MEMBER(t, event_create),
      PC_MEMBER(t, event_destroy),
      PC_MEMBER(t, event_record),
      PC_MEMBER(t, stream_wait_event),
      PC_MEMBER(t, event_synchronize),
      PC_MEMBER(t, op_supports),
      PC_MEMBER(t, op_launch),
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

// ---- the two plugin kinds ----------------------------------------------------------------

// What differs between a backend and a comm plugin; the loading, registration and lookup below
// are written once over it.
template <>
struct PluginTraits<Backend> {
  using Table = pc_backend_iface_t;
  using Impl = BackendImpl;
  using GetApiFn = pc_backend_get_api_fn;
  using ProbeFn = pc_backend_probe_fn;
  static constexpr PluginKind kKind = PluginKind::kBackend;
  static constexpr const char* kGetApiSymbol = PC_BACKEND_GET_API_SYMBOL;
  static constexpr const char* kProbeSymbol = PC_BACKEND_PROBE_SYMBOL;
  static constexpr const char* kOneOf = "a backend";  // "a backend named 'x' is already loaded"
  static Status Validate(const Table* t) { return ValidateBackendTable(t); }
  static void Declare(const Table*, LoadReport*) {}
  static Status TakeInitError(const Table* t, pc_error_t* e) {
    return TakeError(t, e, "initialize");
  }
};

template <>
struct PluginTraits<CommPlugin> {
  using Table = pc_comm_iface_t;
  using Impl = CommImpl;
  using GetApiFn = pc_comm_get_api_fn;
  using ProbeFn = pc_comm_probe_fn;
  static constexpr PluginKind kKind = PluginKind::kComm;
  static constexpr const char* kGetApiSymbol = PC_COMM_GET_API_SYMBOL;
  static constexpr const char* kProbeSymbol = PC_COMM_PROBE_SYMBOL;
  static constexpr const char* kOneOf = "a comm plugin";
  static Status Validate(const Table* t) { return ValidateCommTable(t); }
  static void Declare(const Table* t, LoadReport* report) {
    report->comm_reach = ReachOfTable(t);
    if (t->memory_kind == PC_COMM_MEMORY_DEVICE && t->device_plugin != nullptr) {
      report->comm_device_plugin = t->device_plugin;
    }
  }
  static Status TakeInitError(const Table* t, pc_error_t* e) {
    return TakeCommError(t, e, "initialize");
  }
};

// ---- raw loading -------------------------------------------------------------------------

namespace {

// A plugin file opened and its table obtained, before initialize.
template <typename Plugin>
struct RawPlugin {
  using Traits = PluginTraits<Plugin>;
  std::unique_ptr<PluginLibrary> library;
  typename Traits::GetApiFn get_api = nullptr;
  typename Traits::ProbeFn probe = nullptr;      // may be null
  const typename Traits::Table* table = nullptr;  // set whenever get_api returned one, even invalid
};

// dlopen + probe + get_api + validation.
template <typename Plugin>
Status OpenRaw(const std::string& path, LoadReport* report, RawPlugin<Plugin>* out) {
  using Traits = PluginTraits<Plugin>;
  using Table = typename Traits::Table;
  report->path = path;
  report->kind = Traits::kKind;
  report->name = NameFromFile(path, Traits::kKind);
  auto lib = PluginLibrary::Open(path, report);
  if (!lib.ok()) return lib.status();
  out->library = std::move(lib).value();
  const PluginLibrary& l = *out->library;

  void* get_api = l.Symbol(Traits::kGetApiSymbol);
  if (get_api == nullptr) {
    return Fail(report, "symbol",
                std::string("missing symbol '") + Traits::kGetApiSymbol + "': not a polychip " +
                    PluginKindName(Traits::kKind) +
                    " plugin, or the symbol is not exported (PC_EXPORT)");
  }
  out->get_api = reinterpret_cast<typename Traits::GetApiFn>(get_api);
  void* probe = l.Symbol(Traits::kProbeSymbol);
  out->probe = reinterpret_cast<typename Traits::ProbeFn>(probe);
  PC_RETURN_IF_ERROR(RunProbe(probe, report));

  const Table* t = out->get_api(PC_ABI_MAJOR, PC_ABI_MINOR, HostServices());
  out->table = t;
  if (t == nullptr) {
    return Fail(report, "get_api",
                std::string(Traits::kGetApiSymbol) + " returned NULL for host ABI " +
                    AbiPair(PC_ABI_MAJOR, PC_ABI_MINOR) +
                    " (the plugin does not support this host version)");
  }
  if (t->struct_size >= offsetof(Table, abi_minor) + sizeof(uint32_t)) {
    report->abi_major = t->abi_major;
    report->abi_minor = t->abi_minor;
  }
  const Status valid = Traits::Validate(t);
  if (!valid.ok()) {
    const bool abi = valid.message().find("ABI major") != std::string::npos;
    return Fail(report, abi ? "abi" : "validate", valid.message());
  }
  report->name = t->name;
  report->version = t->version;
  Traits::Declare(t, report);
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

// initialize(params) of a validated table; wraps it into the C++ object (Backend or CommPlugin)
// that owns the library and calls shutdown when released.
template <typename Plugin>
StatusOr<std::shared_ptr<Plugin>> MakePlugin(std::unique_ptr<PluginLibrary> lib,
                                             const typename PluginTraits<Plugin>::Table* table,
                                             const std::string& path, const PluginParams& params,
                                             LoadReport* report) {
  using Traits = PluginTraits<Plugin>;
  std::vector<pc_param_t> c_params;
  for (const auto& [k, v] : params) c_params.push_back({k.c_str(), v.c_str()});
  Status init = Traits::TakeInitError(table, table->initialize(c_params.data(), c_params.size()));
  if (!init.ok()) return Fail(report, "initialize", init.ToString());
  auto impl = std::make_unique<typename Traits::Impl>();
  impl->library = std::move(lib);
  impl->table = table;
  impl->name = table->name;
  impl->path = path;
  impl->version = table->version;
  impl->initialized = true;
  std::string generation;
  if constexpr (std::is_same_v<Plugin, Backend>) {
    static std::atomic<uint64_t> loads{0};
    impl->generation = ++loads;
    generation = ", generation " + std::to_string(impl->generation);
  }
  Log().info("loaded {} '{}' {} (ABI {}{}) from {}{}", PluginKindName(Traits::kKind), impl->name,
             impl->version, AbiPair(table->abi_major, table->abi_minor), generation, path,
             params.empty() ? "" : " with " + ParamsText(params));
  return std::make_shared<Plugin>(std::move(impl));
}

// The report of a plugin that is already loaded: the live object, not the file.
template <typename Plugin>
LoadReport ReportOfLoaded(const std::string& path, const Plugin& plugin) {
  LoadReport report{path, PluginTraits<Plugin>::kKind, plugin.name(), true};
  report.version = plugin.version();
  report.abi_major = plugin.abi_major();
  report.abi_minor = plugin.abi_minor();
  // The probe again (its answer may change, e.g. under mpirun) and the table's declarations.
  const auto& impl = plugin.impl();
  if (impl.library != nullptr) {
    (void)RunProbe(impl.library->Symbol(PluginTraits<Plugin>::kProbeSymbol), &report);
  }
  PluginTraits<Plugin>::Declare(impl.table, &report);
  report.usable = true;  // loaded and initialized, whatever the probe says now
  report.stage.clear();
  report.reason.clear();
  return report;
}

}  // namespace

Status OpenRawBackend(const std::string& path, RawBackend* out, LoadReport* report) {
  LoadReport local;
  RawPlugin<Backend> raw;
  Status s = OpenRaw(path, report != nullptr ? report : &local, &raw);
  out->library = std::move(raw.library);
  out->get_api = raw.get_api;
  out->probe = raw.probe;
  out->table = raw.table;
  return s;
}

Status OpenRawComm(const std::string& path, RawComm* out, LoadReport* report) {
  LoadReport local;
  RawPlugin<CommPlugin> raw;
  Status s = OpenRaw(path, report != nullptr ? report : &local, &raw);
  out->library = std::move(raw.library);
  out->probe = raw.probe;
  out->table = raw.table;
  return s;
}

// ---- the registry, over either kind ------------------------------------------------------

template <typename Plugin>
PluginRegistry::Shelf<Plugin>& PluginRegistry::ShelfOf() {
  if constexpr (std::is_same_v<Plugin, Backend>) {
    return backends_;
  } else {
    return comms_;
  }
}

template <typename Plugin>
const PluginRegistry::Shelf<Plugin>& PluginRegistry::ShelfOf() const {
  if constexpr (std::is_same_v<Plugin, Backend>) {
    return backends_;
  } else {
    return comms_;
  }
}

template <typename Plugin>
std::optional<LoadReport> PluginRegistry::ReportIfLoadedFrom(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& by_path = ShelfOf<Plugin>().by_path;
  auto it = by_path.find(CanonicalPath(path));
  if (it == by_path.end()) return std::nullopt;
  return ReportOfLoaded(path, *it->second);
}

template <typename Plugin>
StatusOr<std::shared_ptr<Plugin>> PluginRegistry::LoadFromPath(const std::string& path,
                                                                const PluginParams& params,
                                                                LoadReport* report) {
  std::lock_guard<std::recursive_mutex> load_lock(LoadMutex());
  LoadReport local;
  if (report == nullptr) report = &local;
  const std::string canon = CanonicalPath(path);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& by_path = ShelfOf<Plugin>().by_path;
    if (auto it = by_path.find(canon); it != by_path.end()) {
      *report = ReportOfLoaded(path, *it->second);
      return it->second;
    }
  }
  RawPlugin<Plugin> raw;
  PC_RETURN_IF_ERROR(OpenRaw(path, report, &raw));
  if (auto existing = Find<Plugin>(raw.table->name)) {
    return Fail(report, "validate",
                std::string(PluginTraits<Plugin>::kOneOf) + " named '" + raw.table->name +
                    "' is already loaded from " + existing->path());
  }
  PC_ASSIGN_OR_RETURN(auto plugin,
                      MakePlugin<Plugin>(std::move(raw.library), raw.table, path, params, report));
  std::lock_guard<std::mutex> lock(mu_);
  ShelfOf<Plugin>().by_name[plugin->name()] = plugin;
  ShelfOf<Plugin>().by_path[canon] = plugin;
  return plugin;
}

template <typename Plugin>
StatusOr<std::shared_ptr<Plugin>> PluginRegistry::RegisterTable(
    const typename PluginTraits<Plugin>::Table* table, const PluginParams& params,
    const std::string& source) {
  std::lock_guard<std::recursive_mutex> load_lock(LoadMutex());
  const std::string path = source.empty() ? "<registered from code>" : source;
  LoadReport report;
  report.path = path;
  Status valid = PluginTraits<Plugin>::Validate(table);
  if (!valid.ok()) return FailedPrecondition(path + ": " + valid.message());
  if (auto existing = Find<Plugin>(table->name)) {
    return FailedPrecondition(path + ": " + PluginTraits<Plugin>::kOneOf + " named '" +
                              table->name + "' is already loaded from " + existing->path());
  }
  PC_ASSIGN_OR_RETURN(auto plugin, MakePlugin<Plugin>(nullptr, table, path, params, &report));
  std::lock_guard<std::mutex> lock(mu_);
  ShelfOf<Plugin>().by_name[plugin->name()] = plugin;
  return plugin;
}

template <typename Plugin>
std::shared_ptr<Plugin> PluginRegistry::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& by_name = ShelfOf<Plugin>().by_name;
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

template <typename Plugin>
std::vector<std::shared_ptr<Plugin>> PluginRegistry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Plugin>> out;
  for (const auto& [name, p] : ShelfOf<Plugin>().by_name) {
    out.push_back(p);
  }
  return out;
}

LoadReport DiagnosePlugin(const std::string& path, PluginKind kind) {
  PluginRegistry& reg = PluginRegistry::Global();
  // Already loaded: report the live object rather than touching it again.
  std::optional<LoadReport> loaded = kind == PluginKind::kBackend
                                         ? reg.ReportIfLoadedFrom<Backend>(path)
                                         : reg.ReportIfLoadedFrom<CommPlugin>(path);
  if (loaded) return *loaded;
  LoadReport report;
  report.path = path;
  report.kind = kind;
  if (kind == PluginKind::kBackend) {
    RawPlugin<Backend> raw;
    (void)OpenRaw(path, &report, &raw);
  } else {
    RawPlugin<CommPlugin> raw;
    (void)OpenRaw(path, &report, &raw);
  }
  return report;
}

// ---- loading -----------------------------------------------------------------------------

StatusOr<std::shared_ptr<Backend>> LoadBackendFromPath(const std::string& path,
                                                       const PluginParams& params,
                                                       LoadReport* report) {
  return PluginRegistry::Global().LoadFromPath<Backend>(path, params, report);
}

StatusOr<std::shared_ptr<CommPlugin>> LoadCommFromPath(const std::string& path,
                                                       const PluginParams& params,
                                                       LoadReport* report) {
  return PluginRegistry::Global().LoadFromPath<CommPlugin>(path, params, report);
}

// ---- registry ----------------------------------------------------------------------------

PluginRegistry& PluginRegistry::Global() {
  static PluginRegistry* registry = new PluginRegistry();  // plugins outlive static dtors
  return *registry;
}

namespace {

// A plugin found before the one installed beside the binary replaces it: say so, since a
// folder on POLYCHIP_PLUGIN_PATH can change what `--device cpu` runs.
void WarnIfShadowing(PluginKind kind, const std::string& name, const std::string& dir) {
  const std::string exe_dir = ExecutableDir();
  if (exe_dir.empty()) return;
  const std::string builtin = CanonicalPath(exe_dir + "/../lib/polychip");
  if (CanonicalPath(dir) == builtin) return;
  const std::string shadowed = builtin + "/" + PluginFileName(kind, name);
  if (!FileExists(shadowed)) return;
  Log().warn("{} '{}' from {} shadows the built-in {}", PluginKindName(kind), name,
             dir + "/" + PluginFileName(kind, name), shadowed);
}

}  // namespace

// Tries `name` in each directory; the error lists every path tried.
template <typename Plugin>
StatusOr<std::shared_ptr<Plugin>> PluginRegistry::LoadByName(
    const std::string& name, const std::vector<std::string>& search_path,
    const PluginParams& params, std::vector<LoadReport>* reports) {
  constexpr PluginKind kind = PluginTraits<Plugin>::kKind;
  std::vector<LoadReport> local;
  if (reports == nullptr) reports = &local;
  bool any_file = false;
  for (const auto& dir : search_path) {
    LoadReport report;
    report.kind = kind;
    report.name = name;
    const std::string path = dir + "/" + PluginFileName(kind, name);
    StatusOr<std::shared_ptr<Plugin>> loaded =
        PluginRegistry::Global().LoadFromPath<Plugin>(path, params, &report);
    report.path = path;
    reports->push_back(report);
    if (loaded.ok()) {
      WarnIfShadowing(kind, name, dir);
      return loaded;
    }
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

StatusOr<std::shared_ptr<Backend>> PluginRegistry::LoadBackend(
    const std::string& name, const std::vector<std::string>& search_path,
    const PluginParams& params, std::vector<LoadReport>* reports) {
  if (auto b = FindBackend(name)) return b;
  return LoadByName<Backend>(name, search_path, params, reports);
}

StatusOr<std::shared_ptr<CommPlugin>> PluginRegistry::LoadComm(
    const std::string& name, const std::vector<std::string>& search_path,
    const PluginParams& params, std::vector<LoadReport>* reports) {
  if (auto c = FindComm(name)) return c;
  return LoadByName<CommPlugin>(name, search_path, params, reports);
}

StatusOr<std::shared_ptr<Backend>> PluginRegistry::RegisterBackendTable(
    const pc_backend_iface* table, const PluginParams& params, const std::string& source) {
  return RegisterTable<Backend>(table, params, source);
}

StatusOr<std::shared_ptr<Backend>> PluginRegistry::RegisterBackendPath(
    const std::string& path, const PluginParams& params) {
  return LoadBackendFromPath(path, params);
}

StatusOr<std::shared_ptr<CommPlugin>> PluginRegistry::RegisterCommTable(
    const pc_comm_iface* table, const PluginParams& params, const std::string& source) {
  return RegisterTable<CommPlugin>(table, params, source);
}

std::shared_ptr<Backend> PluginRegistry::FindBackend(const std::string& name) const {
  return Find<Backend>(name);
}

std::shared_ptr<CommPlugin> PluginRegistry::FindComm(const std::string& name) const {
  return Find<CommPlugin>(name);
}

std::vector<std::shared_ptr<Backend>> PluginRegistry::Backends() const { return All<Backend>(); }

std::vector<std::shared_ptr<CommPlugin>> PluginRegistry::Comms() const {
  return All<CommPlugin>();
}

void PluginRegistry::Release(const std::shared_ptr<Backend>& backend) {
  std::lock_guard<std::mutex> lock(mu_);
  auto drop = [&](auto& map) {
    for (auto it = map.begin(); it != map.end();) {
      it = it->second == backend ? map.erase(it) : std::next(it);
    }
  };
  drop(backends_.by_name);
  drop(backends_.by_path);
}

void PluginRegistry::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  backends_ = {};
  comms_ = {};
}

// ---- selection ---------------------------------------------------------------------------

std::vector<PluginFile> ProbedSafely(const std::vector<PluginFile>& files,
                                     std::vector<LoadReport>* reports,
                                     std::vector<int32_t>* probe_scores) {
  std::vector<PluginFile> sane;
  const std::vector<LoadReport> probed = DiagnosePluginsInChildren(files, ProbeTimeoutSeconds());
  for (size_t i = 0; i < files.size(); ++i) {
    if (probed[i].usable) {
      sane.push_back(files[i]);
      if (probe_scores != nullptr) probe_scores->push_back(probed[i].probe_score);
      continue;
    }
    Log().warn("skipped plugin {}: {}", files[i].path, probed[i].reason);
    if (reports != nullptr) reports->push_back(probed[i]);
  }
  return sane;
}

StatusOr<Selection> SelectPlugins(const RuntimeConfig& config, Discovery discovery,
                                  const PluginParams& discovered_params) {
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
  } else if (discovery != Discovery::kNone) {
    std::vector<PluginFile> files;
    for (const PluginFile& f : DiscoverPlugins(search)) {
      if (f.kind == PluginKind::kBackend && !f.shadowed) files.push_back(f);
    }
    std::vector<int32_t> scores;
    files = ProbedSafely(files, &sel.reports, &scores);
    // Best first; a plugin without a probe ranks as score 1; equal scores keep search order.
    std::vector<size_t> order(files.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto rank = [&](size_t i) { return scores[i] < 0 ? 1 : scores[i]; };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return rank(a) > rank(b); });
    for (size_t i : order) {
      if (discovery == Discovery::kBest && sel.backend) break;
      LoadReport report;
      auto b = LoadBackendFromPath(files[i].path, sel.backend ? PluginParams{} : discovered_params,
                                   &report);
      sel.reports.push_back(report);
      if (!b.ok()) {
        Log().warn("skipping {}", report.ToString());
        continue;
      }
      if (!sel.backend) sel.backend = *b;
    }
    if (sel.backend) {
      Log().info("backend '{}' chosen by discovery (highest probe score{})", sel.backend->name(),
                 discovery == Discovery::kBest ? "; the others were not loaded" : "");
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
