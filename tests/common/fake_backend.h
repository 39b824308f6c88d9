// A small fake device plugin for the runtime tests: host memory behind opaque addresses,
// alignment 4096, max single allocation 64 MiB, no async free, two devices. Streams execute
// at once unless paused (FakeSetPaused), which lets tests hold events incomplete.
// Built into the test executable (registered from code) and, with FAKE_PLUGIN_* defines, as
// the deliberately broken MODULE plugins.
#pragma once

#include <cstdint>

#include "polychip/plugin/pc_backend.h"

struct FakeStats {
  int64_t live_allocs;
  int64_t alloc_calls;
  int64_t free_calls;
  int64_t errors_created;
  int64_t errors_destroyed;
  uint64_t bytes_in_use;
  int32_t initialized;
  char last_params[256];  // "k=v;k=v"
};

extern "C" {
const pc_backend_iface_t* FakeBackendTable();
FakeStats* FakeGetStats();
void FakeSetPaused(int paused);   // paused: recorded events stay incomplete until unpaused
void FakeSetMemory(uint64_t total_bytes);  // device memory capacity (default 256 MiB)
}
