// Conformance checks of the table itself, device enumeration and error objects.
#include <cstddef>
#include <set>
#include <string>

#include "runtime/abi_internal.h"
#include "runtime/conformance/harness.h"

namespace polychip::runtime::conformance {
namespace {

// Is member `m` present (within the plugin's struct_size and non-NULL)?
#define PCC_HAS(api, m) (PC_HAS_MEMBER(api, pc_backend_iface_t, m) && (api)->m != nullptr)

constexpr uint32_t kKnownFlags = PC_DEVICE_FLAG_HOST_ACCESSIBLE | PC_DEVICE_FLAG_ASYNC_FREE |
                                 PC_DEVICE_FLAG_ASYNC_COPY | PC_DEVICE_FLAG_ASYNC_EXEC |
                                 PC_DEVICE_FLAG_STREAM_PRIORITY | PC_DEVICE_FLAG_WEIGHT_REPACK |
                                 PC_DEVICE_FLAG_TIMING;

// (Functions rather than inline comparisons: with PC_ABI_MINOR 0 those would warn.)
bool PluginOlderThanHost(uint32_t minor) { return minor + 1 <= uint32_t{PC_ABI_MINOR}; }
bool PluginNewerThanHost(uint32_t minor) { return minor > uint32_t{PC_ABI_MINOR}; }

Verdict AbiVersion(Harness& h) {
  if (h.api->abi_major != PC_ABI_MAJOR) {
    return Fail("table abi_major " + std::to_string(h.api->abi_major) + ", host " +
                std::to_string(PC_ABI_MAJOR));
  }
  return Pass("plugin ABI " + std::to_string(h.api->abi_major) + "." +
              std::to_string(h.api->abi_minor) + ", host " + std::to_string(PC_ABI_MAJOR) + "." +
              std::to_string(PC_ABI_MINOR));
}

// Plausible: covers every required member of 1.0, covers the whole host table when the plugin
// is at least as new as the host, is a whole number of pointers, and is not absurdly large.
Verdict AbiStructSize(Harness& h) {
  const size_t size = h.api->struct_size;
  const size_t min_size = offsetof(pc_backend_iface_t, op_launch) + sizeof(void*);
  const std::string s = "struct_size " + std::to_string(size);
  if (size < min_size) return Fail(s + " < " + std::to_string(min_size) + " (required members)");
  if (!PluginOlderThanHost(h.api->abi_minor) && size < sizeof(pc_backend_iface_t)) {
    return Fail(s + " < host sizeof " + std::to_string(sizeof(pc_backend_iface_t)) +
                " although the plugin's minor is not older");
  }
  if (size % sizeof(void*) != 0) return Fail(s + " is not a multiple of the pointer size");
  if (size > 65536) return Fail(s + " is implausibly large");
  return Pass(s);
}

Verdict AbiRequiredMembers(Harness& h) {
  const pc_backend_iface_t* a = h.api;
  std::string missing;
  auto need = [&](bool present, const char* name) {
    if (!present) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
#define PCC_NEED(m) need(PCC_HAS(a, m), #m)
  need(a->name != nullptr && a->name[0] != '\0', "name");
  need(a->version != nullptr && a->version[0] != '\0', "version");
  PCC_NEED(error_code);
  PCC_NEED(error_message);
  PCC_NEED(error_destroy);
  PCC_NEED(initialize);
  PCC_NEED(shutdown);
  PCC_NEED(device_count);
  PCC_NEED(device_get_props);
  PCC_NEED(device_open);
  PCC_NEED(device_close);
  PCC_NEED(mem_alloc);
  PCC_NEED(mem_free);
  PCC_NEED(memcpy_h2d);
  PCC_NEED(memcpy_d2h);
  PCC_NEED(memcpy_d2d);
  PCC_NEED(stream_create);
  PCC_NEED(stream_destroy);
  PCC_NEED(stream_synchronize);
  PCC_NEED(event_create);
  PCC_NEED(event_destroy);
  PCC_NEED(event_record);
  PCC_NEED(stream_wait_event);
  PCC_NEED(event_synchronize);
  PCC_NEED(op_supports);
  PCC_NEED(op_launch);
#undef PCC_NEED
  if (!missing.empty()) return Fail("missing required: " + missing);
  return Pass();
}

// The rule tested: get_api(host_major != plugin major) returns NULL or a table whose abi_major
// is not the requested one (so that host rejects it); a host of the same major and a newer
// minor gets a table of that major; and asking again for the host's own version afterwards
// still gives a valid table (the plugin keeps no broken state from the refused requests).
Verdict AbiFutureMajor(Harness& h) {
  if (h.get_api == nullptr) return Skip("table registered without get_api");
  const pc_host_services_t* host = HostServices();
  for (uint32_t major : {uint32_t{PC_ABI_MAJOR + 1}, uint32_t{PC_ABI_MAJOR + 100}, 0u}) {
    const pc_backend_iface_t* t = h.get_api(major, 0, host);
    if (t != nullptr && t->abi_major == major) {
      return Fail("get_api(" + std::to_string(major) + ", 0) returned a table claiming major " +
                  std::to_string(major) + ", which this plugin cannot implement");
    }
  }
  const pc_backend_iface_t* newer = h.get_api(PC_ABI_MAJOR, PC_ABI_MINOR + 7, host);
  if (newer == nullptr || newer->abi_major != PC_ABI_MAJOR) {
    return Fail("get_api(host major, newer minor) must still return a table of major " +
                std::to_string(PC_ABI_MAJOR));
  }
  const pc_backend_iface_t* again = h.get_api(PC_ABI_MAJOR, PC_ABI_MINOR, host);
  if (again == nullptr || again->abi_major != PC_ABI_MAJOR) {
    return Fail("get_api(host version) failed after the refused requests");
  }
  return Pass("future/past majors refused; newer minor accepted");
}

// The probe is optional, cheap, and for a plugin that the kit can check at all, says usable.
Verdict Probe(Harness& h) {
  if (h.probe == nullptr) return Skip("no pc_backend_probe exported (optional)");
  pc_probe_result_t r;
  std::memset(&r, 'x', sizeof(r));
  r.struct_size = sizeof(r);
  r.score = -1;
  h.probe(&r);
  if (memchr(r.reason, 0, sizeof(r.reason)) == nullptr) return Fail("reason not NUL-terminated");
  if (r.score < 0) return Fail("negative score " + std::to_string(r.score));
  if (r.score == 0) return Fail(std::string("probe says unusable: ") + r.reason);
  return Pass("score " + std::to_string(r.score));
}

// Props of every ordinal: internally consistent, distinct physical ids.
Verdict DeviceProps(Harness& h) {
  int32_t count = 0;
  PCC_TRY(h.Take(h.api->device_count(&count), "device_count"));
  if (count < 1) return Fail("device_count is " + std::to_string(count));
  if (h.ordinal >= count) {
    return Fail("device under test " + std::to_string(h.ordinal) + " >= device_count " +
                std::to_string(count));
  }
  std::set<std::string> ids;
  for (int32_t i = 0; i < count; ++i) {
    pc_device_props_t p{};
    p.struct_size = sizeof(p);
    PCC_TRY(h.Take(h.api->device_get_props(i, &p), "device_get_props"));
    const std::string d = "device " + std::to_string(i) + ": ";
    if (memchr(p.name, 0, sizeof(p.name)) == nullptr || p.name[0] == '\0')
      return Fail(d + "name empty or not NUL-terminated");
    if (memchr(p.physical_id, 0, sizeof(p.physical_id)) == nullptr || p.physical_id[0] == '\0')
      return Fail(d + "physical_id empty or not NUL-terminated");
    if (!ids.insert(p.physical_id).second)
      return Fail(d + "physical_id '" + p.physical_id + "' not unique");
    if (p.total_memory == 0) return Fail(d + "total_memory is 0");
    if (p.free_memory > p.total_memory) return Fail(d + "free_memory > total_memory");
    if (p.alignment == 0 || (p.alignment & (p.alignment - 1)) != 0)
      return Fail(d + "alignment " + std::to_string(p.alignment) + " is not a power of two");
    if (p.max_alloc_size == 0 || p.max_alloc_size > p.total_memory)
      return Fail(d + "max_alloc_size " + std::to_string(p.max_alloc_size) +
                  " not in (0, total_memory " + std::to_string(p.total_memory) + "]");
    if (p.priority_low > p.priority_high)
      return Fail(d + "priority_low " + std::to_string(p.priority_low) + " > priority_high " +
                  std::to_string(p.priority_high));
    if (!(p.flags & PC_DEVICE_FLAG_STREAM_PRIORITY) && p.priority_low != p.priority_high)
      return Fail(d + "priority range without STREAM_PRIORITY flag");
    if (!PluginNewerThanHost(h.api->abi_minor) && (p.flags & ~kKnownFlags))
      return Fail(d + "unknown flag bits set");
    if (p.compute_units < 0) return Fail(d + "negative compute_units");
  }
  return Pass(std::to_string(count) + " device(s)");
}

// An older host passes a shorter props struct: the plugin must not write past its struct_size.
Verdict DevicePropsOldHost(Harness& h) {
  union {
    pc_device_props_t props;
    unsigned char bytes[sizeof(pc_device_props_t)];
  } u;
  std::memset(u.bytes, 0xA5, sizeof(u.bytes));
  const size_t short_size = offsetof(pc_device_props_t, total_memory);  // name, physical_id
  u.props.struct_size = short_size;
  PCC_TRY(h.Take(h.api->device_get_props(h.ordinal, &u.props), "device_get_props"));
  for (size_t i = short_size; i < sizeof(u.bytes); ++i) {
    if (u.bytes[i] != 0xA5) {
      return Fail("wrote byte " + std::to_string(i) + " beyond the caller's struct_size " +
                  std::to_string(short_size));
    }
  }
  return Pass("stayed within struct_size " + std::to_string(short_size));
}

Verdict DeviceBadOrdinal(Harness& h) {
  int32_t count = 0;
  PCC_TRY(h.Take(h.api->device_count(&count), "device_count"));
  const std::initializer_list<pc_code_t> allowed = {PC_CODE_INVALID_ARGUMENT, PC_CODE_NOT_FOUND};
  for (int32_t bad : {count, -1, 1 << 30}) {
    pc_device_props_t p{};
    p.struct_size = sizeof(p);
    const std::string what = "device_get_props(" + std::to_string(bad) + ")";
    std::string problem = CheckErrorObject(h.api, h.api->device_get_props(bad, &p), what.c_str(),
                                           allowed);
    if (!problem.empty()) return Fail(problem);
  }
  pc_device_t* dev = nullptr;
  pc_error_t* err = h.api->device_open(count, &dev);
  if (err == nullptr && dev != nullptr) h.api->device_close(dev);
  std::string problem = CheckErrorObject(h.api, err, "device_open(device_count)", allowed);
  if (!problem.empty()) return Fail(problem);
  return Pass("INVALID_ARGUMENT/NOT_FOUND with messages");
}

// Optional members agree with the flags every device reports: mem_free_async iff ASYNC_FREE,
// event_elapsed_ms iff TIMING, weight_free with weight_upload (and WEIGHT_REPACK needs
// weight_upload), host_alloc with host_free, counter_count with counter_get.
Verdict AbiOptionalMembers(Harness& h) {
  int32_t count = 0;
  PCC_TRY(h.Take(h.api->device_count(&count), "device_count"));
  uint32_t any_flags = 0;
  for (int32_t i = 0; i < count; ++i) {
    pc_device_props_t p{};
    p.struct_size = sizeof(p);
    PCC_TRY(h.Take(h.api->device_get_props(i, &p), "device_get_props"));
    any_flags |= p.flags;
  }
  const pc_backend_iface_t* a = h.api;
  auto iff = [&](bool member, uint32_t flag, const char* m, const char* f) -> std::string {
    const bool has_flag = (any_flags & flag) != 0;
    if (member == has_flag) return "";
    return member ? std::string(m) + " present but no device has " + f
                  : std::string(f) + " set but " + m + " is NULL";
  };
  std::string problem = iff(PCC_HAS(a, mem_free_async), PC_DEVICE_FLAG_ASYNC_FREE,
                            "mem_free_async", "ASYNC_FREE");
  if (problem.empty())
    problem = iff(PCC_HAS(a, event_elapsed_ms), PC_DEVICE_FLAG_TIMING, "event_elapsed_ms",
                  "TIMING");
  if (problem.empty() && PCC_HAS(a, weight_upload) != PCC_HAS(a, weight_free))
    problem = "weight_upload and weight_free must come together";
  if (problem.empty() && (any_flags & PC_DEVICE_FLAG_WEIGHT_REPACK) && !PCC_HAS(a, weight_upload))
    problem = "WEIGHT_REPACK set but weight_upload is NULL";
  if (problem.empty() && PCC_HAS(a, host_alloc) != PCC_HAS(a, host_free))
    problem = "host_alloc and host_free must come together";
  if (problem.empty() && PCC_HAS(a, counter_count) != PCC_HAS(a, counter_get))
    problem = "counter_count and counter_get must come together";
  if (!problem.empty()) return Fail(problem);
  return Pass();
}

Verdict ErrorsAllocTooLarge(Harness& h) {
  const std::initializer_list<pc_code_t> allowed = {PC_CODE_RESOURCE_EXHAUSTED,
                                                    PC_CODE_INVALID_ARGUMENT};
  std::string tried;
  const uint64_t sizes[] = {h.props.max_alloc_size + 1, h.props.total_memory + (1ull << 20),
                            ~uint64_t{0} / 2};
  for (uint64_t size : sizes) {
    if (size <= h.props.max_alloc_size) continue;  // wrapped around
    pc_devptr_t p = 0;
    pc_error_t* err = h.api->mem_alloc(h.device, size, &p);
    if (err == nullptr) (void)h.Take(h.api->mem_free(h.device, p), "mem_free");
    const std::string what = "mem_alloc(" + std::to_string(size) + ")";
    std::string problem = CheckErrorObject(h.api, err, what.c_str(), allowed);
    if (!problem.empty()) return Fail(problem);
    tried += (tried.empty() ? "" : ", ") + std::to_string(size);
  }
  if (tried.empty()) return Skip("max_alloc_size leaves no larger size");
  return Pass("refused " + tried);
}

Verdict ErrorsInvalidOp(Harness& h) {
  const pc_op_t bad = static_cast<pc_op_t>(9999);
  pc_op_query_t q{};
  q.struct_size = sizeof(q);
  q.op = bad;
  for (auto& d : q.dtypes) d = PC_DTYPE_F32;
  if (h.api->op_supports(h.device, &q) != 0) return Fail("op_supports claims op 9999");
  pc_add_args_t args{};  // any struct: the op id is checked first
  args.struct_size = sizeof(args);
  std::string problem = CheckErrorObject(h.api, h.api->op_launch(h.stream, bad, &args),
                                         "op_launch(op 9999)",
                                         {PC_CODE_UNIMPLEMENTED, PC_CODE_INVALID_ARGUMENT});
  if (!problem.empty()) return Fail(problem);
  PCC_TRY(h.Sync());  // the refused launch must not poison the stream
  return Pass("refused with a message; stream still usable");
}

}  // namespace

void AddApiChecks(std::vector<Check>& checks) {
  checks.push_back({"abi.version", Stage::kTable, AbiVersion});
  checks.push_back({"abi.struct_size", Stage::kTable, AbiStructSize});
  checks.push_back({"abi.required_members", Stage::kTable, AbiRequiredMembers});
  checks.push_back({"abi.future_major", Stage::kTable, AbiFutureMajor});
  checks.push_back({"probe", Stage::kTable, Probe});
  checks.push_back({"abi.optional_members", Stage::kInitialized, AbiOptionalMembers});
  checks.push_back({"device.props", Stage::kInitialized, DeviceProps});
  checks.push_back({"device.props_old_host", Stage::kInitialized, DevicePropsOldHost});
  checks.push_back({"device.bad_ordinal", Stage::kInitialized, DeviceBadOrdinal});
  checks.push_back({"errors.alloc_too_large", Stage::kDevice, ErrorsAllocTooLarge});
  checks.push_back({"errors.invalid_op", Stage::kDevice, ErrorsInvalidOp});
}

}  // namespace polychip::runtime::conformance
