#version 450
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require
// Paged causal attention with GQA (optionally in a sliding window), prefill and decode alike: one
// workgroup per (query row, head).
// The row's positions go by in tiles of 64 (one per invocation for the scores, then every
// invocation accumulates its own output dimensions) with an online softmax, so any context
// length fits in fixed shared memory. Caches by device address (see kv_store.comp).
//
// TEXEL (attention_tex, CPU devices whose memory blocks have texel views): K and V are read
// through the texel views of their blocks (bindings 0 and 1, the other buffers after them; the
// cache "addresses" in the push constants are then byte offsets in those blocks): lavapipe
// compiles a buffer-reference load into a per-lane loop, a texel fetch into a branchless gather.
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint d[]; };
#if defined(TEXEL)
#define B0 2
layout(binding = 0) uniform usamplerBuffer k_texels;
layout(binding = 1) uniform usamplerBuffer v_texels;
#else
#define B0 0
#endif
layout(std430, binding = B0 + 0) readonly buffer Q { float q[]; };
layout(std430, binding = B0 + 1) writeonly buffer O { float o[]; };
layout(std430, binding = B0 + 2) readonly buffer QS { int qstart[]; };
layout(std430, binding = B0 + 3) readonly buffer SL { int seq_lens[]; };
layout(std430, binding = B0 + 4) readonly buffer BT { int btab[]; };
layout(push_constant) uniform P {
  uvec2 k_cache, v_cache;
  uint q_off, o_off, qs_off, sl_off, bt_off;
  uint n_tokens, n_seqs, n_heads, n_kv_heads, head_dim, block_size, max_blocks, dtype;
  float scale;
  uint window;  // 0: plain causal; else the last `window` positions up to the query's own
} p;

#define MAX_DIM 256u
#define DIMS_PER (MAX_DIM / 64u)
shared float qv[MAX_DIM];
shared float sc[64];
shared uint slot_of[64];
shared float red_max[64], red_sum[64];  // by subgroup

float Cache(Words c, uint e) {
  if (p.dtype == 0u) return uintBitsToFloat(c.d[e]);
  uint h = (c.d[e >> 1] >> ((e & 1u) * 16u)) & 0xFFFFu;
  return p.dtype == 1u ? F16ToF32(h) : Bf16ToF32(h);
}
#if defined(TEXEL)
// Element e of the cache starting at byte `base` of the texel view t.
float TexelCache(usamplerBuffer t, uint base, uint e) {
  uint b = base + (p.dtype == 0u ? 4u * e : 2u * e);
  uint word = texelFetch(t, int(b >> 4))[(b >> 2) & 3u];
  if (p.dtype == 0u) return uintBitsToFloat(word);
  uint h = (word >> ((b & 2u) * 8u)) & 0xFFFFu;
  return p.dtype == 1u ? F16ToF32(h) : Bf16ToF32(h);
}
#define K_AT(e) TexelCache(k_texels, p.k_cache.x, e)
#define V_AT(e) TexelCache(v_texels, p.v_cache.x, e)
#else
#define K_AT(e) Cache(kc, e)
#define V_AT(e) Cache(vc, e)
#endif

void main() {
  uint g = WorkgroupLinear();
  if (g >= p.n_tokens * p.n_heads) return;
  uint t = g / p.n_heads, h = g % p.n_heads;
  uint lid = gl_LocalInvocationID.x;
  uint s = 0u;
  while (s + 1u < p.n_seqs && uint(qstart[p.qs_off + s + 1u]) <= t) ++s;
  uint q0 = uint(qstart[p.qs_off + s]);
  uint n_q = uint(qstart[p.qs_off + s + 1u]) - q0;
  uint n_ctx = uint(seq_lens[p.sl_off + s]) - n_q + (t - q0) + 1u;  // positions 0..own
  uint kvh = h / (p.n_heads / p.n_kv_heads);
#if !defined(TEXEL)
  Words kc = Words(p.k_cache), vc = Words(p.v_cache);
#endif
  uint hd = p.head_dim;
  uint qb = p.q_off + (t * p.n_heads + h) * hd;
  for (uint d = lid; d < hd; d += 64u) qv[d] = q[qb + d];
  float acc[DIMS_PER];
  [[unroll]] for (uint i = 0u; i < DIMS_PER; ++i) acc[i] = 0.0;
  float m_run = -1e30, l_run = 0.0;
  barrier();
  // A sliding window starts the tiles at the first visible position: no masking needed.
  uint first = p.window > 0u && n_ctx > p.window ? n_ctx - p.window : 0u;
  for (uint tile = first; tile < n_ctx; tile += 64u) {
    uint pos = tile + lid;
    float score = -1e30;
    if (pos < n_ctx) {
      uint blk = uint(btab[p.bt_off + s * p.max_blocks + pos / p.block_size]);
      uint slot = blk * p.block_size + pos % p.block_size;
      slot_of[lid] = slot;
      uint kb = (slot * p.n_kv_heads + kvh) * hd;
      float dot_ = 0.0;
      for (uint d = 0u; d < hd; ++d) dot_ += qv[d] * K_AT(kb + d);
      score = dot_ * p.scale;
    }
    float sg_max = subgroupMax(score);
    if (subgroupElect()) red_max[gl_SubgroupID] = sg_max;
    barrier();
    float m_new = m_run;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) m_new = max(m_new, red_max[i]);
    float pr = pos < n_ctx ? exp(score - m_new) : 0.0;
    sc[lid] = pr;
    float sg_sum = subgroupAdd(pr);
    if (subgroupElect()) red_sum[gl_SubgroupID] = sg_sum;
    barrier();
    float tile_sum = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) tile_sum += red_sum[i];
    float alpha = exp(m_run - m_new);
    l_run = l_run * alpha + tile_sum;
    m_run = m_new;
    uint n_here = min(64u, n_ctx - tile);
    [[unroll]] for (uint i = 0u; i < DIMS_PER; ++i) {
      uint d = lid + 64u * i;
      if (d < hd) {
        float a = acc[i] * alpha;
        for (uint j = 0u; j < n_here; ++j) {
          a += sc[j] * V_AT((slot_of[j] * p.n_kv_heads + kvh) * hd + d);
        }
        acc[i] = a;
      }
    }
    barrier();
  }
  uint ob = p.o_off + (t * p.n_heads + h) * hd;
  [[unroll]] for (uint i = 0u; i < DIMS_PER; ++i) {
    uint d = lid + 64u * i;
    if (d < hd) o[ob + d] = acc[i] / l_run;
  }
}
