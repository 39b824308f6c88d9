#version 450
#include "common.glsl"
// out[i, j] = sum_k x[i, k] * W[j, k] (+ bias[j]) (+ out[i, j]), each invocation walking the
// whole of k for COLS columns (rows of W) and up to ROWS rows of x: the kernel for CPU Vulkan
// devices (lavapipe). Such a driver runs a workgroup as SIMD vectors of invocations and pays for
// every storage-buffer load lane by lane, per loaded component (a loop with a bounds check), so
// what counts is the number of components loaded. Splitting k across lanes (matvec.comp, right
// for a GPU's coalesced loads) loads each x value once per weight; here every x value loaded (as
// a vec4) serves COLS weights of each lane, and the weights are read in as few loads as the
// format allows: decoding, F16 16 bytes a load (32 with INT64) where rows are aligned, and every
// quantized format a group of 256 elements at a time into registers, 4 bytes a load (8 with
// INT64) whatever its alignment (LoadGroup); tiles (prefill), F16/BF16 pairs and Q4_0/Q8_0 as
// 32-bit words, the other formats byte by byte (dequant.glsl). No shared memory, no barrier.
//
// TEXEL (matrowtex_*: decode on a CPU device with subgroups of 8; matrowtiletex_*: tiles on a
// CPU device): x and W are read through
// uniform texel buffers (the texel view of their memory blocks, 16 bytes a texel; the offsets
// in the push constants are then from the block's start). Lavapipe compiles a storage-buffer
// load whose address differs between lanes into a per-lane loop (a bounds check, an exec-mask
// test, a store into a stack vector and a reload of the whole vector: a store-forwarding stall
// per lane and component), and one whose address is the same in every lane (x) the same way;
// a texel fetch is a branchless gather of 16 bytes a lane. Decoding, x is read once per
// subgroup: each of its 8 lanes fetches an eighth of the group's x and subgroupBroadcast hands
// it to the others.
layout(local_size_x = 64) in;
#if defined(TEXEL)
#extension GL_KHR_shader_subgroup_ballot : require
layout(binding = 0) uniform usamplerBuffer xt;
layout(binding = 1) uniform usamplerBuffer wt;
vec4 X4(uint i) { return uintBitsToFloat(texelFetch(xt, int(i))); }
uint W32(uint i) { return texelFetch(wt, int(i >> 2))[i & 3u]; }
#define W_WORD(i) W32(i)
#else
layout(std430, binding = 0) readonly buffer X { vec4 x4[]; };  // the host aligns x to 4 floats
layout(std430, binding = 1) readonly buffer Wt { uint w[]; };
layout(std430, binding = 1) readonly buffer Wt4 { uvec4 w4[]; };  // the same bytes, 16 at a time
vec4 X4(uint i) { return x4[i]; }
uint W32(uint i) { return w[i]; }
#endif
#if defined(INT64)
// INT64 (matrow64_*, devices with shaderInt64): weights read as 64-bit components, half the
// loads again (a CPU driver pays per loaded component, whatever its width).
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(std430, binding = 1) readonly buffer Wt8 { u64vec4 w8[]; };
#endif
layout(std430, binding = 2) readonly buffer B { float bias[]; };
layout(std430, binding = 3) buffer O { float o[]; };
layout(push_constant) uniform P {
  uint x_off, w_off, b_off, o_off;  // x, bias, out in floats; w in bytes
  uint m, n, k, x_stride, o_stride, row_bytes, has_bias, accumulate;
} p;
#include "dequant.glsl"

// ROWS: rows of x per invocation, 1 for decode (matrow_*), 8 for prefill and batched decode
// (matrowtile_*). COLS: columns (rows of W) per invocation, so that each x value loaded serves
// COLS weights (the host's grid: ceil(n / (64 * COLS)) x ceil(m / ROWS) workgroups).
#ifndef ROWS
#define ROWS 1
#endif
#ifndef COLS
#define COLS 8
#endif
#define NR uint(ROWS)
#define NC uint(COLS)

// The 4 bytes at byte offset b (b even) from the two words that hold them.
uint Word16(uint lo, uint hi, bool odd) { return odd ? (lo >> 16) | (hi << 16) : lo; }

