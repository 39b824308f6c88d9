#version 450
#include "common.glsl"
// out[i, j] = sum_k x[i, k] * W[j, k] (+ bias[j]) (+ out[i, j]), each invocation walking the
// whole of k for COLS columns (rows of W) and up to ROWS rows of x: the kernel for CPU Vulkan
// devices (lavapipe). Such a driver runs a workgroup as SIMD vectors of invocations and pays for
// every storage-buffer load lane by lane, per loaded component (a loop with a bounds check), so
// what counts is the number of components loaded. Splitting k across lanes (matvec.comp, right
// for a GPU's coalesced loads) loads each x value once per weight; here every x value loaded (as
// a vec4) serves COLS weights of each lane, and the weights are read 16 bytes a load (32 with
// INT64) where the format and alignment allow (F16 and Q4_0 in groups of 256 elements when
// decoding), else as 32-bit words (Q8_0, F16/BF16 pairs), else byte by byte (dequant.glsl). No
// shared memory, no subgroup operation, no barrier.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { vec4 x4[]; };  // the host aligns x to 4 floats
layout(std430, binding = 1) readonly buffer Wt { uint w[]; };
layout(std430, binding = 1) readonly buffer Wt4 { uvec4 w4[]; };  // the same bytes, 16 at a time
#if defined(INT64)
// INT64 (matrow64_*, devices with shaderInt64): 32 or 16 bytes a load, half the loads again (a
// CPU driver pays per loaded component, whatever its width).
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(std430, binding = 1) readonly buffer Wt8 { u64vec4 w8[]; };
layout(std430, binding = 1) readonly buffer Wt16 { u64vec2 w16[]; };
#endif
layout(std430, binding = 2) readonly buffer B { float bias[]; };
layout(std430, binding = 3) buffer O { float o[]; };
layout(push_constant) uniform P {
  uint x_off, w_off, b_off, o_off;  // x, bias, out in floats; w in bytes
  uint m, n, k, x_stride, o_stride, row_bytes, has_bias, accumulate;
} p;
#include "dequant.glsl"

// ROWS: rows of x per invocation, 1 for decode (matrow_*), 8 for prefill and batched decode
// (matrowtile_*). COLS: columns (rows of W) per invocation, so that each x value loaded serves
// COLS weights (the host's grid: ceil(n / (64 * COLS)) x ceil(m / ROWS) workgroups).
#ifndef ROWS
#define ROWS 1
#endif
#ifndef COLS
#define COLS 8
#endif
#define NR uint(ROWS)
#define NC uint(COLS)

// The 4 bytes at byte offset b (b even) from the two words that hold them.
uint Word16(uint lo, uint hi, bool odd) { return odd ? (lo >> 16) | (hi << 16) : lo; }

#if defined(WT_Q4_0) || defined(WT_Q8_0)
// A 32-element block starting at byte bb (even), read as words: Q4_0 is 18 bytes (f16 scale,
// 16 bytes of nibbles), Q8_0 34 (f16 scale, 32 int8).
void BlockWords(uint bb, out float v[32]) {
  uint q = bb >> 2u;
  bool odd = (bb & 2u) != 0u;
#if defined(WT_Q4_0)
  uint a[5];
  [[unroll]] for (uint i = 0u; i < 5u; ++i) a[i] = w[q + i];
  uint u[5];  // u[i]: the block's bytes 4i .. 4i+3
  [[unroll]] for (uint i = 0u; i < 4u; ++i) u[i] = Word16(a[i], a[i + 1u], odd);
  u[4] = odd ? a[4] >> 16 : a[4];
  float d = F16ToF32(u[0] & 0xFFFFu);
  [[unroll]] for (uint i = 0u; i < 4u; ++i) {
    uint qs = (u[i] >> 16) | (u[i + 1u] << 16);  // nibble bytes 4i .. 4i+3
    [[unroll]] for (uint b = 0u; b < 4u; ++b) {
      uint byte = (qs >> (8u * b)) & 0xFFu;
      v[4u * i + b] = float(int(byte & 0xFu) - 8) * d;
      v[4u * i + b + 16u] = float(int(byte >> 4) - 8) * d;
    }
  }
#else
  uint a[9];
  [[unroll]] for (uint i = 0u; i < 9u; ++i) a[i] = w[q + i];
  uint u[9];  // u[i]: the block's bytes 4i .. 4i+3
  [[unroll]] for (uint i = 0u; i < 8u; ++i) u[i] = Word16(a[i], a[i + 1u], odd);
  u[8] = odd ? a[8] >> 16 : a[8];
  float d = F16ToF32(u[0] & 0xFFFFu);
  [[unroll]] for (uint i = 0u; i < 8u; ++i) {
    uint qs = (u[i] >> 16) | (u[i + 1u] << 16);  // int8 values 4i .. 4i+3
    [[unroll]] for (uint b = 0u; b < 4u; ++b) v[4u * i + b] = float(S8(qs >> (8u * b))) * d;
  }
#endif
}
#endif

