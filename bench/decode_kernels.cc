// The cpu plugin's decode-step kernels on their own, through the plugin's ops (cpu_ops.h) on its
// thread pool, with synthetic weights and caches (speed does not depend on the values):
//   decode_kernels matmul [STEPS]          the matmul sequence of one qwen2.5-0.5b Q4_K_M decode
//                                          step (Q5_0/Q8_0/Q6_K/Q4_K packed, m = 1, 169 calls,
//                                          ~396 MB), repeated; prints the median step's GB/s
//   decode_kernels attention LEN [HEADS]   one layer's decode attention at LEN positions (F16
//                                          cache, 2 KV heads of 64, HEADS query heads, default 14)
// Built and run by bench/decode-kernels.sh, which alternates the settings under test.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu_ops.h"
#include "polychip/sdk/quant.h"

namespace {

using polychip::cpu::OpContext;
using polychip::cpu::PackedFormat;

pc_devptr_t D(const void* p) { return reinterpret_cast<uintptr_t>(p); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Weights as the plugin allocates them (on 2 MiB pages with POLYCHIP_CPU_HUGE_PAGES=on), filled
// with a constant: packed bytes of any value are valid.
uint8_t* AllocWeights(int64_t bytes) {
  const char* e = std::getenv("POLYCHIP_CPU_HUGE_PAGES");
  const bool huge = e && std::strcmp(e, "on") == 0;
  void* p = nullptr;
  if (posix_memalign(&p, huge ? 2 << 20 : 64, bytes) != 0) std::abort();
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0x11, bytes);
  return static_cast<uint8_t*>(p);
}

int Matmuls(const OpContext& c, int steps) {
  struct Weight {
    pc_dtype_t dtype;
    int64_t n, k, bytes;
    uint8_t* data;
  };
  std::vector<Weight> ws;
  int64_t total = 0;
  const auto add = [&](pc_dtype_t t, int64_t n, int64_t k) {
    PackedFormat f;
    polychip::cpu::PackedFormatOf(t, &f);
    const int64_t bytes = polychip::cpu::PackedBytes(f, n, k);
    ws.push_back({t, n, k, bytes, AllocWeights(bytes)});
    total += bytes;
  };
  // qwen2.5-0.5b Q4_K_M: 896-wide rows fall back to Q5_0 (q, k, o, gate, up) and Q8_0 (v);
  // ffn_down alternates Q6_K and Q4_K; the tied output matrix is Q8_0.
  for (int l = 0; l < 24; ++l) {
    add(PC_DTYPE_Q5_0, 896, 896);
    add(PC_DTYPE_Q5_0, 128, 896);
    add(PC_DTYPE_Q8_0, 128, 896);
    add(PC_DTYPE_Q5_0, 896, 896);
    add(PC_DTYPE_Q5_0, 4864, 896);
    add(PC_DTYPE_Q5_0, 4864, 896);
    add(l % 2 ? PC_DTYPE_Q4_K : PC_DTYPE_Q6_K, 896, 4864);
  }
  add(PC_DTYPE_Q8_0, 151936, 896);
  std::vector<float> x(4864, 0.01f), out(151936);
  const auto step = [&] {
    for (const Weight& w : ws) {
      pc_matmul_args_t a{};
      a.struct_size = sizeof(a);
      a.x = D(x.data()), a.w = D(w.data), a.w_dtype = w.dtype;
      a.w_layout = polychip::cpu::kLayoutPacked;
      a.out = D(out.data()), a.m = 1, a.n = w.n, a.k = w.k, a.x_stride = w.k, a.out_stride = w.n;
      if (const char* e = polychip::cpu::Matmul(c, a)) {
        std::fprintf(stderr, "matmul: %s\n", e);
        std::exit(1);
      }
    }
  };
  step();  // first touch
  std::vector<double> t;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double m = Median(t);
  std::printf("matmul step: %.1f MB, median %.3f ms, %.2f GB/s\n", total / 1e6, m * 1e3,
              total / m / 1e9);
  return 0;
}

int Attention(const OpContext& c, int64_t len, int64_t n_heads) {
  const int64_t n_kv = 2, hd = 64, bs = 16, blocks = (len + bs - 1) / bs;
  std::vector<uint16_t> kc(blocks * bs * n_kv * hd), vc(kc.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : kc) v = polychip::sdk::Fp32ToFp16(u(rng));
  for (auto& v : vc) v = polychip::sdk::Fp32ToFp16(u(rng));
  std::vector<float> q(n_heads * hd), out(n_heads * hd);
  for (auto& v : q) v = u(rng);
  std::vector<int32_t> qstart = {0, 1}, lens = {static_cast<int32_t>(len)}, table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>((b * 5) % blocks);
  pc_attention_args_t a{sizeof(a), D(q.data()), D(kc.data()), D(vc.data()), D(out.data()),
                        D(qstart.data()), D(lens.data()), D(table.data()), PC_DTYPE_F16, 1, 1,
                        n_heads, n_kv, hd, bs, blocks, len, 0.125f};
  std::vector<double> t;
  for (int r = 0; r < 300; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (const char* e = polychip::cpu::Attention(c, a)) {
      std::fprintf(stderr, "attention: %s\n", e);
      return 1;
    }
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                    .count());
  }
  std::printf("attention: %ld positions, %ld query heads: median %.1f us per layer\n",
              static_cast<long>(len), static_cast<long>(n_heads), Median(t));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "matmul";
  const char* threads = std::getenv("THREADS");
  polychip::cpu::ThreadPool pool(threads ? std::atoi(threads) : 2);
  // The plugin's parameters from the same environment variables it reads.
  const char* streams = std::getenv("POLYCHIP_CPU_WEIGHT_STREAMS");
  const OpContext c{&pool, polychip::cpu::SelectKernels(std::getenv("POLYCHIP_CPU_ISA")),
                    streams ? std::atoi(streams) : 2};
  if (!c.k) {
    std::fprintf(stderr, "unknown or unsupported POLYCHIP_CPU_ISA\n");
    return 2;
  }
  if (what == "matmul") return Matmuls(c, argc > 2 ? std::atoi(argv[2]) : 20);
  if (what == "attention")
    return Attention(c, argc > 2 ? std::atoll(argv[2]) : 1024, argc > 3 ? std::atoll(argv[3]) : 14);
  std::fprintf(stderr, "usage: decode_kernels matmul [STEPS] | attention LEN [HEADS]\n");
  return 2;
}
