// The cpu plugin's decode-step kernels on their own, through the plugin's ops (cpu_ops.h) on its
// thread pool, with synthetic weights and caches (speed does not depend on the values):
//   decode_kernels matmul [STEPS]          the matmul sequence of one qwen2.5-0.5b Q4_K_M decode
//                                          step (Q5_0/Q8_0/Q6_K/Q4_K packed, m = 1, 169 calls,
//                                          ~396 MB), repeated; prints the median step's GB/s
//                                          (env MIX=q5_k_m or q6_k: those files' types instead)
//   decode_kernels matmul-vs-read [STEPS]  the same step alternated with a plain read of the
//                                          same weights: GB/s of both and their ratio, for the
//                                          step and per weight shape (dtype, n x k)
//   decode_kernels matmul-streams S1 S2 [STEPS]  the step with S1 and with S2 weight streams
//                                          per thread, alternated in one process (a suffix
//                                          n: without software prefetch, e.g. 1n)
//   decode_kernels matmul-hot [REPS]       each dtype's kernel on a matrix that stays in L2
//                                          (256 rows of 896, or 64 of 4864): its compute
//                                          speed in GB/s of weights, with no DRAM in the way
//   decode_kernels lora [STEPS]            that step alternated with the step with a LoRA
//                                          adapter's LORA launch after each matmul but the
//                                          output's (F16, RANK env, default 16; A and B in the
//                                          layouts weight_upload gives them): the adapter's cost
//                                          beside the step, with the LORA launches on one
//                                          thread (a pool of 1), and with a plain read of the
//                                          same bytes in their place (the floor: reading them
//                                          with no kernel)
//   decode_kernels attention LEN [HEADS]   one layer's decode attention at LEN positions (F16
//                                          cache, 2 KV heads of 64, HEADS query heads, default 14)
// Built and run by bench/decode-kernels.sh, which alternates the settings under test.
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu_ops.h"
#include "panel.h"
#include "polychip/sdk/quant.h"

namespace {

using polychip::cpu::OpContext;
using polychip::cpu::PackedFormat;
using polychip::cpu::StreamsTuner;

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

// Sums bytes [b, e) of p as 4 sequential streams with software prefetch 2 KiB ahead (the
// pattern bench/membw.c finds fastest), 32 bytes per load (AVX2: every x86-64 this bench's
// AVX-512 kernels run on has it).
__attribute__((target("avx2"))) uint64_t ReadRange(const uint8_t* p, int64_t b, int64_t e) {
  const int64_t len = (e - b) / 4 / 128 * 128;
  __m256i s0 = _mm256_setzero_si256(), s1 = s0;
  for (int64_t i = 0; i < len; i += 128) {
    for (int k = 0; k < 4; ++k) {
      const uint8_t* q = p + b + k * len + i;
      _mm_prefetch(reinterpret_cast<const char*>(q + 2048), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(q + 2048 + 64), _MM_HINT_T0);
      s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
      s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32)));
      s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64)));
      s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 96)));
    }
  }
  s0 = _mm256_add_epi64(s0, s1);
  uint64_t v[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(v), s0);
  return v[0] + v[1] + v[2] + v[3];
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A float [n, k] matrix as weight_upload stores it: panels from 32 rows, else as it is.
struct Uploaded {
  std::vector<uint8_t> bytes;
  uint32_t layout;
};
Uploaded UploadF16(int64_t n, int64_t k, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<uint16_t> gguf(n * k);
  for (auto& v : gguf) v = polychip::sdk::Fp32ToFp16(u(*rng));
  const auto* src = reinterpret_cast<const uint8_t*>(gguf.data());
  if (n < polychip::cpu::kPanelRows) return {{src, src + gguf.size() * 2}, PC_LAYOUT_GGUF};
  Uploaded w{std::vector<uint8_t>(polychip::cpu::PanelBytes(PC_DTYPE_F16, n, k)),
             polychip::cpu::kLayoutPanel};
  polychip::cpu::PackPanels(PC_DTYPE_F16, src, n, k, 0, (n + 31) / 32, w.bytes.data());
  return w;
}