#if defined(WT_Q4_0) || defined(WT_Q8_0)
// A 32-element block starting at byte bb (even), read as words: Q4_0 is 18 bytes (f16 scale,
// 16 bytes of nibbles), Q8_0 34 (f16 scale, 32 int8).
void BlockWords(uint bb, out float v[32]) {
  uint q = bb >> 2u;
  bool odd = (bb & 2u) != 0u;
#if defined(WT_Q4_0)
  uint a[5];
  [[unroll]] for (uint i = 0u; i < 5u; ++i) a[i] = W32(q + i);
  uint u[5];  // u[i]: the block's bytes 4i .. 4i+3
  [[unroll]] for (uint i = 0u; i < 4u; ++i) u[i] = Word16(a[i], a[i + 1u], odd);
  u[4] = odd ? a[4] >> 16 : a[4];
  float d = F16ToF32(u[0] & 0xFFFFu);
  [[unroll]] for (uint i = 0u; i < 4u; ++i) {
    uint qs = (u[i] >> 16) | (u[i + 1u] << 16);  // nibble bytes 4i .. 4i+3
    [[unroll]] for (uint b = 0u; b < 4u; ++b) {
      uint byte = (qs >> (8u * b)) & 0xFFu;
      v[4u * i + b] = float(int(byte & 0xFu) - 8) * d;
      v[4u * i + b + 16u] = float(int(byte >> 4) - 8) * d;
    }
  }
#else
  uint a[9];
  [[unroll]] for (uint i = 0u; i < 9u; ++i) a[i] = W32(q + i);
  uint u[9];  // u[i]: the block's bytes 4i .. 4i+3
  [[unroll]] for (uint i = 0u; i < 8u; ++i) u[i] = Word16(a[i], a[i + 1u], odd);
  u[8] = odd ? a[8] >> 16 : a[8];
  float d = F16ToF32(u[0] & 0xFFFFu);
  [[unroll]] for (uint i = 0u; i < 8u; ++i) {
    uint qs = (u[i] >> 16) | (u[i + 1u] << 16);  // int8 values 4i .. 4i+3
    [[unroll]] for (uint b = 0u; b < 4u; ++b) v[4u * i + b] = float(S8(qs >> (8u * b))) * d;
  }
#endif
}
#endif

#if !defined(WT_FLOAT)
// ---- Decode (ROWS == 1): a weight row in groups of 256 elements (eight 32-element blocks, or
// one K-quant super-block), each group's bytes loaded into registers with 64-bit loads (32-bit
// without INT64) at whatever 2-byte alignment it has, then decoded from there: about GB / 8
// loads a group where the block-by-block decode of dequant.glsl reads a byte or two a load.
#if defined(WT_Q8_0)
#define GB 272u  // bytes of 256 elements: 8 blocks of 34
#elif defined(WT_Q4_0) || defined(WT_IQ4_NL) || defined(WT_Q4_K)
#define GB 144u  // 8 blocks of 18; one Q4_K super-block
#elif defined(WT_Q4_1)
#define GB 160u
#elif defined(WT_Q5_0)
#define GB 176u
#elif defined(WT_Q5_1)
#define GB 192u
#elif defined(WT_Q6_K)
#define GB 210u
#elif defined(WT_IQ4_XS)
#define GB 136u
#endif
const uint GW = (GB + 3u) / 4u + 1u;  // u[]: the group's bytes as words, plus a zero word
#if defined(TEXEL)
const uint NL = (GB + 29u) / 16u;  // texel fetches: the group at any even offset in a texel
const uint CW = 4u * NL + 4u;
#elif defined(INT64)
layout(std430, binding = 1) readonly buffer Wt64 { uint64_t w64[]; };
const uint NL = (GB + 13u) / 8u;  // 64-bit loads: the group at any even offset in a word
const uint CW = 2u * NL + 2u;
#else
const uint NL = (GB + 5u) / 4u;
const uint CW = 2u * NL + 2u;
#endif

