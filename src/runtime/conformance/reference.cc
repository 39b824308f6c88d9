// Plain reference ops for the conformance kit: the definitions of pc_ops.h, in double.
#include "runtime/conformance/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace polychip::runtime::conformance::ref {

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = (bits >> 16) & 0x8000;
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // 65520 is the halfway point to infinity
  if (a < 6.103515625e-05f) {               // below 2^-14: subnormal, units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));  // exact scaling
  }
  int e;
  std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1): the exponent of a is e - 1
  int exponent = e - 1;
  double mant = std::nearbyint(std::ldexp(static_cast<double>(a), 10 - exponent));  // [1024, 2048]
  if (mant == 2048.0) {
    mant = 1024.0;
    ++exponent;
  }
  if (exponent > 15) return sign | 0x7c00;
  return sign | static_cast<uint16_t>(((exponent + 15) << 10) | (static_cast<int>(mant) - 1024));
}

float F16ToF32(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exponent == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<double>(mant + 1024), exponent - 25);
  }
  return static_cast<float>((h & 0x8000) ? -v : v);
}

uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even on the dropped 16 bits
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToF32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::vector<float> Embedding(const std::vector<float>& table, int64_t row_len,
                             const std::vector<int32_t>& ids) {
  std::vector<float> out(ids.size() * row_len);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t c = 0; c < row_len; ++c) out[i * row_len + c] = table[ids[i] * row_len + c];
  }
  return out;
}

std::vector<float> RmsNorm(const std::vector<float>& x, const std::vector<float>& weight,
                           int64_t n_rows, int64_t dim, float eps) {
  std::vector<float> out(n_rows * dim);
  for (int64_t r = 0; r < n_rows; ++r) {
    double sum_sq = 0;
    for (int64_t c = 0; c < dim; ++c) sum_sq += double(x[r * dim + c]) * x[r * dim + c];
    const double inv = 1.0 / std::sqrt(sum_sq / dim + eps);
    for (int64_t c = 0; c < dim; ++c) {
      const double w = weight.empty() ? 1.0 : weight[c];
      out[r * dim + c] = static_cast<float>(x[r * dim + c] * inv * w);
    }
  }
  return out;
}

void Matmul(const std::vector<float>& x, int64_t x_stride, const std::vector<float>& w,
            const std::vector<float>& bias, int64_t m, int64_t n, int64_t k, bool accumulate,
            std::vector<float>& out, int64_t out_stride) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < k; ++c) acc += double(x[i * x_stride + c]) * w[j * k + c];
      if (!bias.empty()) acc += bias[j];
      if (accumulate) acc += out[i * out_stride + j];
      out[i * out_stride + j] = static_cast<float>(acc);
    }
  }
}

void Lora(const std::vector<float>& x, const std::vector<float>& a, const std::vector<float>& b,
          const std::vector<int32_t>& rows, int64_t k, int64_t n, int64_t rank, float scale,
          std::vector<float>& out) {
  std::vector<double> t(rank);
  for (int32_t r : rows) {
    for (int64_t j = 0; j < rank; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < k; ++c) acc += double(x[r * k + c]) * a[j * k + c];
      t[j] = scale * acc;
    }
    for (int64_t j = 0; j < n; ++j) {
      double acc = out[r * n + j];
      for (int64_t q = 0; q < rank; ++q) acc += t[q] * b[j * rank + q];
      out[r * n + j] = static_cast<float>(acc);
    }
  }
}

namespace {

// YaRN: the dimension (pair index) at which the wavelength equals n_ctx_orig / n_rotations.
double YarnCorrDim(int n_rot, int n_ctx_orig, double n_rotations, double base) {
  return n_rot * std::log(n_ctx_orig / (n_rotations * 2 * M_PI)) / (2 * std::log(base));
}

}  // namespace