// Mode lora: the matmul step (matmul(i) runs weight i's) alternated with the step with a LORA
// launch after each matmul but the last (the output), as a decode step interleaves them, the
// launches on c's pool and on a pool of one thread, and with a plain read of the same adapter
// bytes in their place (ReadRange, one thread): what reading them costs with no kernel at all.
template <typename Weights, typename Matmul>
int WithLora(const OpContext& c, const Weights& ws, int64_t rank, int steps, Matmul&& matmul) {
  std::mt19937 rng(1);
  std::vector<Uploaded> as, bs;
  int64_t bytes = 0;
  for (size_t i = 0; i + 1 < ws.size(); ++i) {
    as.push_back(UploadF16(rank, ws[i].k, &rng));
    bs.push_back(UploadF16(ws[i].n, rank, &rng));
    bytes += (ws[i].k + ws[i].n) * rank * 2;
  }
  std::vector<float> x(4864, 0.01f), out(4864);
  polychip::cpu::ThreadPool one(1);
  const OpContext single{&one, c.k, c.weight_streams, nullptr, c.weight_prefetch};
  // The step, with after(i) after matmul i but the output's, timed into after_seconds.
  double after_seconds = 0;
  const auto step = [&](auto&& after) {
    after_seconds = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
      matmul(i);
      if (i >= as.size()) continue;
      const auto t0 = std::chrono::steady_clock::now();
      after(i);
      after_seconds += Seconds(t0);
    }
  };
  const auto nothing = [](size_t) {};
  const auto launch = [&](const OpContext& ctx) {
    return [&](size_t i) {
      pc_lora_args_t a{};
      a.struct_size = sizeof(a);
      a.x = D(x.data()), a.out = D(out.data()), a.m = 1, a.n_rows = 1;
      a.k = ws[i].k, a.n = ws[i].n, a.rank = rank, a.scale = 0.5f;
      a.a = D(as[i].bytes.data()), a.a_dtype = PC_DTYPE_F16, a.a_layout = as[i].layout;
      a.b = D(bs[i].bytes.data()), a.b_dtype = PC_DTYPE_F16, a.b_layout = bs[i].layout;
      if (const char* e = polychip::cpu::Lora(ctx, a)) {
        std::fprintf(stderr, "lora: %s\n", e);
        std::exit(1);
      }
    };
  };
  uint64_t read_sum = 0;
  const auto plain_read = [&](size_t i) {
    for (const Uploaded* u : {&as[i], &bs[i]})
      read_sum += ReadRange(u->bytes.data(), 0, static_cast<int64_t>(u->bytes.size()));
  };
  std::vector<double> t_base, t_lora, t_one, only_lora, t_read, only_read;
  for (int s = 0; s < steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    step(nothing);
    t_base.push_back(Seconds(t0));
    t0 = std::chrono::steady_clock::now();
    step(launch(c));
    t_lora.push_back(Seconds(t0));
    only_lora.push_back(after_seconds);
    t0 = std::chrono::steady_clock::now();
    step(launch(single));
    t_one.push_back(Seconds(t0));
    t0 = std::chrono::steady_clock::now();
    step(plain_read);
    t_read.push_back(Seconds(t0));
    only_read.push_back(after_seconds);
  }
  const double base = Median(t_base);
  std::printf("%d alternations (medians): step %.3f ms; with a rank-%ld adapter (%.1f MB, %zu "
              "LORA launches) %.3f ms (+%.1f%%; the launches alone %.3f ms, %.1f GB/s), the "
              "launches on one thread %.3f ms (+%.1f%%)\n",
              steps, base * 1e3, static_cast<long>(rank), bytes / 1e6, as.size(),
              Median(t_lora) * 1e3, (Median(t_lora) / base - 1) * 100, Median(only_lora) * 1e3,
              bytes / Median(only_lora) / 1e9, Median(t_one) * 1e3,
              (Median(t_one) / base - 1) * 100);
  std::printf("  a plain read of the same bytes in their place %.3f ms (+%.1f%%; the reads alone "
              "%.3f ms, %.1f GB/s)\n",
              Median(t_read) * 1e3, (Median(t_read) / base - 1) * 100, Median(only_read) * 1e3,
              bytes / Median(only_read) / 1e9);
  __asm__ volatile("" : : "g"(read_sum) : "memory");  // the reads are not optimized away
  return 0;
}

