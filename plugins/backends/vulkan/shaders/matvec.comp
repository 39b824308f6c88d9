#version 450
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
// Decode (m = 1): out[j] = sum_k x[k] * W[j, k] (+ bias[j]) (+ out[j]). A workgroup computes 8
// columns, 8 invocations each: they split k, then reduce among themselves with three xor
// shuffles, so there is no shared memory and no barrier. Needs subgroups of at least 8 (the
// host checks); the 8 lanes of a column are consecutive invocations of one subgroup.
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

void main() {
  uint lid = gl_LocalInvocationID.x;
  uint j = WorkgroupLinear() * 8u + lid / 8u;
  uint lane = lid % 8u;
  float acc = 0.0;
  if (j < p.n) {
    uint rb = p.w_off + j * p.row_bytes;
#if defined(WT_FLOAT)
    for (uint e = lane; e < p.k; e += 8u) acc += WeightAt(rb, e) * x[p.x_off + e];
#else
    for (uint c = lane; c < p.k / 32u; c += 8u) {
      float v[32];
      Chunk(rb, c, v);
      uint xr = p.x_off + c * 32u;
      [[unroll]] for (uint e = 0u; e < 32u; ++e) acc += v[e] * x[xr + e];
    }
#endif
  }
  acc += subgroupShuffleXor(acc, 4u);
  acc += subgroupShuffleXor(acc, 2u);
  acc += subgroupShuffleXor(acc, 1u);
  if (j < p.n && lane == 0u) {
    float y = acc;
    if (p.has_bias != 0u) y += bias[p.b_off + j];
    if (p.accumulate != 0u) y += o[p.o_off + j];
    o[p.o_off + j] = y;
  }
}