// u[i] = the bytes B + 4i .. B + 4i + 3 of the bound weight (B even). The last load is clamped
// to the binding (it may lie past the row's end; the host rounds the window up to 8 bytes).
void LoadGroup(uint B, out uint u[GW]) {
  uint c[CW];
#if defined(TEXEL)
  uint q0 = B >> 4, last = uint(textureSize(wt)) - 1u;
  [[unroll]] for (uint i = 0u; i < NL; ++i) {
    uvec4 t = texelFetch(wt, int(i + 1u == NL ? min(q0 + i, last) : q0 + i));
    [[unroll]] for (uint e = 0u; e < 4u; ++e) c[4u * i + e] = t[e];
  }
  [[unroll]] for (uint i = 4u * NL; i < CW; ++i) c[i] = 0u;
  // The group's first word is c[wo]: shift the words down by wo (selects: wo differs between
  // lanes), then by the 2-byte offset below.
  uint wo = (B >> 2) & 3u;
  [[unroll]] for (uint i = 0u; i < CW - 3u; ++i) {
    c[i] = wo == 0u ? c[i] : wo == 1u ? c[i + 1u] : wo == 2u ? c[i + 2u] : c[i + 3u];
  }
  bool o1 = false;
#elif defined(INT64)
  uint q0 = B >> 3, last = uint(w64.length()) - 1u;
  [[unroll]] for (uint i = 0u; i < NL; ++i) {
    uvec2 h = unpackUint2x32(w64[i + 1u == NL ? min(q0 + i, last) : q0 + i]);
    c[2u * i] = h.x;
    c[2u * i + 1u] = h.y;
  }
  [[unroll]] for (uint i = 2u * NL; i < CW; ++i) c[i] = 0u;
  bool o1 = (B & 4u) != 0u;
#else
  uint q0 = B >> 2, last = uint(w.length()) - 1u;
  [[unroll]] for (uint i = 0u; i < NL; ++i) c[i] = W32(i + 1u == NL ? min(q0 + i, last) : q0 + i);
  [[unroll]] for (uint i = NL; i < CW; ++i) c[i] = 0u;
  bool o1 = false;
#endif
  // Selects and masks, no branches: the offsets differ from lane to lane. The loops here are
  // written `i < constant` because glslc unrolls only that form, and an array indexed in a
  // loop left rolled becomes a per-lane gather and scatter through the stack on lavapipe (what
  // made this kernel slow before).
  uint sh = (B & 2u) * 8u, hi_mask = (B & 2u) != 0u ? 0xFFFFFFFFu : 0u;
  [[unroll]] for (uint i = 0u; i < GW - 1u; ++i) {
    uint lo = mix(c[i], c[i + 1u], o1);
    uint hi = mix(c[i + 1u], c[i + 2u], o1);
    u[i] = (lo >> sh) | ((hi << 16) & hi_mask);
  }
  u[GW - 1u] = 0u;
}

// The group's bytes at a constant offset (after unrolling): 1, 2 (even offset) or 4 (even).
#define GB8(off) ((u[(off) >> 2] >> (8u * ((off) & 3u))) & 0xFFu)
#define GB16(off) ((u[(off) >> 2] >> (8u * ((off) & 2u))) & 0xFFFFu)
#define GB32(off) \
  (((off) & 2u) != 0u ? (u[(off) >> 2] >> 16) | (u[((off) >> 2) + 1u] << 16) : u[(off) >> 2])
float Sum4(vec4 v) { return (v.x + v.y) + (v.z + v.w); }
vec4 Bytes4(uint b) {  // four unsigned bytes
  return vec4(float(b & 0xFFu), float((b >> 8) & 0xFFu), float((b >> 16) & 0xFFu),
              float(b >> 24));
}
vec4 Lo4(uint q) { return Bytes4(q & 0x0F0F0F0Fu); }         // the low nibbles of 4 bytes
vec4 Hi4(uint q) { return Bytes4((q >> 4) & 0x0F0F0F0Fu); }  // the high nibbles
#if defined(WT_Q5_0) || defined(WT_Q5_1)
// Bit 4 of each of 4 values from 4 consecutive bits of qh starting at bit `at`.
uint HighBits(uint qh, uint at) {
  uint b = qh >> at;
  return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}