// alt (mode matmul-streams): the same step with other weight streams, alternated with c's.
// lora_rank (mode lora): > 0 alternates the step with and without an adapter of that rank.
int Matmuls(const OpContext& c, int steps, bool vs_read, const OpContext* alt = nullptr,
            int64_t lora_rank = 0) {
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
  // qwen2.5-0.5b's files (MIX, default q4_k_m): its 896-wide rows do not take K-quants, so
  //   Q4_K_M: q, k, o, gate, up Q5_0, v Q8_0, ffn_down alternately Q6_K and Q4_K;
  //   Q5_K_M: the same with Q5_1 and ffn_down Q6_K;  Q6_K: Q8_0, ffn_down Q6_K;
  // the tied output matrix is Q8_0 in all three.
  const char* mix_env = std::getenv("MIX");
  const std::string mix = mix_env ? mix_env : "q4_k_m";
  const pc_dtype_t narrow = mix == "q6_k"     ? PC_DTYPE_Q8_0
                            : mix == "q5_k_m" ? PC_DTYPE_Q5_1
                                              : PC_DTYPE_Q5_0;
  for (int l = 0; l < 24; ++l) {
    add(narrow, 896, 896);
    add(narrow, 128, 896);
    add(PC_DTYPE_Q8_0, 128, 896);
    add(narrow, 896, 896);
    add(narrow, 4864, 896);
    add(narrow, 4864, 896);
    add(mix == "q4_k_m" && l % 2 ? PC_DTYPE_Q4_K : PC_DTYPE_Q6_K, 896, 4864);
  }
  add(PC_DTYPE_Q8_0, 151936, 896);
  std::vector<float> x(4864, 0.01f), out(151936);
  using Times = std::vector<std::vector<double>>;  // [weight][step] seconds
  const auto step_with = [&](const OpContext& ctx, Times* per_call) {
    for (size_t i = 0; i < ws.size(); ++i) {
      const Weight& w = ws[i];
      const auto t0 = std::chrono::steady_clock::now();
      pc_matmul_args_t a{};
      a.struct_size = sizeof(a);
      a.x = D(x.data()), a.w = D(w.data), a.w_dtype = w.dtype;
      a.w_layout = polychip::cpu::kLayoutPacked;
      a.out = D(out.data()), a.m = 1, a.n = w.n, a.k = w.k, a.x_stride = w.k, a.out_stride = w.n;
      if (const char* e = polychip::cpu::Matmul(ctx, a)) {
        std::fprintf(stderr, "matmul: %s\n", e);
        std::exit(1);
      }
      if (per_call) (*per_call)[i].push_back(Seconds(t0));
    }
  };
  const auto step = [&](Times* per_call) { step_with(c, per_call); };
  step(nullptr);  // first touch
  // The tuner's exploration, so that the timed steps read the way it chose (mode lora too: its
  // exploration during the timed steps made them noisier).
  for (int i = 0; c.streams_tuner && i < StreamsTuner::kRoundsPerCandidate *
                                             StreamsTuner::kCandidates; ++i)
    step(nullptr);
  if (lora_rank > 0) {
    return WithLora(c, ws, lora_rank, steps, [&](size_t i) {
      pc_matmul_args_t a{};
      a.struct_size = sizeof(a);
      a.x = D(x.data()), a.w = D(ws[i].data), a.w_dtype = ws[i].dtype;
      a.w_layout = polychip::cpu::kLayoutPacked;
      a.out = D(out.data()), a.m = 1, a.n = ws[i].n, a.k = ws[i].k, a.x_stride = ws[i].k;
      a.out_stride = ws[i].n;
      if (const char* e = polychip::cpu::Matmul(c, a)) {
        std::fprintf(stderr, "matmul: %s\n", e);
        std::exit(1);
      }
    });
  }
  if (alt) {  // in-process alternation: the VM's bandwidth drifts too much between processes
    std::vector<double> ta, tb, ratio;
    for (int s = 0; s < steps; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      step_with(c, nullptr);
      ta.push_back(Seconds(t0));
      t0 = std::chrono::steady_clock::now();
      step_with(*alt, nullptr);
      tb.push_back(Seconds(t0));
      ratio.push_back(ta.back() / tb.back());
    }
    std::printf("%d alternations (medians): streams %d%s %.2f GB/s, streams %d%s %.2f GB/s, "
                "speed ratio (second / first) %.3f\n",
                steps, c.weight_streams, c.weight_prefetch ? "" : " (no prefetch)",
                total / Median(ta) / 1e9, alt->weight_streams,
                alt->weight_prefetch ? "" : " (no prefetch)", total / Median(tb) / 1e9,
                Median(ratio));
    return 0;
  }
  if (!vs_read) {
    std::vector<double> t;
    for (int s = 0; s < steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      step(nullptr);
      t.push_back(Seconds(t0));
    }
    const double m = Median(t);
    std::printf("matmul step: %.1f MB, median %.3f ms, %.2f GB/s\n", total / 1e6, m * 1e3,
                total / m / 1e9);
    return 0;
  }
  // Each matmul step alternates with a plain read of the same weights, one parallel section per
  // weight as the matmuls (each thread reads its half), and with the same read in a single
  // section (no join between weights): the bandwidth of a shared VM drifts by a third within
  // seconds, so only figures taken moments apart compare. The per-call times give each shape's
  // speed beside a plain read of its own bytes.
  const int n_threads = c.pool->size();
  std::vector<uint64_t> sums(n_threads * 8);  // one cache line per thread
  const auto read_part = [&](const Weight& w, int64_t t) {
    sums[t * 8] += ReadRange(w.data, w.bytes * t / n_threads / 64 * 64,
                             w.bytes * (t + 1) / n_threads / 64 * 64);
  };
  const auto read = [&](Times* per_call) {
    for (size_t i = 0; i < ws.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      c.pool->Run(n_threads, [&](int64_t t) { read_part(ws[i], t); });
      (*per_call)[i].push_back(Seconds(t0));
    }
  };
  const auto read_one_section = [&] {
    c.pool->Run(n_threads, [&](int64_t t) {
      for (const Weight& w : ws) read_part(w, t);
    });
  };
  Times mm_calls(ws.size()), read_calls(ws.size());
  std::vector<double> t_mm, t_read, t_one, ratio;
  for (int s = 0; s < steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    step(&mm_calls);
    t_mm.push_back(Seconds(t0));
    t0 = std::chrono::steady_clock::now();
    read(&read_calls);
    t_read.push_back(Seconds(t0));
    t0 = std::chrono::steady_clock::now();
    read_one_section();
    t_one.push_back(Seconds(t0));
    ratio.push_back(t_read.back() / t_mm.back());
  }
  std::printf("%d alternations (medians): matmul step %.2f GB/s, plain read of the same weights "
              "%.2f GB/s (%.2f GB/s in one section), matmul / read %.3f\n",
              steps, total / Median(t_mm) / 1e9, total / Median(t_read) / 1e9,
              total / Median(t_one) / 1e9, Median(ratio));
  struct Shape {
    double read = 0, matmul = 0;
    int64_t bytes = 0;
  };
  std::map<std::string, Shape> shapes;
  for (size_t i = 0; i < ws.size(); ++i) {
    const std::string name = polychip::sdk::GetDtypeInfo(ws[i].dtype)->name;
    Shape& sh = shapes[name + " " + std::to_string(ws[i].n) + "x" + std::to_string(ws[i].k)];
    sh.read += Median(read_calls[i]);
    sh.matmul += Median(mm_calls[i]);
    sh.bytes += ws[i].bytes;
  }
  for (const auto& [name, sh] : shapes)
    std::printf("  %-18s %6.1f MB  read %6.2f GB/s  matmul %6.2f GB/s  matmul / read %.2f\n",
                name.c_str(), sh.bytes / 1e6, sh.bytes / sh.read / 1e9, sh.bytes / sh.matmul / 1e9,
                sh.read / sh.matmul);
  return static_cast<int>(sums[0] & 0);  // used, so the reads are not optimized away
}

