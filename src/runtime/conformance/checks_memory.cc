// Conformance checks of the memory and sync domains: allocation, copies, memset, streams,
// events and priorities. Device memory is only ever reached through the plugin's copies: on a
// discrete device it is not host memory.
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "runtime/conformance/harness.h"

namespace polychip::runtime::conformance {
namespace {

#define PCC_HAS(api, m) (PC_HAS_MEMBER(api, pc_backend_iface_t, m) && (api)->m != nullptr)

// RAII for a stream or event created inside a check.
struct StreamGuard {
  const pc_backend_iface_t* api;
  pc_stream_t* s = nullptr;
  ~StreamGuard() {
    if (s) api->stream_destroy(s);
  }
};
struct EventGuard {
  const pc_backend_iface_t* api;
  pc_event_t* e = nullptr;
  ~EventGuard() {
    if (e) api->event_destroy(e);
  }
};

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Addresses are non-zero (0 means "absent" in op arguments), aligned, and non-overlapping.
Verdict MemoryAllocFree(Harness& h) {
  const uint64_t sizes[] = {1, 3, 4096, 65537, (1u << 20) + 7, 64, 100003};
  std::vector<std::pair<pc_devptr_t, uint64_t>> ranges;
  for (uint64_t size : sizes) {
    if (size > h.props.max_alloc_size) continue;
    PCC_ASSIGN(pc_devptr_t p, h.Alloc(size));
    if (p == 0) return Fail("mem_alloc returned address 0, which op arguments read as absent");
    if (p % h.props.alignment != 0)
      return Fail("mem_alloc(" + std::to_string(size) + ") = " + Hex(p) + " not aligned to " +
                  std::to_string(h.props.alignment));
    for (auto& [q, qs] : ranges) {
      if (p < q + qs && q < p + size)
        return Fail("allocations " + Hex(p) + " and " + Hex(q) + " overlap");
    }
    ranges.push_back({p, size});
  }
  PCC_TRY(h.FreeAll());
  if (!PCC_HAS(h.api, mem_get_info)) {
    return Pass(std::to_string(ranges.size()) + " allocations, alignment " +
                std::to_string(h.props.alignment) + "; no mem_get_info (optional)");
  }
  uint64_t free_bytes = 0, total_bytes = 0;
  PCC_TRY(h.Take(h.api->mem_get_info(h.device, &free_bytes, &total_bytes), "mem_get_info"));
  if (free_bytes > total_bytes) return Fail("mem_get_info: free > total");
  if (total_bytes != h.props.total_memory)
    return Fail("mem_get_info total " + std::to_string(total_bytes) + " != props total " +
                std::to_string(h.props.total_memory));
  return Pass(std::to_string(ranges.size()) + " allocations, alignment " +
              std::to_string(h.props.alignment));
}

// H2D then D2H (and D2D in between) of odd sizes give back the same bytes.
Verdict MemoryRoundTrip(Harness& h) {
  for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{4097}, uint64_t{1000003}}) {
    if (n > h.props.max_alloc_size) continue;
    std::vector<uint8_t> src = h.RandomBytes(n);
    PCC_ASSIGN(pc_devptr_t a, h.Alloc(n));
    PCC_ASSIGN(pc_devptr_t b, h.Alloc(n));
    PCC_TRY(h.Take(h.api->memcpy_h2d(h.stream, a, src.data(), n), "memcpy_h2d"));
    PCC_TRY(h.Take(h.api->memcpy_d2d(h.stream, b, a, n), "memcpy_d2d"));
    std::vector<uint8_t> back(n, 0), back_a(n, 0);
    PCC_TRY(h.Take(h.api->memcpy_d2h(h.stream, back.data(), b, n), "memcpy_d2h"));
    PCC_TRY(h.Take(h.api->memcpy_d2h(h.stream, back_a.data(), a, n), "memcpy_d2h"));
    PCC_TRY(h.Sync());
    if (back_a != src) return Fail("H2D/D2H of " + std::to_string(n) + " bytes differs");
    if (back != src) return Fail("H2D/D2D/D2H of " + std::to_string(n) + " bytes differs");
  }
  // Copies between aligned offsets inside one allocation (how the memory pool uses them).
  const uint64_t al = h.props.alignment, n = 3 * al + 5;
  if (4 * al + n <= h.props.max_alloc_size) {
    PCC_ASSIGN(pc_devptr_t big, h.Alloc(4 * al + n));
    std::vector<uint8_t> src = h.RandomBytes(n), back(n);
    PCC_TRY(h.Upload(big + al, src.data(), n));
    PCC_TRY(h.Take(h.api->memcpy_d2d(h.stream, big + 4 * al, big + al, n), "memcpy_d2d"));
    PCC_TRY(h.Download(back.data(), big + 4 * al, n));
    if (back != src) return Fail("D2D between offsets of one allocation differs");
  }
  return Pass("1, 7, 4097, 1000003 bytes and offsets");
}