#endif
#if defined(WT_IQ4_NL) || defined(WT_IQ4_XS)
// sdk::kIq4nlValues as int8 bytes, four a word: a select chain instead of an indexed constant
// array (a per-lane gather on a CPU driver).
float Iq4(uint n) {
  uint word = n < 8u ? (n < 4u ? 0xBFAD9881u : 0xF6EADDCFu)
                     : (n < 12u ? 0x26190D01u : 0x71594535u);
  return float(S8(word >> (8u * (n & 3u))));
}
vec4 Iq4x4(uint q) {  // the codebook values of the 4 nibbles q, q >> 8, q >> 16, q >> 24
  return vec4(Iq4(q & 0xFu), Iq4((q >> 8) & 0xFu), Iq4((q >> 16) & 0xFu), Iq4((q >> 24) & 0xFu));
}
#endif

// sum_e W[e] x[e] over the group's first nt 32-element blocks (always 8 for the K-quants).
float GroupDot(uint u[GW], vec4 xv[64], uint nt) {
  float s = 0.0;
#if defined(WT_Q4_K)
  // f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles: sub-blocks 2j and
  // 2j + 1 are the low and high nibbles of bytes 16 + 32j ...
  float d = F16ToF32(GB16(0u)), dmin = F16ToF32(GB16(2u));
  [[unroll]] for (uint sb = 0u; sb < 8u; ++sb) {
    uint sc, m;
    if (sb < 4u) {
      sc = GB8(4u + sb) & 63u;
      m = GB8(8u + sb) & 63u;
    } else {
      sc = (GB8(8u + sb) & 0xFu) | ((GB8(sb) >> 6) << 4);
      m = (GB8(8u + sb) >> 4) | ((GB8(4u + sb) >> 6) << 4);
    }
    vec4 acc = vec4(0.0), xs = vec4(0.0);
    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
      uint q = u[4u + 8u * (sb >> 1) + i] >> (4u * (sb & 1u));
      acc += Lo4(q) * xv[8u * sb + i];
      xs += xv[8u * sb + i];
    }
    s += d * float(sc) * Sum4(acc) - dmin * float(m) * Sum4(xs);
  }
#elif defined(WT_Q6_K)
  // ql[128], qh[64], int8 scales[16], f16 d; chunk c = 4h + t: low bits from ql[64h + 32(t & 1)
  // + l] (low nibble for t < 2), high 2 bits from qh[32h + l] >> 2t, scales 8h + 2t (+1 from
  // l = 16), values minus 32.
  float d = F16ToF32(GB16(208u));
  [[unroll]] for (uint c = 0u; c < 8u; ++c) {
    uint h = c >> 2, t = c & 3u;
    vec4 a0 = vec4(0.0), a1 = vec4(0.0);
    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
      uint ql = (u[16u * h + 8u * (t & 1u) + i] >> (4u * (t >> 1))) & 0x0F0F0F0Fu;
      uint qh = (u[32u + 8u * h + i] >> (2u * t)) & 0x03030303u;
      vec4 q = Bytes4(ql | (qh << 4)) - 32.0;
      if (i < 4u) {
        a0 += q * xv[8u * c + i];
      } else {
        a1 += q * xv[8u * c + i];
      }
    }
    s += d * (float(S8(GB8(192u + 8u * h + 2u * t))) * Sum4(a0) +
              float(S8(GB8(193u + 8u * h + 2u * t))) * Sum4(a1));
  }
#elif defined(WT_IQ4_XS)
  // f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of nibbles (16 per sub-block, Q4_0 order)
  float d = F16ToF32(GB16(0u));
  uint sh = GB16(2u);
  [[unroll]] for (uint sb = 0u; sb < 8u; ++sb) {
    uint ls = ((GB8(4u + (sb >> 1)) >> (4u * (sb & 1u))) & 0xFu) | (((sh >> (2u * sb)) & 3u) << 4);
    vec4 acc = vec4(0.0);
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
      uint q = u[2u + 4u * sb + i];
      acc += Iq4x4(q) * xv[8u * sb + i] + Iq4x4(q >> 4) * xv[8u * sb + 4u + i];
    }
    s += d * float(int(ls) - 32) * Sum4(acc);
  }