// Per dtype, m = 1 matmuls over one small matrix again and again (both threads' halves stay in
// their L2): how many GB/s of weights each kernel can consume when memory is not the limit. A
// format whose figure is not well above the read bandwidth cannot stream at that bandwidth.
int MatmulsHot(const OpContext& c, int reps) {
  const pc_dtype_t types[] = {PC_DTYPE_Q4_0, PC_DTYPE_Q4_1, PC_DTYPE_Q5_0, PC_DTYPE_Q5_1,
                              PC_DTYPE_Q8_0, PC_DTYPE_Q4_K, PC_DTYPE_Q5_K, PC_DTYPE_Q6_K,
                              PC_DTYPE_Q3_K, PC_DTYPE_Q2_K, PC_DTYPE_IQ4_XS};
  std::vector<float> x(4864, 0.01f), out(4864);
  for (const pc_dtype_t t : types) {
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{256, 896}, {64, 4864}}) {
      if (k % 256 && polychip::sdk::GetDtypeInfo(t)->block_elems == 256) continue;
      PackedFormat f;
      polychip::cpu::PackedFormatOf(t, &f);
      const int64_t bytes = polychip::cpu::PackedBytes(f, n, k);
      uint8_t* w = AllocWeights(bytes);
      pc_matmul_args_t a{};
      a.struct_size = sizeof(a);
      a.x = D(x.data()), a.w = D(w), a.w_dtype = t, a.w_layout = polychip::cpu::kLayoutPacked;
      a.out = D(out.data()), a.m = 1, a.n = n, a.k = k, a.x_stride = k, a.out_stride = n;
      std::vector<double> per;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 50; ++i) {
          if (const char* e = polychip::cpu::Matmul(c, a)) {
            std::fprintf(stderr, "matmul: %s\n", e);
            return 1;
          }
        }
        per.push_back(Seconds(t0) / 50);
      }
      std::printf("  %-7s %5ldx%-5ld %7.1f KB  %6.2f GB/s  %6.2f us/call\n",
                  polychip::sdk::GetDtypeInfo(t)->name, static_cast<long>(n),
                  static_cast<long>(k), bytes / 1e3, bytes / Median(per) / 1e9, Median(per) * 1e6);
      std::free(w);
    }
  }
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
  a.v_cache_dtype = PC_DTYPE_F16;  // (ABI 1.6) a zero here would read V as F32, past its end
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
  // POLYCHIP_CPU_WEIGHT_STREAMS unset or auto: the plugin's tuner picks (streams_tuner.h).
  const char* streams = std::getenv("POLYCHIP_CPU_WEIGHT_STREAMS");
  const bool fixed = streams && std::string(streams) != "auto";
  const char* prefetch = std::getenv("POLYCHIP_CPU_WEIGHT_PREFETCH");
  StreamsTuner tuner;
  const OpContext c{&pool, polychip::cpu::SelectKernels(std::getenv("POLYCHIP_CPU_ISA")),
                    fixed ? std::atoi(streams) : 3, fixed ? nullptr : &tuner,
                    !prefetch || std::string(prefetch) != "off"};
  if (!c.k) {
    std::fprintf(stderr, "unknown or unsupported POLYCHIP_CPU_ISA\n");
    return 2;
  }
  if (what == "matmul" || what == "matmul-vs-read")
    return Matmuls(c, argc > 2 ? std::atoi(argv[2]) : 20, what == "matmul-vs-read");
  if (what == "matmul-streams" && argc > 3) {  // matmul-streams S1 S2 [STEPS]
    // "1n": one stream without software prefetch.
    const auto read = [&](const char* s) {
      return OpContext{&pool, c.k, std::atoi(s), nullptr, std::strchr(s, 'n') == nullptr};
    };
    const OpContext a = read(argv[2]), b = read(argv[3]);
    return Matmuls(a, argc > 4 ? std::atoi(argv[4]) : 40, false, &b);
  }
  if (what == "lora") {
    const char* rank = std::getenv("RANK");
    return Matmuls(c, argc > 2 ? std::atoi(argv[2]) : 20, false, nullptr,
                   rank ? std::atoll(rank) : 16);
  }
  if (what == "matmul-hot") return MatmulsHot(c, argc > 2 ? std::atoi(argv[2]) : 40);
  if (what == "attention")
    return Attention(c, argc > 2 ? std::atoll(argv[2]) : 1024, argc > 3 ? std::atoll(argv[3]) : 14);
  std::fprintf(stderr,
               "usage: decode_kernels matmul[-vs-read] [STEPS] | matmul-streams S1 S2 [STEPS] | "
               "matmul-hot [REPS] | lora [STEPS] | attention LEN [HEADS]\n");
  return 2;
}
