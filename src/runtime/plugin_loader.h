// Plugin discovery, loading, validation, registry and selection.
//
// Plugins are files libpolychip_backend_<name>.so / libpolychip_comm_<name>.so found on the
// search path (POLYCHIP_PLUGIN_PATH, then <dir of the executable>/../lib/polychip). They are
// dlopen'ed RTLD_NOW|RTLD_LOCAL, probed, asked for their table, and validated (ABI major,
// struct_size, required members). A plugin that was asked for and cannot be loaded is an error
// naming every path tried and its reason: never a silent fallback to another backend.
//
// This header is usable outside src/runtime: ABI types appear only as forward declarations.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/comm.h"
#include "runtime/config.h"
#include "util/status.h"

struct pc_backend_iface;  // include/polychip/plugin/pc_backend.h
struct pc_comm_iface;     // include/polychip/plugin/pc_comm.h

namespace polychip::runtime {

class Backend;     // runtime/device.h
class CommPlugin;  // runtime/comm.h

// The ABI types and loading steps of one plugin kind (Backend or CommPlugin); defined in
// plugin_loader.cc, where the registry's code for both kinds is written once over it.
template <typename Plugin>
struct PluginTraits;

enum class PluginKind { kBackend, kComm };
const char* PluginKindName(PluginKind kind);  // "backend" / "comm"

// "libpolychip_backend_emu.so"
std::string PluginFileName(PluginKind kind, std::string_view name);

// POLYCHIP_PLUGIN_PATH entries (colon-separated), then <exe dir>/../lib/polychip.
// `extra` directories (from the config file) come first.
std::vector<std::string> PluginSearchPath(const std::vector<std::string>& extra = {});

// A plugin file found by a directory scan.
struct PluginFile {
  PluginKind kind;
  std::string name;  // from the file name
  std::string path;
  bool shadowed = false;  // an earlier directory has a plugin of the same kind and name
};
// Every libpolychip_{backend,comm}_*.so in `dirs`, in search order, first one of a name wins
// (later duplicates are still listed, with shadowed = true, for `doctor`).
std::vector<PluginFile> DiscoverPlugins(const std::vector<std::string>& dirs);

// ldd-like: the DT_NEEDED entries of an ELF file that cannot be found (through the file's
// RPATH/RUNPATH, LD_LIBRARY_PATH, the loader cache and the default directories). Each
// entry is the library's soname. Empty when all are found or the file is not a readable ELF.
std::vector<std::string> MissingLibraries(const std::string& path);
// Every DT_NEEDED soname of the file (empty if unreadable).
std::vector<std::string> NeededLibraries(const std::string& path);

// The diagnosis of one load attempt; `ToString()` is the one-line reason shown to the user.
struct LoadReport {
  std::string path;
  PluginKind kind = PluginKind::kBackend;
  std::string name;  // the table's name if loaded, else from the file name
  bool usable = false;
  // Where it failed: "not found", "dlopen", "symbol", "get_api", "abi", "validate", "probe",
  // "initialize"; empty when usable.
  std::string stage;
  std::string reason;                          // precise message, e.g. "plugin ABI 2.0, host ABI 1.0"
  std::vector<std::string> missing_libraries;  // with stage "dlopen"
  int32_t probe_score = -1;                    // -1: the plugin has no probe
  std::string probe_reason;
  std::string version;  // the plugin's version string, when the table was obtained
  uint32_t abi_major = 0, abi_minor = 0;
  // A comm plugin's declarations, read from its validated table: which processes one
  // communicator can join, and the backend whose device memory its collectives read (empty:
  // host memory). The framework's default choice of comm plugin goes by these.
  CommReach comm_reach = CommReach::kUnknown;
  std::string comm_device_plugin;
  std::string ToString() const;  // "<path>: <reason>"
};

// Loads, validates and initializes one plugin file. On failure the Status message is the
// report's text (and *report, if given, holds the details). Loading the same file twice
// returns the already-loaded object (initialize is called once).
StatusOr<std::shared_ptr<Backend>> LoadBackendFromPath(const std::string& path,
                                                       const PluginParams& params = {},
                                                       LoadReport* report = nullptr);
StatusOr<std::shared_ptr<CommPlugin>> LoadCommFromPath(const std::string& path,
                                                       const PluginParams& params = {},
                                                       LoadReport* report = nullptr);

// Inspects a plugin file as `doctor` does: dlopen, symbols, ABI, validation, probe; does not
// call initialize. The library is unloaded again unless it is already in use.
LoadReport DiagnosePlugin(const std::string& path, PluginKind kind);

// The process-wide registry of loaded plugins. Thread-safe.
class PluginRegistry {
 public:
  static PluginRegistry& Global();

  // By name: tries each directory of `search_path` in order; on failure the NOT_FOUND /
  // FAILED_PRECONDITION message lists every path tried with its reason. `reports`, if given,
  // receives one entry per path tried.
  StatusOr<std::shared_ptr<Backend>> LoadBackend(const std::string& name,
                                                 const std::vector<std::string>& search_path,
                                                 const PluginParams& params = {},
                                                 std::vector<LoadReport>* reports = nullptr);
  StatusOr<std::shared_ptr<CommPlugin>> LoadComm(const std::string& name,
                                                 const std::vector<std::string>& search_path,
                                                 const PluginParams& params = {},
                                                 std::vector<LoadReport>* reports = nullptr);