void Rope(std::vector<float>& x, const std::vector<int32_t>& positions,
          const std::vector<float>& freq_factors, const RopeParams& p) {
  double low = 0, high = 0;
  if (p.ext_factor != 0) {
    low = std::max(0.0, std::floor(YarnCorrDim(p.n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base)));
    high = std::min(double(p.n_rot - 1),
                    std::ceil(YarnCorrDim(p.n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base)));
  }
  const int64_t half = p.n_rot / 2;
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    for (int64_t h = 0; h < p.n_heads; ++h) {
      float* row = &x[(t * p.n_heads + h) * p.head_dim];
      for (int64_t i = 0; i < half; ++i) {
        double theta_extrap = positions[t] * std::pow(double(p.freq_base), -2.0 * i / p.n_rot);
        if (!freq_factors.empty()) theta_extrap /= freq_factors[i];
        const double theta_interp = p.freq_scale * theta_extrap;
        double theta = theta_interp;
        double mscale = p.attn_factor;
        if (p.ext_factor != 0) {
          const double y = (i - low) / std::max(0.001, high - low);
          const double ramp_mix = (1 - std::min(1.0, std::max(0.0, y))) * p.ext_factor;
          theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
          mscale *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);
        }
        const double c = std::cos(theta) * mscale, s = std::sin(theta) * mscale;
        const int64_t i0 = p.neox ? i : 2 * i;
        const int64_t i1 = p.neox ? i + half : 2 * i + 1;
        const double x0 = row[i0], x1 = row[i1];
        row[i0] = static_cast<float>(x0 * c - x1 * s);
        row[i1] = static_cast<float>(x0 * s + x1 * c);
      }
    }
  }
}

std::vector<float> Attention(const std::vector<float>& q, const std::vector<float>& k_cache,
                             const std::vector<float>& v_cache,
                             const std::vector<int32_t>& query_start,
                             const std::vector<int32_t>& seq_lens,
                             const std::vector<int32_t>& block_tables, const AttentionShape& s) {
  std::vector<float> out(q.size(), 0.0f);
  const int64_t group = s.n_heads / s.n_kv_heads;
  const int64_t d = s.head_dim;
  for (size_t seq = 0; seq < seq_lens.size(); ++seq) {
    const int64_t n_q = query_start[seq + 1] - query_start[seq];
    for (int64_t j = 0; j < n_q; ++j) {
      const int64_t token = query_start[seq] + j;
      const int64_t pos = seq_lens[seq] - n_q + j;
      for (int64_t h = 0; h < s.n_heads; ++h) {
        const int64_t kvh = h / group;
        const float* qrow = &q[(token * s.n_heads + h) * d];
        // Cache row of position t for this KV head.
        auto cache_row = [&](int64_t t) {
          const int64_t block = block_tables[seq * s.max_blocks_per_seq + t / s.block_size];
          const int64_t slot = block * s.block_size + t % s.block_size;
          return (slot * s.n_kv_heads + kvh) * d;
        };
        const int64_t first = s.window > 0 ? std::max<int64_t>(0, pos - s.window + 1) : 0;
        std::vector<double> scores(pos + 1, -INFINITY);  // exp(-inf) = 0 outside the window
        double max_score = -INFINITY;
        for (int64_t t = first; t <= pos; ++t) {
          const int64_t base = cache_row(t);
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += double(qrow[c]) * k_cache[base + c];
          scores[t] = dot * s.scale;
          max_score = std::max(max_score, scores[t]);
        }
        double denom = 0;
        for (double& sc : scores) denom += (sc = std::exp(sc - max_score));
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t t = first; t <= pos; ++t) acc += scores[t] * v_cache[cache_row(t) + c];
          out[(token * s.n_heads + h) * d + c] = static_cast<float>(acc / denom);
        }
      }
    }
  }
  return out;
}

std::vector<float> Geglu(const std::vector<float>& gate, const std::vector<float>& up) {
  std::vector<float> out(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double u = std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
    out[i] = static_cast<float>(0.5 * g * (1.0 + std::tanh(u)) * up[i]);
  }
  return out;
}

