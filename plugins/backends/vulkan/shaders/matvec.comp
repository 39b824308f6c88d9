#version 450
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
// out[i, j] = sum_k x[i, k] * W[j, k] (+ bias[j]) (+ out[i, j]) for a tile of 8 columns and up
// to NR rows of x: 8 invocations per column split k, decode each chunk of W once for all the
// tile's rows, then reduce among themselves with three xor shuffles per row, so there is no
// shared memory and no barrier. Needs subgroups of at least 8 (the host checks); the 8 lanes of
// a column are consecutive invocations of one subgroup.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { uint w[]; };
layout(std430, binding = 2) readonly buffer B { float bias[]; };
layout(std430, binding = 3) buffer O { float o[]; };
layout(push_constant) uniform P {
  uint x_off, w_off, b_off, o_off;  // x, bias, out in floats; w in bytes
  uint m, n, k, x_stride, o_stride, row_bytes, has_bias, accumulate;
} p;
#include "dequant.glsl"

// ROWS: 1 for decode (the variant matvec_*), 8 for prefill and batched decode (mattile_*).
#ifndef ROWS
#define ROWS 1
#endif
#define NR uint(ROWS)

void main() {
  uint lid = gl_LocalInvocationID.x;
  uint col_tiles = (p.n + 7u) / 8u;
  uint g = WorkgroupLinear();
  uint j = (g % col_tiles) * 8u + lid / 8u;
  uint i0 = (g / col_tiles) * NR;
  if (i0 >= p.m) return;
  uint nr = min(NR, p.m - i0);
  uint lane = lid % 8u;
  float acc[NR];
  [[unroll]] for (uint r = 0u; r < NR; ++r) acc[r] = 0.0;
  if (j < p.n) {
    uint rb = p.w_off + j * p.row_bytes;
    uint xb = p.x_off + i0 * p.x_stride;
#if defined(WT_FLOAT)
    for (uint e = lane; e < p.k; e += 8u) {
      float v = WeightAt(rb, e);
      [[dont_unroll]] for (uint r = 0u; r < nr; ++r) acc[r] += v * x[xb + r * p.x_stride + e];
    }
#else
    for (uint c = lane; c < p.k / 32u; c += 8u) {
      float v[32];
      Chunk(rb, c, v);
      [[dont_unroll]] for (uint r = 0u; r < nr; ++r) {
        uint xr = xb + r * p.x_stride + c * 32u;
        float s = 0.0;
        for (uint e = 0u; e < 32u; ++e) s += v[e] * x[xr + e];
        acc[r] += s;
      }
    }
#endif
  }
  [[unroll]] for (uint r = 0u; r < NR; ++r) {
    float a = acc[r];
    a += subgroupShuffleXor(a, 4u);
    a += subgroupShuffleXor(a, 2u);
    a += subgroupShuffleXor(a, 1u);
    acc[r] = a;
  }
  if (j < p.n && lane < nr) {
    // lane r writes row r (a lane indexing acc by its own number: select, no dynamic index)
    float y = 0.0;
    [[unroll]] for (uint r = 0u; r < NR; ++r) y = lane == r ? acc[r] : y;
    if (p.has_bias != 0u) y += bias[p.b_off + j];
    uint oi = p.o_off + (i0 + lane) * p.o_stride + j;
    if (p.accumulate != 0u) y += o[oi];
    o[oi] = y;
  }
}