void main() {
  uint g = WorkgroupLinear();
  uint col_groups = (p.n + 64u * NC - 1u) / (64u * NC);
  uint j0 = ((g % col_groups) * 64u + gl_LocalInvocationID.x) * NC;
  uint i0 = (g / col_groups) * NR;
  if (i0 >= p.m || j0 >= p.n) return;
  uint nr = min(NR, p.m - i0);
  uint nc = min(NC, p.n - j0);
  float acc[NR][NC];
  [[unroll]] for (uint r = 0u; r < NR; ++r) {
    [[unroll]] for (uint c = 0u; c < NC; ++c) acc[r][c] = 0.0;
  }
  uint rb[NC];  // the byte offset of each column's weight row (the last one repeated past n)
  [[unroll]] for (uint c = 0u; c < NC; ++c) rb[c] = p.w_off + min(j0 + c, p.n - 1u) * p.row_bytes;
  uint xb = (p.x_off + i0 * p.x_stride) >> 2;  // in vec4s, as are the strides below
  uint xs = p.x_stride >> 2;
  // Decode, F16 and Q4_0: groups of 256 elements read as 16-byte loads (32 for F16, 9 for
  // Q4_0's eight 18-byte blocks) where the rows start on 16-byte boundaries; x for the group is
  // loaded once for all the columns. The rest of k (or all of it) takes the loops below.
  uint done = 0u;  // elements of k handled here
#if ROWS == 1 && (defined(WT_F16) || defined(WT_Q4_0))
#if defined(INT64) && defined(WT_F16)
  uint groups = ((p.w_off | p.row_bytes) & 31u) == 0u ? p.k / 256u : 0u;
#else
  uint groups = ((p.w_off | p.row_bytes) & 15u) == 0u ? p.k / 256u : 0u;
#endif
  for (uint gi = 0u; gi < groups; ++gi) {
    vec4 xv[64];
    [[unroll]] for (uint q = 0u; q < 64u; ++q) xv[q] = x4[xb + gi * 64u + q];
    [[unroll]] for (uint c = 0u; c < NC; ++c) {
      float s = 0.0;
#if defined(WT_F16)
#if defined(INT64)
      uint base = (rb[c] >> 5) + gi * 16u;
      [[unroll]] for (uint i = 0u; i < 16u; ++i) {
        u64vec4 u = w8[base + i];
        [[unroll]] for (uint q = 0u; q < 4u; ++q) {
          uvec2 h = unpackUint2x32(u[q]);
          s += dot(vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y)), xv[4u * i + q]);
        }
      }
#else
      uint base = (rb[c] >> 4) + gi * 32u;
      [[unroll]] for (uint i = 0u; i < 32u; ++i) {
        uvec4 u = w4[base + i];
        s += dot(vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)), xv[2u * i]) +
             dot(vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w)), xv[2u * i + 1u]);
      }
