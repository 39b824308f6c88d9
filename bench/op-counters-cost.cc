// What the per-op counters cost a launch: two clock reads, OpWorkOf and OpCounterTable::Record
// (include/polychip/sdk/op_counters.h) as a plugin runs them around every op, timed over many
// iterations for a decode-shaped MATMUL and ATTENTION. Built and run by
// bench/op-counters-overhead.sh, which multiplies it by the launches of a decode step.
#include <chrono>
#include <cstdio>
#include <vector>

#include "polychip/sdk/op_counters.h"

namespace sdk = polychip::sdk;

// Device memory is host memory here, as on the cpu plugin.
void* Identity(void*, pc_devptr_t p, uint64_t) { return reinterpret_cast<void*>(p); }

template <typename Args>
double NsPerLaunch(pc_op_t op, const Args& a, sdk::OpCounterTable* table) {
  sdk::DeviceMemory mem;
  mem.to_host = Identity;
  const int n = 2000000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    const uint64_t start = sdk::OpCounterTable::Now();
    table->Record(op, sdk::OpCounterTable::Now() - start, sdk::OpWorkOf(op, &a, &mem));
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         n;
}

int main() {
  sdk::OpCounterTable table;
  pc_matmul_args_t mm{};
  mm.struct_size = sizeof(mm);
  mm.w_dtype = PC_DTYPE_Q4_0;
  mm.m = 1, mm.n = 896, mm.k = 896, mm.x_stride = 896, mm.out_stride = 896;
  mm.x = mm.w = mm.out = 64;  // never dereferenced
  std::vector<int32_t> seq_lens = {300}, starts = {0, 1};
  pc_attention_args_t at{};
  at.struct_size = sizeof(at);
  at.cache_dtype = PC_DTYPE_F16;
  at.n_tokens = 1, at.n_seqs = 1, at.n_heads = 14, at.n_kv_heads = 2, at.head_dim = 64;
  at.block_size = 16, at.max_blocks_per_seq = 32, at.max_seq_len = 512;
  at.q = at.k_cache = at.v_cache = at.out = at.block_tables = 64;
  at.seq_lens = reinterpret_cast<pc_devptr_t>(seq_lens.data());
  at.query_start = reinterpret_cast<pc_devptr_t>(starts.data());
  std::printf("matmul    %.1f ns per launch\n", NsPerLaunch(PC_OP_MATMUL, mm, &table));
  std::printf("attention %.1f ns per launch\n", NsPerLaunch(PC_OP_ATTENTION, at, &table));
  pc_op_counters_t out[16];
  out[0].struct_size = sizeof(pc_op_counters_t);
  const int reads = 1000000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reads; ++i) table.Read(out, 16);
  std::printf("op_counters_read %.1f ns per call\n",
              std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0)
                      .count() /
                  reads);
  return 0;
}
