/*
 * polychip plugin ABI — the comm (collective communication) plugin table, NCCL-shaped.
 *
 * A comm plugin is a shared library named libpolychip_comm_<name>.so exporting:
 *
 *   PC_EXPORT void pc_comm_probe(pc_probe_result_t* result);                    (optional)
 *   PC_EXPORT const pc_comm_iface_t* pc_comm_get_api(uint32_t host_abi_major,
 *                                                      uint32_t host_abi_minor,
 *                                                      const pc_host_services_t* host);
 *
 * Bootstrap: rank 0 calls get_unique_id and publishes the bytes through the host's kv_set;
 * the other ranks kv_get them; every rank then calls comm_init_rank with the same id. Creation
 * that cannot complete (a rank missing) fails with UNAVAILABLE after timeout_ms, never hangs.
 *
 * Memory: `memory_kind` says which buffers the collectives read and write directly. A plugin
 * of kind PC_COMM_MEMORY_HOST takes host pointers; one of kind PC_COMM_MEMORY_DEVICE takes
 * device addresses (pc_devptr_t cast to void*) of the device plugin named by device_plugin
 * (as XCCL reads Kunlun XPU memory). Otherwise the framework stages through host memory.
 *
 * Streams: collectives take the device plugin's stream (void*, may be NULL). A host-memory
 * plugin ignores it and completes the collective before returning.
 */
#ifndef POLYCHIP_PLUGIN_PC_COMM_H_
#define POLYCHIP_PLUGIN_PC_COMM_H_

#include "polychip/plugin/pc_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pc_comm pc_comm_t;

#define PC_COMM_UNIQUE_ID_BYTES 128
typedef struct pc_comm_unique_id {
  char bytes[PC_COMM_UNIQUE_ID_BYTES];
} pc_comm_unique_id_t;

typedef enum pc_reduce_op {
  PC_REDUCE_SUM = 0,
  PC_REDUCE_MAX = 1,
  PC_REDUCE_MIN = 2,
  PC_REDUCE_PROD = 3,
} pc_reduce_op_t;

typedef enum pc_comm_memory_kind {
  PC_COMM_MEMORY_HOST = 0,
  PC_COMM_MEMORY_DEVICE = 1,
} pc_comm_memory_kind_t;

/* Which processes one communicator can join (1.3). The framework's per-group choice of comm
 * plugin reads it: a group whose ranks sit on several hosts needs PC_COMM_REACH_CROSSES_HOSTS. */
typedef enum pc_comm_reach {
  PC_COMM_REACH_UNKNOWN = 0,       /* not declared (a plugin older than 1.3 reads as this) */
  PC_COMM_REACH_ONE_HOST = 1,      /* only processes of one host (e.g. shared memory) */
  PC_COMM_REACH_CROSSES_HOSTS = 2, /* processes on different hosts (a network transport) */
} pc_comm_reach_t;