#endif
#else
      uint base = (rb[c] >> 4) + gi * 9u;
      uint a[36];
      [[unroll]] for (uint i = 0u; i < 9u; ++i) {
#if defined(INT64)
        u64vec2 u2 = w16[base + i];
        uvec4 u = uvec4(unpackUint2x32(u2.x), unpackUint2x32(u2.y));
#else
        uvec4 u = w4[base + i];
#endif
        a[4u * i] = u.x, a[4u * i + 1u] = u.y, a[4u * i + 2u] = u.z, a[4u * i + 3u] = u.w;
      }
      [[unroll]] for (uint t = 0u; t < 8u; ++t) {
        // block t: bytes 18t (f16 scale) and 18t + 2 .. 18t + 17 (nibbles); 18t is even
        uint o = 18u * t;
        float d = F16ToF32(Word16(a[o >> 2], a[(o >> 2) + 1u], (o & 2u) != 0u) & 0xFFFFu);
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        [[unroll]] for (uint i = 0u; i < 4u; ++i) {
          uint qb = o + 2u + 4u * i;  // nibble bytes 4i .. 4i+3
          uint qs = Word16(a[qb >> 2], a[min((qb >> 2) + 1u, 35u)], (qb & 2u) != 0u);
          vec4 l = vec4(float(qs & 0xFu), float((qs >> 8) & 0xFu), float((qs >> 16) & 0xFu),
                        float((qs >> 24) & 0xFu)) - 8.0;
          vec4 h = vec4(float((qs >> 4) & 0xFu), float((qs >> 12) & 0xFu),
                        float((qs >> 20) & 0xFu), float(qs >> 28)) - 8.0;
          lo += l * xv[8u * t + i];
          hi += h * xv[8u * t + 4u + i];
        }
        s += d * (lo.x + lo.y + lo.z + lo.w + hi.x + hi.y + hi.z + hi.w);
      }
#endif
      acc[0][c] += s;
    }
  }
  done = groups * 256u;
#endif
#if defined(WT_FLOAT)
  // Four elements a step (the host asks k % 4 == 0; F16/BF16 rows on word boundaries).
  for (uint q = done / 4u; q < p.k / 4u; ++q) {
    vec4 v[NC];
    [[unroll]] for (uint c = 0u; c < NC; ++c) {
#if defined(WT_F32)
      uint e = (rb[c] >> 2) + 4u * q;
      v[c] = vec4(uintBitsToFloat(w[e]), uintBitsToFloat(w[e + 1u]), uintBitsToFloat(w[e + 2u]),
                  uintBitsToFloat(w[e + 3u]));
#else
      uint u0 = w[(rb[c] >> 2) + 2u * q], u1 = w[(rb[c] >> 2) + 2u * q + 1u];
#if defined(WT_F16)
      v[c] = vec4(unpackHalf2x16(u0), unpackHalf2x16(u1));
#else
      v[c] = vec4(uintBitsToFloat(u0 << 16), uintBitsToFloat(u0 & 0xFFFF0000u),
                  uintBitsToFloat(u1 << 16), uintBitsToFloat(u1 & 0xFFFF0000u));
#endif
#endif
    }
    [[unroll]] for (uint r = 0u; r < NR; ++r) {
      if (r < nr) {
        vec4 xv = x4[xb + r * xs + q];
        [[unroll]] for (uint c = 0u; c < NC; ++c) acc[r][c] += dot(v[c], xv);
      }
    }
  }
#else
  for (uint b = done / 32u; b < p.k / 32u; ++b) {
    float v[NC][32];
    [[unroll]] for (uint c = 0u; c < NC; ++c) {
#if defined(WT_Q4_0)
      BlockWords(rb[c] + b * 18u, v[c]);
#elif defined(WT_Q8_0)
      BlockWords(rb[c] + b * 34u, v[c]);
#else
      Chunk(rb[c], b, v[c]);
#endif
    }
    [[unroll]] for (uint r = 0u; r < NR; ++r) {
      if (r < nr) {
        uint xr = xb + r * xs + b * 8u;
        float s[NC];
        [[unroll]] for (uint c = 0u; c < NC; ++c) s[c] = 0.0;
        [[unroll]] for (uint q = 0u; q < 8u; ++q) {
          vec4 xv = x4[xr + q];
          [[unroll]] for (uint c = 0u; c < NC; ++c) {
            s[c] += dot(vec4(v[c][4u * q], v[c][4u * q + 1u], v[c][4u * q + 2u],
                             v[c][4u * q + 3u]), xv);
          }
        }
        [[unroll]] for (uint c = 0u; c < NC; ++c) acc[r][c] += s[c];
      }
    }
  }
#endif
  [[unroll]] for (uint r = 0u; r < NR; ++r) {
    [[unroll]] for (uint c = 0u; c < NC; ++c) {
      if (r < nr && c < nc) {
        float y = acc[r][c];
        if (p.has_bias != 0u) y += bias[p.b_off + j0 + c];
        uint oi = p.o_off + (i0 + r) * p.o_stride + j0 + c;
        if (p.accumulate != 0u) y += o[oi];
        o[oi] = y;
      }
    }
  }
}
