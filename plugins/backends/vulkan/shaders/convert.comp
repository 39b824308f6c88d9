#version 450
#include "common.glsl"
// Float conversions among F32 (0), F16 (1), BF16 (30), round to nearest even. One invocation per
// destination word: one f32, or two 16-bit values (an odd last element keeps the other half).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer S { uint s[]; };
layout(std430, binding = 1) buffer D { uint d[]; };
layout(push_constant) uniform P { uint s_off, d_off, n, src, dst; } p;  // offsets in bytes

float Load(uint e) {
  if (p.src == 0u) return uintBitsToFloat(s[(p.s_off >> 2) + e]);
  uint b = p.s_off + 2u * e;
  uint h = (s[b >> 2] >> ((b & 2u) * 8u)) & 0xFFFFu;
  return p.src == 1u ? F16ToF32(h) : Bf16ToF32(h);
}
uint Narrow(float f) { return p.dst == 1u ? F32ToF16(f) : F32ToBf16(f); }

void main() {
  uint i = WorkgroupLinear() * 256u + gl_LocalInvocationID.x;
  if (p.dst == 0u) {
    if (i >= p.n) return;
    d[(p.d_off >> 2) + i] = floatBitsToUint(Load(i));
    return;
  }
  uint e = 2u * i;
  if (e >= p.n) return;
  uint lo = Narrow(Load(e));
  uint word = (p.d_off >> 2) + i;
  uint hi = e + 1u < p.n ? Narrow(Load(e + 1u)) : (d[word] >> 16);
  d[word] = lo | (hi << 16);
}
