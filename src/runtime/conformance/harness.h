// Runtime-internal: the state and helpers shared by the conformance checks. Includes the raw ABI.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "polychip/plugin/pc_backend.h"
#include "polychip/plugin/pc_comm.h"
#include "runtime/conformance/conformance.h"
#include "util/status.h"

namespace polychip::runtime::conformance {

struct Verdict {
  Outcome outcome = Outcome::kPass;
  std::string detail;
};
inline Verdict Pass(std::string detail = "") { return {Outcome::kPass, std::move(detail)}; }
inline Verdict Fail(std::string detail) { return {Outcome::kFail, std::move(detail)}; }
inline Verdict Skip(std::string detail) { return {Outcome::kSkip, std::move(detail)}; }

// Inside a check returning Verdict: fails the check with the Status message if not OK.
#define PCC_TRY(expr)                                           \
  do {                                                          \
    ::polychip::Status pcc_status_ = (expr);                    \
    if (!pcc_status_.ok()) return Fail(pcc_status_.ToString()); \
  } while (0)
#define PCC_ASSIGN(lhs, expr) PCC_ASSIGN_IMPL_(PC_CONCAT_(pcc_so_, __LINE__), lhs, expr)
#define PCC_ASSIGN_IMPL_(tmp, lhs, expr)                 \
  auto tmp = (expr);                                     \
  if (!tmp.ok()) return Fail(tmp.status().ToString()); \
  lhs = std::move(tmp).value()

// Everything a check may use. The runner fills it in stages: the table first, then (after
// initialize and device_open succeed) the device, its props and a default stream.
class Harness {
 public:
  Harness(const pc_backend_iface_t* api, pc_backend_get_api_fn get_api, int32_t ordinal,
          uint32_t seed)
      : api(api), get_api(get_api), ordinal(ordinal), rng(seed) {}
  ~Harness();

  const pc_backend_iface_t* api;
  pc_backend_get_api_fn get_api;
  pc_backend_probe_fn probe = nullptr;  // optional export
  int32_t ordinal;
  pc_device_t* device = nullptr;
  pc_stream_t* stream = nullptr;
  pc_device_props_t props{};
  std::mt19937 rng;

  // Converts a plugin error into a Status (prefixed with `what`) and destroys it. Tolerates a
  // broken error object (NULL message): the kit must survive the plugins it checks.
  Status Take(pc_error_t* error, const char* what) const;

  // Allocations made through Alloc are freed by FreeAll, which the runner calls after each check.
  StatusOr<pc_devptr_t> Alloc(uint64_t bytes);
  Status FreeAll();
  Status Sync(pc_stream_t* s = nullptr) const;
  // Synchronous helpers on the default stream.
  Status Upload(pc_devptr_t dst, const void* src, uint64_t n) const;
  Status Download(void* dst, pc_devptr_t src, uint64_t n) const;
  template <typename T>
  StatusOr<pc_devptr_t> UploadVec(const std::vector<T>& v) {
    PC_ASSIGN_OR_RETURN(pc_devptr_t p, Alloc(std::max<uint64_t>(1, v.size() * sizeof(T))));
    PC_RETURN_IF_ERROR(Upload(p, v.data(), v.size() * sizeof(T)));
    return p;
  }
  template <typename T>
  StatusOr<std::vector<T>> DownloadVec(pc_devptr_t src, size_t count) const {
    std::vector<T> v(count);
    PC_RETURN_IF_ERROR(Download(v.data(), src, count * sizeof(T)));
    return v;
  }
  // Sets n bytes to `value` on stream `s` (default: the default stream), stream-ordered: memset,
  // or, for a plugin without it (optional since ABI 1.5), copies from a static host pattern, as
  // the framework fills.
  Status Fill(pc_devptr_t dst, uint8_t value, uint64_t n, pc_stream_t* s = nullptr) const;
  // Free and total bytes: mem_get_info, or (absent, ABI 1.5) props.total_memory as both.
  Status MemoryInfo(uint64_t* free_bytes, uint64_t* total_bytes) const;
  // op_launch then stream_synchronize on the default stream.
  Status Launch(pc_op_t op, const void* args) const;
  // `layout` (ABI 1.2) is asked only of a plugin of 1.2 or later; older ones answer 0 for any
  // other than PC_LAYOUT_GGUF.
  bool Supports(pc_op_t op, std::initializer_list<pc_dtype_t> dtypes,
                pc_shape_class_t shape = PC_SHAPE_ANY, uint32_t layout = PC_LAYOUT_GGUF) const;

  std::vector<float> RandomFloats(size_t n, float lo = -1.0f, float hi = 1.0f);
  std::vector<uint8_t> RandomBytes(size_t n);

 private:
  std::vector<pc_devptr_t> allocations_;
};

// The contract of one error object: canonical code among `allowed`, a non-empty message, and a
// destroy that works. Destroys the error. Returns an empty string when it conforms.
std::string CheckErrorObject(const pc_backend_iface_t* api, pc_error_t* error, const char* what,
                             std::initializer_list<pc_code_t> allowed);
const char* CodeName(pc_code_t code);

// max |actual - expected| / max |expected|; infinity when any value is NaN or the sizes differ.
double RelativeError(const std::vector<float>& actual, const std::vector<float>& expected);
// Pass when err <= tol, with a short measurement as detail.
Verdict CompareOutputs(const std::vector<float>& actual, const std::vector<float>& expected,
                       double tol);

// What a check needs before it can run. The runner goes through the stages in order; when one
// cannot be reached (initialize or device_open failed) the checks of the later stages are
// skipped with that reason.
enum class Stage {
  kTable,        // the table only (before initialize)
  kInitialized,  // initialize succeeded
  kDevice,       // the device under test is open, with props and a default stream
};
struct Check {
  std::string name;
  Stage stage = Stage::kDevice;
  std::function<Verdict(Harness&)> run;
};
void AddApiChecks(std::vector<Check>& checks);     // checks_api.cc
void AddMemoryChecks(std::vector<Check>& checks);  // checks_memory.cc (memory and streams)
void AddOpChecks(std::vector<Check>& checks);      // checks_ops.cc
void AddCounterChecks(std::vector<Check>& checks);  // checks_counters.cc (per-op counters)

// Comm plugins (comm_checks.cc): runs every comm check on options.ranks ranks (threads) and
// appends the rows to the report.
void RunCommChecks(const Options& options, Report& report);
// As CheckErrorObject, for an error made by a comm plugin.
std::string CheckCommError(const pc_comm_iface_t* api, pc_error_t* error,
                           std::initializer_list<pc_code_t> allowed);

}  // namespace polychip::runtime::conformance
