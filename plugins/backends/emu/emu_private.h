/*
 * The emu plugin's private interface for its own collective library (plugins/comm/emuccl), as a
 * vendor's CCL reaches its runtime (BKCL the XPU's, NCCL CUDA's) and never the framework. It is
 * not part of the polychip ABI: the framework never looks it up. Exported by
 * libpolychip_backend_emu.so as the symbol PC_EMU_PRIVATE_SYMBOL.
 */
#ifndef POLYCHIP_PLUGINS_EMU_PRIVATE_H_
#define POLYCHIP_PLUGINS_EMU_PRIVATE_H_

#include "polychip/plugin/pc_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PC_EMU_PRIVATE_SYMBOL "pc_emu_private"

typedef struct pc_emu_private {
  size_t struct_size;
  /* The host address of [ptr, ptr + bytes) when it lies inside one live allocation of the
   * stream's device, else NULL (a host pointer, another device's memory, a freed range).
   * [any thread] Valid until that allocation is freed. */
  void* (*translate)(pc_stream_t* stream, pc_devptr_t ptr, uint64_t bytes);
  /* Enqueues run(ctx) on `stream`: it runs once the stream's earlier work completed and before
   * its later work starts, on the stream's worker but outside the device's executor (as a wait
   * for an event does), so it may block on other processes without holding the device. A
   * non-NULL text it returns becomes the stream's error (reported by stream_synchronize).
   * release(ctx) (may be NULL) is called once after run. Returns 0, or -1 on a NULL argument.
   * [one thread per stream] */
  int32_t (*enqueue_host)(pc_stream_t* stream, const char* (*run)(void* ctx), void* ctx,
                          void (*release)(void* ctx));
  /* The ordinal of the stream's device. */
  int32_t (*device_ordinal)(pc_stream_t* stream);
} pc_emu_private_t;

typedef const pc_emu_private_t* (*pc_emu_private_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POLYCHIP_PLUGINS_EMU_PRIVATE_H_ */
