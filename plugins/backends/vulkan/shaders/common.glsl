// Shared by every kernel. Grids larger than maxComputeWorkGroupCount[0] are folded into y by the
// host, so a kernel numbers its workgroups linearly and returns past the end.
#extension GL_EXT_control_flow_attributes : enable

uint WorkgroupLinear() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }

// f32 -> f16 bits, round to nearest even (subnormals, overflow to infinity, NaN kept quiet),
// done in integers because packHalf2x16's rounding is implementation-defined.
uint F32ToF16(float f) {
  uint x = floatBitsToUint(f);
  uint sign = (x >> 16) & 0x8000u;
  uint a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return sign | (a > 0x7F800000u ? 0x7E00u : 0x7C00u);
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // rounds past 65504
  if (a >= 0x38800000u) {                        // a normal half
    uint r = a - 0x38000000u;
    return sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13);
  }
  uint e = a >> 23;
  if (e < 102u) return sign;  // below half the smallest subnormal
  uint m = (a & 0x7FFFFFu) | 0x800000u;
  uint shift = 126u - e;
  uint q = m >> shift;
  uint rem = m & ((1u << shift) - 1u);
  uint halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (q & 1u) != 0u)) q += 1u;
  return sign | q;
}

uint F32ToBf16(float f) {
  uint x = floatBitsToUint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (x >> 16) | 0x40u;  // quiet NaN
  return (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
}

float F16ToF32(uint h) { return unpackHalf2x16(h).x; }
float Bf16ToF32(uint b) { return uintBitsToFloat(b << 16); }