#else
  // A missing block's sum is dropped by a select, not skipped by a branch: the branch kept
  // the compiler from unrolling the loop, and every u[] and xv[] index then became a per-lane
  // gather from the stack.
  [[unroll]] for (uint t = 0u; t < 8u; ++t) {
    {
      float s0 = s;
#if defined(WT_Q8_0)
      uint o = 34u * t;  // f16 d, 32 int8
      vec4 acc = vec4(0.0);
      [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        uint q = GB32(o + 2u + 4u * i);
        acc += vec4(float(S8(q)), float(S8(q >> 8)), float(S8(q >> 16)), float(int(q) >> 24)) *
               xv[8u * t + i];
      }
      s += F16ToF32(GB16(o)) * Sum4(acc);
#elif defined(WT_Q4_0) || defined(WT_IQ4_NL)
      uint o = 18u * t;  // f16 d, 16 bytes: element j the low nibble of byte j, j + 16 the high
      vec4 acc = vec4(0.0);
      [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        uint q = GB32(o + 2u + 4u * i);
#if defined(WT_Q4_0)
        acc += (Lo4(q) - 8.0) * xv[8u * t + i] + (Hi4(q) - 8.0) * xv[8u * t + 4u + i];
#else
        acc += Iq4x4(q) * xv[8u * t + i] + Iq4x4(q >> 4) * xv[8u * t + 4u + i];
#endif
      }
      s += F16ToF32(GB16(o)) * Sum4(acc);
#elif defined(WT_Q4_1)
      uint o = 20u * t;  // f16 d, f16 min, 16 bytes of nibbles
      vec4 acc = vec4(0.0), xs = vec4(0.0);
      [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        uint q = GB32(o + 4u + 4u * i);
        acc += Lo4(q) * xv[8u * t + i] + Hi4(q) * xv[8u * t + 4u + i];
        xs += xv[8u * t + i] + xv[8u * t + 4u + i];
      }
      s += F16ToF32(GB16(o)) * Sum4(acc) + F16ToF32(GB16(o + 2u)) * Sum4(xs);
#elif defined(WT_Q5_0) || defined(WT_Q5_1)
#if defined(WT_Q5_0)
      uint o = 22u * t, qo = o + 2u;  // f16 d, u32 qh, 16 bytes of nibbles
#else
      uint o = 24u * t, qo = o + 4u;  // f16 d, f16 min, u32 qh, 16 bytes of nibbles
#endif
      uint qh = GB32(qo);
      vec4 acc = vec4(0.0), xs = vec4(0.0);
      [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        uint q = GB32(qo + 4u + 4u * i);
        vec4 lo = Bytes4((q & 0x0F0F0F0Fu) | HighBits(qh, 4u * i));
        vec4 hi = Bytes4(((q >> 4) & 0x0F0F0F0Fu) | HighBits(qh, 16u + 4u * i));
#if defined(WT_Q5_0)
        acc += (lo - 16.0) * xv[8u * t + i] + (hi - 16.0) * xv[8u * t + 4u + i];
#else
        acc += lo * xv[8u * t + i] + hi * xv[8u * t + 4u + i];
        xs += xv[8u * t + i] + xv[8u * t + 4u + i];
#endif
      }
      s += F16ToF32(GB16(o)) * Sum4(acc);
#if defined(WT_Q5_1)
      s += F16ToF32(GB16(o + 2u)) * Sum4(xs);
#endif
#endif
      s = t < nt ? s : s0;
    }
  }
#endif
  return s;
}
#endif

// xv = the 64 vec4s of x from vec4 index at, none read past last (clamped).
void LoadX(uint at, uint last, out vec4 xv[64]) {
#if defined(TEXEL)
  [[unroll]] for (uint j = 0u; j < 8u; ++j) {
    vec4 part = X4(min(at + 8u * j + gl_SubgroupInvocationID, last));
    [[unroll]] for (uint i = 0u; i < 8u; ++i) xv[8u * j + i] = subgroupBroadcast(part, i);
  }
#else
  [[unroll]] for (uint q = 0u; q < 64u; ++q) xv[q] = X4(min(at + q, last));
#endif
}