  // Registration from code (an embedding program). A table is validated like a loaded one;
  // `source` is shown as its path (e.g. "<registered from code>").
  StatusOr<std::shared_ptr<Backend>> RegisterBackendTable(const pc_backend_iface* table,
                                                          const PluginParams& params = {},
                                                          const std::string& source = "");
  StatusOr<std::shared_ptr<Backend>> RegisterBackendPath(const std::string& path,
                                                         const PluginParams& params = {});
  StatusOr<std::shared_ptr<CommPlugin>> RegisterCommTable(const pc_comm_iface* table,
                                                          const PluginParams& params = {},
                                                          const std::string& source = "");

  // Already-loaded (or registered) plugins, by table name; nullptr if none.
  std::shared_ptr<Backend> FindBackend(const std::string& name) const;
  std::shared_ptr<CommPlugin> FindComm(const std::string& name) const;
  std::vector<std::shared_ptr<Backend>> Backends() const;
  std::vector<std::shared_ptr<CommPlugin>> Comms() const;

  // Forgets `backend` (by name and by path), so that another plugin of its name may load: it
  // shuts down and is dlclose'd when the last reference to it (its Devices, the caller's) goes.
  // Hot reload (model/hot_reload.h) releases the old plugin this way.
  void Release(const std::shared_ptr<Backend>& backend);
  // Drops the registry's references (plugins unload when their last object goes). For tests.
  void Clear();

 private:
  friend StatusOr<std::shared_ptr<Backend>> LoadBackendFromPath(const std::string&,
                                                                const PluginParams&, LoadReport*);
  friend StatusOr<std::shared_ptr<CommPlugin>> LoadCommFromPath(const std::string&,
                                                                const PluginParams&, LoadReport*);
  friend LoadReport DiagnosePlugin(const std::string&, PluginKind);

  // The loaded plugins of one kind (Backend or CommPlugin): by table name, and those loaded
  // from a file by canonical path.
  template <typename Plugin>
  struct Shelf {
    std::map<std::string, std::shared_ptr<Plugin>> by_name;
    std::map<std::string, std::shared_ptr<Plugin>> by_path;
  };

  // Each backend/comm pair of public members above is one of these, written once over
  // PluginTraits and instantiated for both kinds in plugin_loader.cc.
  template <typename Plugin>
  Shelf<Plugin>& ShelfOf();
  template <typename Plugin>
  const Shelf<Plugin>& ShelfOf() const;
  template <typename Plugin>
  StatusOr<std::shared_ptr<Plugin>> LoadFromPath(const std::string& path,
                                                 const PluginParams& params, LoadReport* report);
  template <typename Plugin>
  StatusOr<std::shared_ptr<Plugin>> RegisterTable(
      const typename PluginTraits<Plugin>::Table* table, const PluginParams& params,
      const std::string& source);
  template <typename Plugin>
  StatusOr<std::shared_ptr<Plugin>> LoadByName(const std::string& name,
                                               const std::vector<std::string>& search_path,
                                               const PluginParams& params,
                                               std::vector<LoadReport>* reports);
  template <typename Plugin>
  std::shared_ptr<Plugin> Find(const std::string& name) const;
  template <typename Plugin>
  std::vector<std::shared_ptr<Plugin>> All() const;
  // The report of the plugin loaded from `path`, if one is.
  template <typename Plugin>
  std::optional<LoadReport> ReportIfLoadedFrom(const std::string& path) const;

  mutable std::mutex mu_;
  Shelf<Backend> backends_;
  Shelf<CommPlugin> comms_;
};

// The files whose inspection in a child process (DiagnosePluginInChild, all at once, within
// POLYCHIP_PROBE_TIMEOUT_S) found them usable, for loading in this process; each other one is
// logged ("skipped plugin <path>: crashed in probe: SIGSEGV") and its report appended to
// `reports`. Discovery goes through here, so a plugin on the search path that crashes or hangs
// in its constructor, probe or get_api cannot take down or hang a command that did not ask for
// it (issue 16). `probe_scores`, if given, receives each returned file's probe score (-1: the
// plugin has no probe).
std::vector<PluginFile> ProbedSafely(const std::vector<PluginFile>& files,
                                     std::vector<LoadReport>* reports,
                                     std::vector<int32_t>* probe_scores = nullptr);

// What SelectPlugins does when the config names no backend.
enum class Discovery {
  kNone,  // nothing: Selection::backend stays null
  // The backend of the highest probe score (probed in child processes) is the only one loaded
  // in this process (the next one when it fails to load): the others stay unloaded, so that a
  // hot reload to any of them later loads and initializes it like a first load (issue 38).
  kBest,
  kAll,  // every discovered backend is loaded (failures only logged); the best one is returned
};

struct Selection {
  std::shared_ptr<Backend> backend;   // the chosen backend (null only if none was found)
  std::shared_ptr<CommPlugin> comm;   // null unless configured
  std::vector<LoadReport> reports;    // every attempt made
};
// Selection for a program: applies a resolved RuntimeConfig. Loads the configured backend (by
// path if given, else by name on the search path); with no backend configured, `discovery`
// says what is loaded, with `discovered_params` (e.g. the server's threads) passed to the
// chosen plugin's initialize. A plugin without a probe ranks as score 1; on equal scores the
// first in search order wins. Errors name every path tried.
StatusOr<Selection> SelectPlugins(const RuntimeConfig& config,
                                  Discovery discovery = Discovery::kNone,
                                  const PluginParams& discovered_params = {});

}  // namespace polychip::runtime
