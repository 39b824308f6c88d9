#version 450
#include "common.glsl"
// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { uint a_off, b_off, o_off, n; } p;
void main() {
  uint i = WorkgroupLinear() * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  float g = a[p.a_off + i];
  o[p.o_off + i] = g / (1.0 + exp(-g)) * b[p.b_off + i];
}
