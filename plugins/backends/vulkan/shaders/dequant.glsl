// Weight decoding for one weight format, chosen by a WT_<format> define. The including shader
// declares `uint w[]` (the weight's bytes as little-endian words), or defines W_WORD(i) as the
// i-th such word (matrow.comp's texel variants); offsets below are bytes.
//   WT_FLOAT   set for F32/F16/BF16: any row length, WeightAt(row_byte, e) decodes element e.
//   otherwise  rows of 32-element chunks (a block, or a K-quant's sub-block): Chunk(row_byte, c, v).
#ifndef W_WORD
#define W_WORD(i) w[i]
#endif
uint Rd8(uint b) { return (W_WORD(b >> 2) >> ((b & 3u) * 8u)) & 0xFFu; }
uint Rd16(uint b) { return (W_WORD(b >> 2) >> ((b & 2u) * 8u)) & 0xFFFFu; }  // b even
int S8(uint v) { return int(v << 24) >> 24; }

#if defined(WT_F32) || defined(WT_F16) || defined(WT_BF16)
#define WT_FLOAT 1
float WeightAt(uint rb, uint e) {
#if defined(WT_F32)
  return uintBitsToFloat(W_WORD((rb >> 2) + e));
#elif defined(WT_F16)
  return F16ToF32(Rd16(rb + 2u * e));
#else
  return Bf16ToF32(Rd16(rb + 2u * e));
#endif
}
#else

void Chunk(uint rb, uint c, out float v[32]) {
#if defined(WT_Q8_0)
  uint bb = rb + c * 34u;
  float d = F16ToF32(Rd16(bb));
  [[unroll]] for (uint i = 0u; i < 16u; ++i) {
    uint u = Rd16(bb + 2u + 2u * i);
    v[2u * i] = float(S8(u & 0xFFu)) * d;
    v[2u * i + 1u] = float(S8(u >> 8)) * d;
  }
#elif defined(WT_Q4_0) || defined(WT_Q4_1)
#if defined(WT_Q4_0)
  uint bb = rb + c * 18u;
  uint qs = bb + 2u;
#else
  uint bb = rb + c * 20u;
  uint qs = bb + 4u;
  float mn = F16ToF32(Rd16(bb + 2u));
#endif
  float d = F16ToF32(Rd16(bb));
  [[unroll]] for (uint j = 0u; j < 16u; ++j) {
    uint b = Rd8(qs + j);
#if defined(WT_Q4_0)
    v[j] = float(int(b & 0xFu) - 8) * d;
    v[j + 16u] = float(int(b >> 4) - 8) * d;
#else
    v[j] = float(b & 0xFu) * d + mn;
    v[j + 16u] = float(b >> 4) * d + mn;
#endif
  }
#elif defined(WT_Q5_0) || defined(WT_Q5_1)
#if defined(WT_Q5_0)
  uint bb = rb + c * 22u;
  uint hb = bb + 2u;
#else
  uint bb = rb + c * 24u;
  uint hb = bb + 4u;
  float mn = F16ToF32(Rd16(bb + 2u));
#endif
  float d = F16ToF32(Rd16(bb));
  uint qh = Rd16(hb) | (Rd16(hb + 2u) << 16);
  [[unroll]] for (uint j = 0u; j < 16u; ++j) {
    uint b = Rd8(hb + 4u + j);
    uint xh0 = ((qh >> j) << 4) & 0x10u;
    uint xh1 = (qh >> (j + 12u)) & 0x10u;
#if defined(WT_Q5_0)
    v[j] = float(int((b & 0xFu) | xh0) - 16) * d;
    v[j + 16u] = float(int((b >> 4) | xh1) - 16) * d;
#else
    v[j] = float((b & 0xFu) | xh0) * d + mn;
    v[j + 16u] = float((b >> 4) | xh1) * d + mn;
#endif
  }
#elif defined(WT_Q4_K)
  // 256-element super-block: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
  uint bb = rb + (c >> 3) * 144u;
  uint s = c & 7u;
  float d = F16ToF32(Rd16(bb));
  float dmin = F16ToF32(Rd16(bb + 2u));
  uint sc, m;
  if (s < 4u) {
    sc = Rd8(bb + 4u + s) & 63u;
    m = Rd8(bb + 8u + s) & 63u;
  } else {
    sc = (Rd8(bb + 8u + s) & 0xFu) | ((Rd8(bb + s) >> 6) << 4);
    m = (Rd8(bb + 8u + s) >> 4) | ((Rd8(bb + 4u + s) >> 6) << 4);
  }
  float d1 = d * float(sc), m1 = dmin * float(m);
  uint q = bb + 16u + 32u * (s >> 1);
  uint sh = (s & 1u) * 4u;
  [[unroll]] for (uint l = 0u; l < 32u; ++l) v[l] = d1 * float((Rd8(q + l) >> sh) & 0xFu) - m1;
#elif defined(WT_Q6_K)
  // 256-element super-block: ql[128], qh[64], int8 scales[16], f16 d
  uint bb = rb + (c >> 3) * 210u;
  uint h = (c >> 2) & 1u, t = c & 3u;
  float d = F16ToF32(Rd16(bb + 208u));
  uint ql = bb + h * 64u + (t & 1u) * 32u;
  uint qh = bb + 128u + h * 32u;
  uint sh = (t >> 1) * 4u;
  float ds0 = d * float(S8(Rd8(bb + 192u + h * 8u + 2u * t)));
  float ds1 = d * float(S8(Rd8(bb + 192u + h * 8u + 2u * t + 1u)));
  [[unroll]] for (uint l = 0u; l < 32u; ++l) {
    int q = int(((Rd8(ql + l) >> sh) & 0xFu) | (((Rd8(qh + l) >> (2u * t)) & 3u) << 4)) - 32;
    v[l] = (l < 16u ? ds0 : ds1) * float(q);
  }
#elif defined(WT_IQ4_NL) || defined(WT_IQ4_XS)
  // 4-bit indices into a 16-value codebook (sdk::kIq4nlValues), Q4_0's nibble order.
  const float kIq4[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                   1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
#if defined(WT_IQ4_NL)
  // [d:f16][qs:16]
  uint bb = rb + c * 18u;
  uint qs = bb + 2u;
  float d = F16ToF32(Rd16(bb));
#else
  // 256-element super-block: [d:f16][scales_h:u16][scales_l:4][qs:128]; sub-block s's 6-bit
  // scale is nibble s % 2 of scales_l[s / 2] with bits 2s..2s+1 of scales_h on top, minus 32.
  uint bb = rb + (c >> 3) * 136u;
  uint s = c & 7u;
  uint ls = ((Rd8(bb + 4u + (s >> 1)) >> (4u * (s & 1u))) & 0xFu) |
            (((Rd16(bb + 2u) >> (2u * s)) & 3u) << 4);
  uint qs = bb + 8u + 16u * s;
  float d = F16ToF32(Rd16(bb)) * float(int(ls) - 32);
#endif
  [[unroll]] for (uint j = 0u; j < 16u; ++j) {
    uint b = Rd8(qs + j);
    v[j] = kIq4[b & 0xFu] * d;
    v[j + 16u] = kIq4[b >> 4] * d;
  }
#else
#error "no weight format defined"
#endif
}
#endif
