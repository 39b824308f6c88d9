#version 450
#include "common.glsl"
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require
// Scatter token t's K and V rows ([n_kv_heads * head_dim] f32) into cache slot slots[t]
// (skipped when < 0). The caches are reached by device address, not by a buffer binding: a
// layer's cache may exceed maxStorageBufferRange, and which part is touched is known only from
// the slots on the device. One workgroup per token; cache dtype F32 (0), F16 (1), BF16 (30).
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint d[]; };
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) readonly buffer Slots { int slots[]; };
layout(push_constant) uniform P {
  uvec2 k_cache, v_cache;
  uint k_off, v_off, slots_off, n_tokens, row, dtype;
} p;

uint Narrow(float f) { return p.dtype == 1u ? F32ToF16(f) : F32ToBf16(f); }

void main() {
  uint t = WorkgroupLinear();
  if (t >= p.n_tokens) return;
  int slot = slots[p.slots_off + t];
  if (slot < 0) return;
  Words kc = Words(p.k_cache), vc = Words(p.v_cache);
  uint src = t * p.row;
  uint lid = gl_LocalInvocationID.x;
  if (p.dtype == 0u) {
    uint dst = uint(slot) * p.row;
    for (uint e = lid; e < p.row; e += 64u) {
      kc.d[dst + e] = floatBitsToUint(k[p.k_off + src + e]);
      vc.d[dst + e] = floatBitsToUint(v[p.v_off + src + e]);
    }
  } else {  // row is even: whole words
    uint dst = uint(slot) * (p.row / 2u);
    for (uint e = lid; e < p.row / 2u; e += 64u) {
      uint a = src + 2u * e;
      kc.d[dst + e] = Narrow(k[p.k_off + a]) | (Narrow(k[p.k_off + a + 1u]) << 16);
      vc.d[dst + e] = Narrow(v[p.v_off + a]) | (Narrow(v[p.v_off + a + 1u]) << 16);
    }
  }
}