Verdict MemoryMemset(Harness& h) {
  if (!PCC_HAS(h.api, memset)) return Skip("no memset (optional since ABI 1.5)");
  const uint64_t n = 10007;
  std::vector<uint8_t> src = h.RandomBytes(n), back(n);
  PCC_ASSIGN(pc_devptr_t p, h.Alloc(n));
  PCC_TRY(h.Upload(p, src.data(), n));
  // Only a middle range: the bytes around it must keep their values.
  const uint64_t off = 2 * 1024 < h.props.alignment ? 0 : 2048, len = 5001;
  PCC_TRY(h.Take(h.api->memset(h.stream, p + off, 0x5A, len), "memset"));
  PCC_TRY(h.Download(back.data(), p, n));
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t want = (i >= off && i < off + len) ? 0x5A : src[i];
    if (back[i] != want) return Fail("byte " + std::to_string(i) + " is " +
                                     std::to_string(back[i]) + ", want " + std::to_string(want));
  }
  return Pass();
}

Verdict MemoryManyAllocs(Harness& h) {
  const int kCount = 512;
  std::vector<pc_devptr_t> ptrs;
  for (int i = 0; i < kCount; ++i) {
    PCC_ASSIGN(pc_devptr_t p, h.Alloc(97 + 13 * i));
    ptrs.push_back(p);
  }
  std::sort(ptrs.begin(), ptrs.end());
  if (std::adjacent_find(ptrs.begin(), ptrs.end()) != ptrs.end())
    return Fail("two live allocations share an address");
  // Write each a distinct byte and read it back: they must not alias.
  for (int i = 0; i < kCount; i += 37) {
    uint8_t v = static_cast<uint8_t>(i);
    PCC_TRY(h.Take(h.api->memcpy_h2d(h.stream, ptrs[i], &v, 1), "memcpy_h2d"));
    PCC_TRY(h.Sync());  // &v changes next iteration
  }
  for (int i = 0; i < kCount; i += 37) {
    uint8_t v = 0;
    PCC_TRY(h.Download(&v, ptrs[i], 1));
    if (v != static_cast<uint8_t>(i)) return Fail("allocation " + std::to_string(i) + " aliased");
  }
  PCC_TRY(h.FreeAll());
  return Pass(std::to_string(kCount) + " allocations freed");
}

// The largest single allocation works (when the device has that much free).
Verdict MemoryMaxAlloc(Harness& h) {
  uint64_t free_bytes = 0, total_bytes = 0;
  PCC_TRY(h.MemoryInfo(&free_bytes, &total_bytes));
  const uint64_t max = h.props.max_alloc_size;
  if (max > free_bytes)
    return Skip("max_alloc_size " + std::to_string(max) + " > free " + std::to_string(free_bytes));
  PCC_ASSIGN(pc_devptr_t p, h.Alloc(max));
  // Touch both ends: the allocation must be real.
  const uint8_t pattern[4] = {1, 2, 3, 4};
  uint8_t back[4] = {};
  const uint64_t tail = max >= 4 ? max - 4 : 0;
  PCC_TRY(h.Upload(p + tail, pattern, std::min<uint64_t>(4, max)));
  PCC_TRY(h.Download(back, p + tail, std::min<uint64_t>(4, max)));
  if (std::memcmp(pattern, back, std::min<uint64_t>(4, max)) != 0)
    return Fail("last bytes of the max allocation do not round-trip");
  PCC_TRY(h.FreeAll());
  return Pass(std::to_string(max) + " bytes");
}

Verdict MemoryAsyncFree(Harness& h) {
  if (!PCC_HAS(h.api, mem_free_async)) return Skip("no mem_free_async (ASYNC_FREE absent)");
  pc_devptr_t p = 0;
  PCC_TRY(h.Take(h.api->mem_alloc(h.device, 1 << 16, &p), "mem_alloc"));
  PCC_TRY(h.Fill(p, 7, 1 << 16));
  PCC_TRY(h.Take(h.api->mem_free_async(h.stream, p), "mem_free_async"));
  PCC_TRY(h.Sync());
  return Pass();
}

