#version 450
#include "common.glsl"
// out[i] = x[i] * scale (pc_scale_args_t); out may alias x.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { uint x_off, o_off, n; float scale; } p;
void main() {
  uint i = WorkgroupLinear() * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  o[p.o_off + i] = x[p.x_off + i] * p.scale;
}
