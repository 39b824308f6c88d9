#version 450
#include "common.glsl"
// dst (f32) = dequantize(src): one invocation per 32-element chunk.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Wt { uint w[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { uint w_off, o_off, n; } p;
#include "dequant.glsl"

void main() {
  uint c = WorkgroupLinear() * 64u + gl_LocalInvocationID.x;
  if (c >= p.n / 32u) return;
  float v[32];
  Chunk(p.w_off, c, v);
  [[unroll]] for (uint e = 0u; e < 32u; ++e) o[p.o_off + c * 32u + e] = v[e];
}