Verdict MemoryHostAlloc(Harness& h) {
  if (!PCC_HAS(h.api, host_alloc)) return Skip("no host_alloc (optional)");
  void* host = nullptr;
  const uint64_t n = 65541;
  PCC_TRY(h.Take(h.api->host_alloc(h.device, n, &host), "host_alloc"));
  if (host == nullptr) return Fail("host_alloc returned NULL");
  std::vector<uint8_t> src = h.RandomBytes(n);
  std::memcpy(host, src.data(), n);
  auto dev = h.Alloc(n);
  std::vector<uint8_t> back(n);
  Status s = dev.ok() ? h.Upload(*dev, host, n) : dev.status();
  if (s.ok()) s = h.Download(back.data(), *dev, n);
  h.api->host_free(h.device, host);
  PCC_TRY(s);
  if (back != src) return Fail("copy through pinned memory differs");
  return Pass();
}

// A long dependent chain on one stream with a single synchronize at the end. A plugin that runs
// work out of order (or a copy before the op it depends on) gets a wrong answer here.
Verdict StreamOrdering(Harness& h) {
  const int kLinks = 64;
  const uint64_t n = 40001;
  std::vector<uint8_t> src = h.RandomBytes(n);
  std::vector<pc_devptr_t> bufs;
  for (int i = 0; i <= kLinks; ++i) {
    PCC_ASSIGN(pc_devptr_t p, h.Alloc(n));
    bufs.push_back(p);
  }
  PCC_TRY(h.Take(h.api->memcpy_h2d(h.stream, bufs[0], src.data(), n), "memcpy_h2d"));
  for (int i = 0; i < kLinks; ++i) {
    // Clear the next buffer then copy into it: reordering either step corrupts the result.
    PCC_TRY(h.Fill(bufs[i + 1], 0xEE, n));
    PCC_TRY(h.Take(h.api->memcpy_d2d(h.stream, bufs[i + 1], bufs[i], n), "memcpy_d2d"));
  }
  std::vector<uint8_t> back(n, 0);
  PCC_TRY(h.Take(h.api->memcpy_d2h(h.stream, back.data(), bufs[kLinks], n), "memcpy_d2h"));
  PCC_TRY(h.Sync());
  if (back != src) return Fail("a chain of " + std::to_string(kLinks) + " copies lost order");

  // Ops too: x += 1, 200 times, each reading the previous result.
  pc_op_query_t q{sizeof(pc_op_query_t), PC_OP_ADD,
                  {PC_DTYPE_F32, PC_DTYPE_INVALID, PC_DTYPE_INVALID, PC_DTYPE_INVALID},
                  PC_SHAPE_ANY};
  if (h.api->op_supports(h.device, &q) == 0) return Pass("copies only (ADD not claimed)");
  const int64_t m = 1023;
  const int kAdds = 200;
  std::vector<float> ones(m, 1.0f);
  PCC_ASSIGN(pc_devptr_t one, h.UploadVec(ones));
  PCC_ASSIGN(pc_devptr_t x, h.Alloc(m * sizeof(float)));
  PCC_TRY(h.Fill(x, 0, m * sizeof(float)));
  pc_add_args_t add{};
  add.struct_size = sizeof(add);
  add.a = x, add.b = one, add.out = x, add.n = m;
  for (int i = 0; i < kAdds; ++i) PCC_TRY(h.Take(h.api->op_launch(h.stream, PC_OP_ADD, &add), "ADD"));
  std::vector<float> result(m, 0.0f);
  PCC_TRY(h.Take(h.api->memcpy_d2h(h.stream, result.data(), x, m * sizeof(float)), "memcpy_d2h"));
  PCC_TRY(h.Sync());
  for (int64_t i = 0; i < m; ++i) {
    if (result[i] != kAdds)
      return Fail("after " + std::to_string(kAdds) + " in-place ADDs element " +
                  std::to_string(i) + " is " + std::to_string(result[i]));
  }
  return Pass(std::to_string(kLinks) + " copies, " + std::to_string(kAdds) + " ADDs");
}