void main() {
  uint g = WorkgroupLinear();
  uint col_groups = (p.n + 64u * NC - 1u) / (64u * NC);
  uint j0 = ((g % col_groups) * 64u + gl_LocalInvocationID.x) * NC;
  uint i0 = (g / col_groups) * NR;
#if defined(TEXEL)
  // Every lane stays to the end (the subgroup broadcasts need them all); past n it repeats
  // the last column and stores nothing.
  if (i0 >= p.m) return;
  bool live = j0 < p.n;
  j0 = min(j0, p.n - 1u);
#else
  if (i0 >= p.m || j0 >= p.n) return;
  const bool live = true;
#endif
  uint nr = min(NR, p.m - i0);
  uint nc = min(NC, p.n - j0);
  float acc[NR][NC];
  [[unroll]] for (uint r = 0u; r < NR; ++r) {
    [[unroll]] for (uint c = 0u; c < NC; ++c) acc[r][c] = 0.0;
  }
  uint rb[NC];  // the byte offset of each column's weight row (the last one repeated past n)
  [[unroll]] for (uint c = 0u; c < NC; ++c) rb[c] = p.w_off + min(j0 + c, p.n - 1u) * p.row_bytes;
  uint xb = (p.x_off + i0 * p.x_stride) >> 2;  // in vec4s, as are the strides below
  uint xs = p.x_stride >> 2;
  // Decode, F16: groups of 256 elements read as 16-byte loads (32 with INT64) where the rows
  // start on 16-byte boundaries (32); x for the group is loaded once for all the columns. The
  // rest of k (or all of it) takes the loops below. Quantized: every group (GroupDot).
  uint done = 0u;  // elements of k handled here
#if ROWS == 1 && defined(WT_F16)
#if defined(INT64) && !defined(TEXEL)
  uint groups = ((p.w_off | p.row_bytes) & 31u) == 0u ? p.k / 256u : 0u;
#else
  uint groups = ((p.w_off | p.row_bytes) & 15u) == 0u ? p.k / 256u : 0u;
#endif
  for (uint gi = 0u; gi < groups; ++gi) {
    vec4 xv[64];
    LoadX(xb + gi * 64u, xb + p.k / 4u - 1u, xv);
    [[unroll]] for (uint c = 0u; c < NC; ++c) {
      float s = 0.0;
#if defined(TEXEL)
      uint base = (rb[c] >> 4) + gi * 32u;
      [[unroll]] for (uint i = 0u; i < 32u; ++i) {
        uvec4 u = texelFetch(wt, int(base + i));
        s += dot(vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)), xv[2u * i]) +
             dot(vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w)), xv[2u * i + 1u]);
      }
#elif defined(INT64)
      uint base = (rb[c] >> 5) + gi * 16u;
      [[unroll]] for (uint i = 0u; i < 16u; ++i) {
        u64vec4 u = w8[base + i];
        [[unroll]] for (uint q = 0u; q < 4u; ++q) {
          uvec2 h = unpackUint2x32(u[q]);
          s += dot(vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y)), xv[4u * i + q]);
        }
      }
#else
      uint base = (rb[c] >> 4) + gi * 32u;
      [[unroll]] for (uint i = 0u; i < 32u; ++i) {
        uvec4 u = w4[base + i];
        s += dot(vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)), xv[2u * i]) +
             dot(vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w)), xv[2u * i + 1u]);
      }
#endif
      acc[0][c] += s;
    }
  }
  done = groups * 256u;
