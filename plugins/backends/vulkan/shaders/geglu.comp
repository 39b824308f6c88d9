#version 450
#include "common.glsl"
// out[i] = gelu_tanh(gate[i]) * up[i] (pc_geglu_args_t); out may alias gate or up. GELU's tanh
// form as g * sigmoid(2u), u = sqrt(2/pi) (g + 0.044715 g^3): exp overflows to +inf for a very
// negative g and gives the limit 0, never NaN.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { uint a_off, b_off, o_off, n; } p;
void main() {
  uint i = WorkgroupLinear() * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  float g = a[p.a_off + i];
  float two_u = 1.5957691216 * (g + 0.044715 * g * g * g);
  o[p.o_off + i] = g / (1.0 + exp(-two_u)) * b[p.b_off + i];
}
