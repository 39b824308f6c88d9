// Helpers shared by the conformance checks.
#include "runtime/conformance/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

namespace polychip::runtime::conformance {

const char* CodeName(pc_code_t code) {
  switch (code) {
    case PC_CODE_OK: return "OK";
    case PC_CODE_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case PC_CODE_NOT_FOUND: return "NOT_FOUND";
    case PC_CODE_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case PC_CODE_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case PC_CODE_UNAVAILABLE: return "UNAVAILABLE";
    case PC_CODE_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case PC_CODE_CANCELLED: return "CANCELLED";
    case PC_CODE_INTERNAL: return "INTERNAL";
  }
  return "NOT_A_CANONICAL_CODE";
}

namespace {
StatusCode ToStatusCode(pc_code_t code) {
  switch (code) {
    case PC_CODE_INVALID_ARGUMENT: return StatusCode::kInvalidArgument;
    case PC_CODE_NOT_FOUND: return StatusCode::kNotFound;
    case PC_CODE_RESOURCE_EXHAUSTED: return StatusCode::kResourceExhausted;
    case PC_CODE_UNIMPLEMENTED: return StatusCode::kUnimplemented;
    case PC_CODE_UNAVAILABLE: return StatusCode::kUnavailable;
    case PC_CODE_FAILED_PRECONDITION: return StatusCode::kFailedPrecondition;
    case PC_CODE_CANCELLED: return StatusCode::kCancelled;
    default: return StatusCode::kInternal;
  }
}
}  // namespace

Harness::~Harness() { (void)FreeAll(); }

Status Harness::Take(pc_error_t* error, const char* what) const {
  if (error == nullptr) return Status::Ok();
  const pc_code_t code = api->error_code(error);
  const char* message = api->error_message(error);
  std::string text = std::string(what) + ": " + (message ? message : "(NULL error message)");
  api->error_destroy(error);
  // An error that claims OK is still a failure of the call that returned it.
  return Status(code == PC_CODE_OK ? StatusCode::kInternal : ToStatusCode(code), text);
}

StatusOr<pc_devptr_t> Harness::Alloc(uint64_t bytes) {
  pc_devptr_t p = 0;
  PC_RETURN_IF_ERROR(Take(api->mem_alloc(device, bytes, &p), "mem_alloc"));
  allocations_.push_back(p);
  return p;
}

Status Harness::FreeAll() {
  Status first;
  if (device == nullptr) return first;
  if (stream) (void)Sync();  // nothing may still use the memory
  for (pc_devptr_t p : allocations_) {
    Status s = Take(api->mem_free(device, p), "mem_free");
    if (first.ok() && !s.ok()) first = s;
  }
  allocations_.clear();
  return first;
}

Status Harness::Sync(pc_stream_t* s) const {
  return Take(api->stream_synchronize(s ? s : stream), "stream_synchronize");
}

Status Harness::Fill(pc_devptr_t dst, uint8_t value, uint64_t n, pc_stream_t* s) const {
  if (s == nullptr) s = stream;
  if (PC_HAS_MEMBER(api, pc_backend_iface_t, memset) && api->memset != nullptr) {
    return Take(api->memset(s, dst, value, n), "memset");
  }
  // Static patterns, one per value, never written again: a queued copy may read them later.
  constexpr uint64_t kChunk = 1 << 20;
  static std::mutex mu;
  static std::map<uint8_t, std::vector<uint8_t>> patterns;
  const uint8_t* pattern;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = patterns.try_emplace(value);
    if (fresh) it->second.assign(kChunk, value);
    pattern = it->second.data();
  }
  for (uint64_t done = 0; done < n;) {
    const uint64_t len = std::min(kChunk, n - done);
    PC_RETURN_IF_ERROR(Take(api->memcpy_h2d(s, dst + done, pattern, len), "memcpy_h2d (fill)"));
    done += len;
  }
  return Status::Ok();
}

Status Harness::MemoryInfo(uint64_t* free_bytes, uint64_t* total_bytes) const {
  if (PC_HAS_MEMBER(api, pc_backend_iface_t, mem_get_info) && api->mem_get_info != nullptr) {
    return Take(api->mem_get_info(device, free_bytes, total_bytes), "mem_get_info");
  }
  *free_bytes = *total_bytes = props.total_memory;
  return Status::Ok();
}

