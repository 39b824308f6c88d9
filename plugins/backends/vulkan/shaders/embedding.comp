#version 450
#include "common.glsl"
// out[i, :] = decode(table[ids[i], :]). The table may be larger than one buffer binding: the
// host binds it a window of rows [row_begin, row_end) at a time and each dispatch writes only
// the ids that fall in its window.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Wt { uint w[]; };
layout(std430, binding = 1) readonly buffer Ids { int ids[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
  uint w_off, ids_off, o_off, n_ids, row_len, row_bytes, row_begin, row_end;
} p;
#include "dequant.glsl"

void main() {
  uint i = WorkgroupLinear();
  if (i >= p.n_ids) return;
  int id = ids[p.ids_off + i];
  if (id < int(p.row_begin) || id >= int(p.row_end)) return;
  uint rb = p.w_off + (uint(id) - p.row_begin) * p.row_bytes;
  uint ob = p.o_off + i * p.row_len;
  uint lid = gl_LocalInvocationID.x;
#if defined(WT_FLOAT)
  for (uint e = lid; e < p.row_len; e += 64u) o[ob + e] = WeightAt(rb, e);
#else
  for (uint c = lid; c < p.row_len / 32u; c += 64u) {
    float v[32];
    Chunk(rb, c, v);
    [[unroll]] for (uint e = 0u; e < 32u; ++e) o[ob + c * 32u + e] = v[e];
  }
#endif
}
