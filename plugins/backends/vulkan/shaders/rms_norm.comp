#version 450
#include "common.glsl"
#extension GL_KHR_shader_subgroup_arithmetic : require
// One workgroup per row: out = x / sqrt(mean(x^2) + eps) * weight (weight optional).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float wt[]; };
layout(std430, binding = 2) buffer O { float o[]; };
layout(push_constant) uniform P { uint x_off, w_off, o_off, n_rows, dim, has_weight; float eps; } p;
shared float red[256];
void main() {
  uint row = WorkgroupLinear();
  if (row >= p.n_rows) return;
  uint lid = gl_LocalInvocationID.x;
  uint xb = p.x_off + row * p.dim, ob = p.o_off + row * p.dim;
  float s = 0.0;
  for (uint i = lid; i < p.dim; i += 256u) s += x[xb + i] * x[xb + i];
  s = subgroupAdd(s);
  if (subgroupElect()) red[gl_SubgroupID] = s;
  barrier();
  float total = 0.0;
  for (uint i = 0u; i < gl_NumSubgroups; ++i) total += red[i];
  float scale = 1.0 / sqrt(total / float(p.dim) + p.eps);
  for (uint i = lid; i < p.dim; i += 256u) {
    float y = x[xb + i] * scale;
    o[ob + i] = p.has_weight != 0u ? y * wt[p.w_off + i] : y;
  }
}