// Stream B waits (stream_wait_event) for an event recorded on stream A after a long chain; only
// B is synchronized, so B's result is right only if the wait really orders the streams.
Verdict StreamEvents(Harness& h) {
  StreamGuard a{h.api}, b{h.api};
  PCC_TRY(h.Take(h.api->stream_create(h.device, h.props.priority_low, &a.s), "stream_create"));
  PCC_TRY(h.Take(h.api->stream_create(h.device, h.props.priority_low, &b.s), "stream_create"));
  EventGuard ev{h.api}, never{h.api};
  PCC_TRY(h.Take(h.api->event_create(h.device, &ev.e), "event_create"));
  PCC_TRY(h.Take(h.api->event_create(h.device, &never.e), "event_create"));

  const bool query = PCC_HAS(h.api, event_query);  // optional since ABI 1.5
  int32_t done = 0;
  if (query) {
    PCC_TRY(h.Take(h.api->event_query(never.e, &done), "event_query"));
    if (done != 1) return Fail("event_query of a never-recorded event must report done");
  }
  PCC_TRY(h.Take(h.api->event_synchronize(never.e), "event_synchronize(never recorded)"));

  const uint64_t n = 1 << 20;
  const int kLinks = 32;
  std::vector<uint8_t> src = h.RandomBytes(n);
  std::vector<pc_devptr_t> bufs;
  for (int i = 0; i <= kLinks + 1; ++i) {
    PCC_ASSIGN(pc_devptr_t p, h.Alloc(n));
    bufs.push_back(p);
  }
  PCC_TRY(h.Fill(bufs[kLinks + 1], 0, n));
  PCC_TRY(h.Sync());
  PCC_TRY(h.Take(h.api->memcpy_h2d(a.s, bufs[0], src.data(), n), "memcpy_h2d"));
  for (int i = 0; i < kLinks; ++i)
    PCC_TRY(h.Take(h.api->memcpy_d2d(a.s, bufs[i + 1], bufs[i], n), "memcpy_d2d"));
  PCC_TRY(h.Take(h.api->event_record(ev.e, a.s), "event_record"));
  PCC_TRY(h.Take(h.api->stream_wait_event(b.s, ev.e), "stream_wait_event"));
  PCC_TRY(h.Take(h.api->memcpy_d2d(b.s, bufs[kLinks + 1], bufs[kLinks], n), "memcpy_d2d"));
  std::vector<uint8_t> back(n, 0);
  PCC_TRY(h.Take(h.api->memcpy_d2h(b.s, back.data(), bufs[kLinks + 1], n), "memcpy_d2h"));
  PCC_TRY(h.Sync(b.s));
  if (back != src) return Fail("stream B ran before the event it waited for");
  // B finished after waiting for the event, so the event must be complete now.
  if (query) {
    PCC_TRY(h.Take(h.api->event_query(ev.e, &done), "event_query"));
    if (done != 1) return Fail("event not done although a stream that waited on it finished");
  }
  PCC_TRY(h.Sync(a.s));
  return Pass("cross-stream wait over " + std::to_string(kLinks) + " copies of 1 MiB" +
              (query ? "" : "; no event_query (optional)"));
}

// event_synchronize alone (no stream synchronize) makes earlier D2H results visible.
Verdict StreamEventSynchronize(Harness& h) {
  EventGuard ev{h.api};
  PCC_TRY(h.Take(h.api->event_create(h.device, &ev.e), "event_create"));
  const uint64_t n = 1 << 20;
  std::vector<uint8_t> src = h.RandomBytes(n), back(n, 0);
  PCC_ASSIGN(pc_devptr_t a, h.Alloc(n));
  PCC_ASSIGN(pc_devptr_t b, h.Alloc(n));
  PCC_TRY(h.Take(h.api->memcpy_h2d(h.stream, a, src.data(), n), "memcpy_h2d"));
  for (int i = 0; i < 8; ++i) {
    PCC_TRY(h.Take(h.api->memcpy_d2d(h.stream, b, a, n), "memcpy_d2d"));
    PCC_TRY(h.Take(h.api->memcpy_d2d(h.stream, a, b, n), "memcpy_d2d"));
  }
  PCC_TRY(h.Take(h.api->memcpy_d2h(h.stream, back.data(), a, n), "memcpy_d2h"));
  PCC_TRY(h.Take(h.api->event_record(ev.e, h.stream), "event_record"));
  PCC_TRY(h.Take(h.api->event_synchronize(ev.e), "event_synchronize"));
  if (back != src) return Fail("data not there after event_synchronize");
  if (!PCC_HAS(h.api, event_query)) return Pass("no event_query (optional)");
  int32_t done = 0;
  PCC_TRY(h.Take(h.api->event_query(ev.e, &done), "event_query"));
  if (done != 1) return Fail("event_query is 0 after event_synchronize");
  // Re-recording moves the mark: the event is done again once the stream drains.
  PCC_TRY(h.Take(h.api->event_record(ev.e, h.stream), "event_record"));
  PCC_TRY(h.Sync());
  PCC_TRY(h.Take(h.api->event_query(ev.e, &done), "event_query"));
  if (done != 1) return Fail("re-recorded event not done after stream_synchronize");
  return Pass();
}

