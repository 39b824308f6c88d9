#version 450
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
// out[i, j] = sum_k x[i, k] * W[j, k] (+ bias[j]) (+ out[i, j]), W in the format of WT_<format>.
// A workgroup computes one column j for up to NR rows of x, so that each weight row is decoded
// once per NR rows (decode: m = 1; prefill: m/NR workgroups per column); its invocations split
// k, reduce within their subgroup (subgroupAdd), then across subgroups through shared memory:
// one barrier, whatever the subgroup size (8 on lavapipe, 32 or 64 on GPUs).
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

#define NR 8u
shared float red[NR][64];  // [row][subgroup]

void main() {
  uint g = WorkgroupLinear();
  uint j = g % p.n;
  uint i0 = (g / p.n) * NR;
  if (i0 >= p.m) return;
  uint nr = min(NR, p.m - i0);
  uint lid = gl_LocalInvocationID.x;
  float acc[NR];
  [[unroll]] for (uint r = 0u; r < NR; ++r) acc[r] = 0.0;
  uint rb = p.w_off + j * p.row_bytes;
  uint xb = p.x_off + i0 * p.x_stride;
#if defined(WT_FLOAT)
  for (uint e = lid; e < p.k; e += 64u) {
    float v = WeightAt(rb, e);
    [[unroll]] for (uint r = 0u; r < NR; ++r) {
      if (r < nr) acc[r] += v * x[xb + r * p.x_stride + e];
    }
  }
#else
  for (uint c = lid; c < p.k / 32u; c += 64u) {
    float v[32];
    Chunk(rb, c, v);
    // Not unrolled: eight copies of the 32-term dot product made lavapipe's compile of each
    // variant take many seconds; GPU compilers unroll it themselves.
    [[dont_unroll]] for (uint r = 0u; r < nr; ++r) {
      {
        uint xr = xb + r * p.x_stride + c * 32u;
        float s = 0.0;
        for (uint e = 0u; e < 32u; ++e) s += v[e] * x[xr + e];
        acc[r] += s;
      }
    }
  }
#endif
  [[unroll]] for (uint r = 0u; r < NR; ++r) {
    float v = subgroupAdd(acc[r]);
    if (subgroupElect()) red[r][gl_SubgroupID] = v;
  }
  barrier();
  if (lid < nr) {
    float y = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) y += red[lid][i];
    if (p.has_bias != 0u) y += bias[p.b_off + j];
    uint oi = p.o_off + (i0 + lid) * p.o_stride + j;
    if (p.accumulate != 0u) y += o[oi];
    o[oi] = y;
  }
}