std::vector<float> Swiglu(const std::vector<float>& gate, const std::vector<float>& up) {
  std::vector<float> out(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
  return out;
}

std::vector<float> Add(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = static_cast<float>(double(a[i]) + b[i]);
  return out;
}

namespace {

// y [rows] += scale B_e (A_e v) for expert e of a low-rank term (ref::MoeLowRank).
void AddLowRank(const MoeLowRank* low, int p, int64_t e, const double* v, int64_t rows,
                int64_t cols, double* y) {
  if (low == nullptr || low->a[p].empty()) return;
  const int64_t r = low->rank[p];
  std::vector<double> t(r, 0.0);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t k = 0; k < cols; ++k) t[i] += low->a[p][(e * r + i) * cols + k] * v[k];
  for (int64_t j = 0; j < rows; ++j) {
    double sum = 0;
    for (int64_t i = 0; i < r; ++i) sum += low->b[p][(e * rows + j) * r + i] * t[i];
    y[j] += low->scale[p] * sum;
  }
}

}  // namespace

void Moe(const std::vector<float>& x, const std::vector<float>& logits,
         const std::vector<float>& gate, const std::vector<float>& up,
         const std::vector<float>& down, const MoeShape& s, std::vector<float>& out,
         const MoeLowRank* low) {
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    const float* lt = &logits[t * s.n_experts];
    // Experts ordered by descending logit (= descending probability), ties by index.
    std::vector<int64_t> order(s.n_experts);
    for (int64_t e = 0; e < s.n_experts; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(),
                     [lt](int64_t a, int64_t b) { return lt[a] > lt[b]; });
    double max_logit = lt[order[0]], denom = 0;
    for (int64_t e = 0; e < s.n_experts; ++e) denom += std::exp(lt[e] - max_logit);
    std::vector<double> w(s.n_used);
    double sum = 0;
    for (int64_t j = 0; j < s.n_used; ++j) {
      w[j] = std::exp(lt[order[j]] - max_logit) / denom;
      sum += w[j];
    }
    if (s.norm_weights) {
      for (double& v : w) v /= std::max(sum, 6.103515625e-5);
    }
    std::vector<double> y(s.n_embd, 0.0);
    for (int64_t j = 0; j < s.n_used; ++j) {
      const int64_t e = order[j];
      std::vector<double> xt(x.begin() + t * s.n_embd, x.begin() + (t + 1) * s.n_embd);
      std::vector<double> g(s.n_ff, 0.0), u(s.n_ff, 0.0), hidden(s.n_ff), d(s.n_embd, 0.0);
      for (int64_t r = 0; r < s.n_ff; ++r) {
        for (int64_t k = 0; k < s.n_embd; ++k) {
          g[r] += xt[k] * gate[(e * s.n_ff + r) * s.n_embd + k];
          u[r] += xt[k] * up[(e * s.n_ff + r) * s.n_embd + k];
        }
      }
      AddLowRank(low, 0, e, xt.data(), s.n_ff, s.n_embd, g.data());
      AddLowRank(low, 1, e, xt.data(), s.n_ff, s.n_embd, u.data());
      for (int64_t r = 0; r < s.n_ff; ++r) hidden[r] = g[r] / (1.0 + std::exp(-g[r])) * u[r];
      for (int64_t r = 0; r < s.n_embd; ++r) {
        for (int64_t k = 0; k < s.n_ff; ++k)
          d[r] += hidden[k] * down[(e * s.n_embd + r) * s.n_ff + k];
      }
      AddLowRank(low, 2, e, hidden.data(), s.n_embd, s.n_ff, d.data());
      for (int64_t r = 0; r < s.n_embd; ++r) y[r] += w[j] * d[r];
    }
    for (int64_t r = 0; r < s.n_embd; ++r) {
      float& o = out[t * s.n_embd + r];
      o = static_cast<float>(s.accumulate ? o + y[r] : y[r]);
    }
  }
}

}  // namespace polychip::runtime::conformance::ref
