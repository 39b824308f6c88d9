// Runtime-internal: the raw ABI behind the C++ objects. Only src/runtime (and its
// conformance kit in src/runtime/conformance) may include this header.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "polychip/plugin/pc_backend.h"
#include "polychip/plugin/pc_comm.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/plugin_loader.h"
#include "util/status.h"

namespace polychip::runtime {

// The host services lent to every plugin (static lifetime).
const pc_host_services_t* HostServices();

StatusCode FromPcCode(pc_code_t code);
pc_code_t ToPcCode(StatusCode code);
// Converts a plugin error to a Status and destroys it with that plugin's error_destroy.
// error == NULL is OK. `what` prefixes the message ("mem_alloc: ...").
Status TakeError(const pc_backend_iface_t* table, pc_error_t* error, const char* what);
Status TakeCommError(const pc_comm_iface_t* table, pc_error_t* error, const char* what);

// Table validation as the loader does it: abi_major, struct_size, required members. The
// message names the first offending member, e.g. "required member 'mem_alloc' is NULL".
Status ValidateBackendTable(const pc_backend_iface_t* table);
Status ValidateCommTable(const pc_comm_iface_t* table);
// What a comm table declares about its reach (kUnknown for a table older than 1.3).
CommReach ReachOfTable(const pc_comm_iface_t* table);

// A dlopen'ed library (RTLD_NOW | RTLD_LOCAL). Closed on destruction.
class PluginLibrary {
 public:
  // On failure the report holds stage "dlopen", dlerror() text and missing DT_NEEDED entries.
  static StatusOr<std::unique_ptr<PluginLibrary>> Open(const std::string& path,
                                                       LoadReport* report = nullptr);
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  void* Symbol(const char* name) const;  // nullptr if absent
  const std::string& path() const { return path_; }
  void* handle() const { return handle_; }

 private:
  PluginLibrary(std::string path, void* handle) : path_(std::move(path)), handle_(handle) {}
  std::string path_;
  void* handle_;
};

// Raw load without initialize (for the conformance kit): dlopen, probe, get_api with the
// host's ABI version, validation. On failure the Status carries the report text; the library
// and (possibly invalid) table are still returned through *library / *table when obtained, so
// a checker can report more than the first failure.
struct RawBackend {
  std::unique_ptr<PluginLibrary> library;
  const pc_backend_iface_t* table = nullptr;  // valid while `library` lives
  pc_backend_get_api_fn get_api = nullptr;
  pc_backend_probe_fn probe = nullptr;        // may be null
};
Status OpenRawBackend(const std::string& path, RawBackend* out, LoadReport* report = nullptr);

// The same for a comm plugin.
struct RawComm {
  std::unique_ptr<PluginLibrary> library;
  const pc_comm_iface_t* table = nullptr;  // valid while `library` lives
  pc_comm_probe_fn probe = nullptr;        // may be null
};
Status OpenRawComm(const std::string& path, RawComm* out, LoadReport* report = nullptr);

struct BackendImpl {
  std::unique_ptr<PluginLibrary> library;  // null when registered from code as a table
  const pc_backend_iface_t* table = nullptr;
  std::string name, path, version;
  bool initialized = false;
  uint64_t generation = 0;  // this load's number (Backend::generation())
  std::mutex mu;
  std::vector<std::weak_ptr<Device>> open_devices;  // by physical ordinal
};

struct CommImpl {
  std::unique_ptr<PluginLibrary> library;
  const pc_comm_iface_t* table = nullptr;
  std::string name, path, version;
  bool initialized = false;
};

// The raw table of a C++ object.
inline const pc_backend_iface_t* TableOf(const Backend& backend) { return backend.impl().table; }
inline const pc_comm_iface_t* TableOf(const CommPlugin& comm) { return comm.impl().table; }

}  // namespace polychip::runtime