#elif ROWS == 1 && !defined(WT_FLOAT)
  // The last group may hold fewer than 8 blocks (k % 256 != 0, 32-element formats): its x
  // loads are clamped to x's end and its missing blocks skipped.
  uint blocks = p.k / 32u, x_last = xb + p.k / 4u - 1u;
  for (uint gi = 0u; gi * 8u < blocks; ++gi) {
    uint nt = min(8u, blocks - gi * 8u);
    vec4 xv[64];
    LoadX(xb + gi * 64u, x_last, xv);
    // Not unrolled: a group's decode is long, and 16 copies of it took the driver's compiler
    // (LLVM, in lavapipe) minutes to build the pipeline.
    [[dont_unroll]] for (uint c = 0u; c < NC; ++c) {
      uint u[GW];
      LoadGroup(p.w_off + min(j0 + c, p.n - 1u) * p.row_bytes + gi * GB, u);
      acc[0][c] += GroupDot(u, xv, nt);
    }
  }
#endif
#if defined(WT_FLOAT)
  // Four elements a step (the host asks k % 4 == 0; F16/BF16 rows on word boundaries).
  for (uint q = done / 4u; q < p.k / 4u; ++q) {
    vec4 v[NC];
    [[unroll]] for (uint c = 0u; c < NC; ++c) {
#if defined(WT_F32)
      uint e = (rb[c] >> 2) + 4u * q;
      v[c] = vec4(uintBitsToFloat(W32(e)), uintBitsToFloat(W32(e + 1u)),
                  uintBitsToFloat(W32(e + 2u)), uintBitsToFloat(W32(e + 3u)));
#else
      uint u0 = W32((rb[c] >> 2) + 2u * q), u1 = W32((rb[c] >> 2) + 2u * q + 1u);
#if defined(WT_F16)
      v[c] = vec4(unpackHalf2x16(u0), unpackHalf2x16(u1));
#else
      v[c] = vec4(uintBitsToFloat(u0 << 16), uintBitsToFloat(u0 & 0xFFFF0000u),
                  uintBitsToFloat(u1 << 16), uintBitsToFloat(u1 & 0xFFFF0000u));
#endif
#endif
    }
    // Rows past nr repeat the last one (never stored): a branch here kept the loop rolled,
    // and acc[r][c] then became a per-lane gather and scatter through the stack.
    [[unroll]] for (uint r = 0u; r < NR; ++r) {
      vec4 xv = X4(xb + min(r, nr - 1u) * xs + q);
      [[unroll]] for (uint c = 0u; c < NC; ++c) acc[r][c] += dot(v[c], xv);
    }
  }
#elif ROWS != 1  // (decoding a quantized format: all of k in groups above)
  for (uint b = done / 32u; b < p.k / 32u; ++b) {
    float v[NC][32];
    [[unroll]] for (uint c = 0u; c < NC; ++c) {
#if defined(WT_Q4_0)
      BlockWords(rb[c] + b * 18u, v[c]);
#elif defined(WT_Q8_0)
      BlockWords(rb[c] + b * 34u, v[c]);
#else
      Chunk(rb[c], b, v[c]);
#endif
    }
    [[unroll]] for (uint r = 0u; r < NR; ++r) {  // past nr: the last row again (see above)
      uint xr = xb + min(r, nr - 1u) * xs + b * 8u;
      float s[NC];
      [[unroll]] for (uint c = 0u; c < NC; ++c) s[c] = 0.0;
      [[unroll]] for (uint q = 0u; q < 8u; ++q) {
        vec4 xv = X4(xr + q);
        [[unroll]] for (uint c = 0u; c < NC; ++c) {
          s[c] += dot(vec4(v[c][4u * q], v[c][4u * q + 1u], v[c][4u * q + 2u],
                           v[c][4u * q + 3u]), xv);
        }
      }
      [[unroll]] for (uint c = 0u; c < NC; ++c) acc[r][c] += s[c];
    }
  }
#endif
  [[unroll]] for (uint r = 0u; r < NR; ++r) {
    [[unroll]] for (uint c = 0u; c < NC; ++c) {
      if (live && r < nr && c < nc) {
        float y = acc[r][c];
        if (p.has_bias != 0u) y += bias[p.b_off + j0 + c];
        uint oi = p.o_off + (i0 + r) * p.o_stride + j0 + c;
        if (p.accumulate != 0u) y += o[oi];
        o[oi] = y;
      }
    }
  }
}