Status Harness::Upload(pc_devptr_t dst, const void* src, uint64_t n) const {
  PC_RETURN_IF_ERROR(Take(api->memcpy_h2d(stream, dst, src, n), "memcpy_h2d"));
  return Sync();
}

Status Harness::Download(void* dst, pc_devptr_t src, uint64_t n) const {
  PC_RETURN_IF_ERROR(Take(api->memcpy_d2h(stream, dst, src, n), "memcpy_d2h"));
  return Sync();
}

Status Harness::Launch(pc_op_t op, const void* args) const {
  PC_RETURN_IF_ERROR(Take(api->op_launch(stream, op, args), "op_launch"));
  return Sync();
}

bool Harness::Supports(pc_op_t op, std::initializer_list<pc_dtype_t> dtypes,
                       pc_shape_class_t shape, uint32_t layout) const {
  if (layout != PC_LAYOUT_GGUF && api->abi_minor < 2) return false;  // it would not read it
  // V's cache type came in 1.6: an older plugin reads K's for both.
  const pc_dtype_t* d = dtypes.begin();
  if ((op == PC_OP_KV_STORE || op == PC_OP_ATTENTION) && api->abi_minor < 6 &&
      dtypes.size() > 1 && d[1] != d[0])
    return false;
  // MOE's low-rank terms (dtypes[3]) came in 1.7: an older plugin ignores that entry.
  if (op == PC_OP_MOE && api->abi_minor < 7 && dtypes.size() > 3 && d[3] != PC_DTYPE_INVALID)
    return false;
  pc_op_query_t q{};
  q.struct_size = sizeof(q);
  q.op = op;
  for (auto& d : q.dtypes) d = PC_DTYPE_INVALID;
  size_t i = 0;
  for (pc_dtype_t d : dtypes) q.dtypes[i++] = d;
  q.shape_class = shape;
  q.layout = layout;
  return api->op_supports(device, &q) != 0;
}

std::vector<float> Harness::RandomFloats(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> Harness::RandomBytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng() >> 24);
  return v;
}

std::string CheckErrorObject(const pc_backend_iface_t* api, pc_error_t* error, const char* what,
                             std::initializer_list<pc_code_t> allowed) {
  if (error == nullptr) return std::string(what) + " succeeded where it must fail";
  std::string problem;
  const pc_code_t code = api->error_code(error);
  const char* message = api->error_message(error);
  if (std::find(allowed.begin(), allowed.end(), code) == allowed.end()) {
    problem = std::string(what) + " returned code " + CodeName(code) + " (" +
              std::to_string(static_cast<int>(code)) + "), expected one of";
    for (pc_code_t c : allowed) problem += std::string(" ") + CodeName(c);
  } else if (message == nullptr) {
    problem = std::string(what) + ": error_message returned NULL";
  } else if (message[0] == '\0') {
    problem = std::string(what) + ": error_message is empty";
  }
  api->error_destroy(error);
  return problem;
}

double RelativeError(const std::vector<float>& actual, const std::vector<float>& expected) {
  if (actual.size() != expected.size()) return INFINITY;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isnan(actual[i]) || std::isnan(expected[i])) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(double(actual[i]) - expected[i]));
    max_ref = std::max(max_ref, std::fabs(double(expected[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

Verdict CompareOutputs(const std::vector<float>& actual, const std::vector<float>& expected,
                       double tol) {
  const double err = RelativeError(actual, expected);
  char buf[160];
  if (err <= tol) {
    std::snprintf(buf, sizeof(buf), "rel err %.2e <= tol %.0e", err, tol);
    return Pass(buf);
  }
  // Name the worst element: the first thing a plugin author needs to look at.
  size_t worst = 0;
  double worst_diff = -1;
  for (size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) {
    const double d = std::isnan(actual[i]) ? INFINITY : std::fabs(double(actual[i]) - expected[i]);
    if (d > worst_diff) worst_diff = d, worst = i;
  }
  std::snprintf(buf, sizeof(buf), "rel err %.2e > tol %.0e; worst [%zu]: got %g, want %g", err,
                tol, worst, worst < actual.size() ? actual[worst] : NAN,
                worst < expected.size() ? expected[worst] : NAN);
  return Fail(buf);
}

}  // namespace polychip::runtime::conformance