Verdict StreamTiming(Harness& h) {
  const bool flag = (h.props.flags & PC_DEVICE_FLAG_TIMING) != 0;
  if (!flag || !PCC_HAS(h.api, event_elapsed_ms)) return Skip("TIMING not claimed");
  EventGuard start{h.api}, end{h.api};
  PCC_TRY(h.Take(h.api->event_create(h.device, &start.e), "event_create"));
  PCC_TRY(h.Take(h.api->event_create(h.device, &end.e), "event_create"));
  const uint64_t n = 4 << 20;
  PCC_ASSIGN(pc_devptr_t a, h.Alloc(n));
  PCC_TRY(h.Take(h.api->event_record(start.e, h.stream), "event_record"));
  for (int i = 0; i < 8; ++i) PCC_TRY(h.Fill(a, static_cast<uint8_t>(i), n));
  PCC_TRY(h.Take(h.api->event_record(end.e, h.stream), "event_record"));
  PCC_TRY(h.Take(h.api->event_synchronize(end.e), "event_synchronize"));
  float ms = -1;
  PCC_TRY(h.Take(h.api->event_elapsed_ms(start.e, end.e, &ms), "event_elapsed_ms"));
  if (!std::isfinite(ms) || ms < 0) return Fail("elapsed " + std::to_string(ms) + " ms");
  if (ms > 60000) return Fail("elapsed " + std::to_string(ms) + " ms for 32 MiB of memset");
  return Pass(std::to_string(ms) + " ms");
}

// Streams at both ends of the range and far outside it (clamped) are created and work.
Verdict StreamPriorities(Harness& h) {
  const int32_t lo = h.props.priority_low, hi = h.props.priority_high;
  const int32_t priorities[] = {lo, hi, (lo + hi) / 2, lo - 1000, hi + 1000, INT_MIN, INT_MAX};
  const uint64_t n = 333;
  PCC_ASSIGN(pc_devptr_t p, h.Alloc(n));
  for (int32_t prio : priorities) {
    StreamGuard s{h.api};
    PCC_TRY(h.Take(h.api->stream_create(h.device, prio, &s.s),
                   ("stream_create(priority " + std::to_string(prio) + ")").c_str()));
    std::vector<uint8_t> src = h.RandomBytes(n), back(n, 0);
    PCC_TRY(h.Take(h.api->memcpy_h2d(s.s, p, src.data(), n), "memcpy_h2d"));
    PCC_TRY(h.Take(h.api->memcpy_d2h(s.s, back.data(), p, n), "memcpy_d2h"));
    PCC_TRY(h.Sync(s.s));
    if (back != src) return Fail("stream of priority " + std::to_string(prio) + " misbehaves");
  }
  return Pass("range [" + std::to_string(lo) + ", " + std::to_string(hi) + "], clamping");
}

}  // namespace

void AddMemoryChecks(std::vector<Check>& checks) {
  checks.push_back({"memory.alloc_free", Stage::kDevice, MemoryAllocFree});
  checks.push_back({"memory.round_trip", Stage::kDevice, MemoryRoundTrip});
  checks.push_back({"memory.memset", Stage::kDevice, MemoryMemset});
  checks.push_back({"memory.many_allocs", Stage::kDevice, MemoryManyAllocs});
  checks.push_back({"memory.max_alloc", Stage::kDevice, MemoryMaxAlloc});
  checks.push_back({"memory.async_free", Stage::kDevice, MemoryAsyncFree});
  checks.push_back({"memory.host_alloc", Stage::kDevice, MemoryHostAlloc});
  checks.push_back({"stream.ordering", Stage::kDevice, StreamOrdering});
  checks.push_back({"stream.events", Stage::kDevice, StreamEvents});
  checks.push_back({"stream.event_synchronize", Stage::kDevice, StreamEventSynchronize});
  checks.push_back({"stream.timing", Stage::kDevice, StreamTiming});
  checks.push_back({"stream.priorities", Stage::kDevice, StreamPriorities});
}

}  // namespace polychip::runtime::conformance