typedef struct pc_comm_iface {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* name;    /* [required] e.g. "shm", "mpi"; static */
  const char* version; /* [required] static */
  pc_comm_memory_kind_t memory_kind;
  const char* device_plugin; /* with PC_COMM_MEMORY_DEVICE: the backend name, else NULL */

  /* ---- errors (as in pc_backend_iface) ---------------------------------------------------- */
  pc_code_t (*error_code)(const pc_error_t* error);      /* [required] */
  const char* (*error_message)(const pc_error_t* error); /* [required] */
  void (*error_destroy)(pc_error_t* error);              /* [required] */

  /* ---- lifetime --------------------------------------------------------------------------- */
  /* [required][sync] params: e.g. {"protocol","ring"}, {"buffer_bytes","4194304"},
   * {"timeout_ms","30000"}. */
  pc_error_t* (*initialize)(const pc_param_t* params, size_t n_params);
  void (*shutdown)(void); /* [required][sync] */

  /* ---- communicators ---------------------------------------------------------------------- */
  /* [required][sync] Called on one rank; the bytes are then shared through the host KV store. */
  pc_error_t* (*get_unique_id)(pc_comm_unique_id_t* id);
  /* [required][sync] Collective over n_ranks processes; UNAVAILABLE after timeout_ms if a rank
   * never arrives. */
  pc_error_t* (*comm_init_rank)(const pc_comm_unique_id_t* id, int32_t n_ranks, int32_t rank,
                                int64_t timeout_ms, pc_comm_t** out);
  /* [required][sync] Collective over `comm`: ranks with the same color form a sub-communicator,
   * ordered by key. color < 0: this rank joins none (*out = NULL). A rank may belong to several
   * sub-communicators at once (a TP group and a PP group). */
  pc_error_t* (*comm_split)(pc_comm_t* comm, int32_t color, int32_t key, pc_comm_t** out);
  pc_error_t* (*comm_destroy)(pc_comm_t* comm); /* [required][sync] */
  /* [required][any thread] Makes every pending and future operation on comm fail with
   * CANCELLED; used when a peer died. */
  void (*comm_abort)(pc_comm_t* comm);
  pc_error_t* (*comm_rank)(const pc_comm_t* comm, int32_t* rank);   /* [required] */
  pc_error_t* (*comm_size)(const pc_comm_t* comm, int32_t* n_ranks); /* [required] */

  /* ---- collectives ([stream] for device-memory plugins, else [sync]) ---------------------- */
  /* Errors: a peer that died or timed out yields UNAVAILABLE with its rank in the message. */
  pc_error_t* (*all_reduce)(pc_comm_t* comm, const void* send, void* recv, uint64_t count,
                            pc_dtype_t dtype, pc_reduce_op_t op, void* stream);
  /* recv holds n_ranks * count elements, rank-major. */
  pc_error_t* (*all_gather)(pc_comm_t* comm, const void* send, void* recv, uint64_t count,
                            pc_dtype_t dtype, void* stream);
  /* send holds n_ranks * recv_count elements; rank r receives the reduced r-th slice. */
  pc_error_t* (*reduce_scatter)(pc_comm_t* comm, const void* send, void* recv,
                                uint64_t recv_count, pc_dtype_t dtype, pc_reduce_op_t op,
                                void* stream);
  pc_error_t* (*broadcast)(pc_comm_t* comm, const void* send, void* recv, uint64_t count,
                           pc_dtype_t dtype, int32_t root, void* stream);
  pc_error_t* (*send)(pc_comm_t* comm, const void* buf, uint64_t count, pc_dtype_t dtype,
                      int32_t peer, void* stream);
  pc_error_t* (*recv)(pc_comm_t* comm, void* buf, uint64_t count, pc_dtype_t dtype,
                      int32_t peer, void* stream);
  pc_error_t* (*barrier)(pc_comm_t* comm, void* stream);
  /* [optional] Operations between group_start and group_end may be fused and are issued
   * together (needed to pair sends and receives without deadlock). */
  pc_error_t* (*group_start)(void);
  pc_error_t* (*group_end)(void);

  /* ---- since 1.1 (read with PC_HAS_MEMBER) ------------------------------------------------ */
  /* [optional][sync] After initialize: the bytes of buffers one communicator of n_ranks takes in
   * this process, in the memory of memory_kind (host memory, or device_plugin's device), with
   * the current params; a segment shared by the ranks of a host is counted whole. The framework
   * leaves this room when it sizes the KV cache from free memory. NULL: unknown (counted 0). */
  pc_error_t* (*comm_buffer_bytes)(int32_t n_ranks, uint64_t* bytes);

  /* ---- since 1.3 (read with PC_HAS_MEMBER) ------------------------------------------------ */
  /* [optional][static] Whether the ranks of one communicator may sit on different hosts. The
   * framework's default choice of plugin per group reads it (with memory_kind and the probe's
   * score; never the name). A table without the member (a 1.2 or older plugin), or
   * PC_COMM_REACH_UNKNOWN, is taken to cross hosts and is passed over for one-host groups when
   * a plugin declaring PC_COMM_REACH_ONE_HOST is found. */
  pc_comm_reach_t reach;
} pc_comm_iface_t;

typedef void (*pc_comm_probe_fn)(pc_probe_result_t* result);
typedef const pc_comm_iface_t* (*pc_comm_get_api_fn)(uint32_t host_abi_major,
                                                     uint32_t host_abi_minor,
                                                     const pc_host_services_t* host);

#define PC_COMM_PROBE_SYMBOL "pc_comm_probe"
#define PC_COMM_GET_API_SYMBOL "pc_comm_get_api"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POLYCHIP_PLUGIN_PC_COMM_H_ */
