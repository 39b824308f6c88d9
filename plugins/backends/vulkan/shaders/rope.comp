#version 450
#include "common.glsl"
// Rotary embedding in place, one invocation per (token, head, pair), as pc_rope_args documents
// (NORMAL or NEOX pairing, freq_factors, YaRN).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Pos { int pos[]; };
layout(std430, binding = 2) readonly buffer FF { float ff[]; };
layout(push_constant) uniform P {
  uint x_off, pos_off, ff_off, has_ff, n_tokens, n_heads, head_dim, n_rot, neox;
  float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig;
} p;

float CorrDim(float n_rotations) {
  return float(p.n_rot) * log(p.n_ctx_orig / (n_rotations * 2.0 * 3.14159265358979)) /
         (2.0 * log(p.freq_base));
}

void main() {
  uint half_rot = p.n_rot / 2u;
  uint idx = WorkgroupLinear() * 64u + gl_LocalInvocationID.x;
  if (idx >= p.n_tokens * p.n_heads * half_rot) return;
  uint i = idx % half_rot;
  uint th = idx / half_rot;  // token * n_heads + head
  uint t = th / p.n_heads;
  float factor = p.has_ff != 0u ? ff[p.ff_off + i] : 1.0;
  float theta_extrap =
      float(pos[p.pos_off + t]) * pow(p.freq_base, -2.0 * float(i) / float(p.n_rot)) / factor;
  float theta_interp = p.freq_scale * theta_extrap;
  float theta = theta_interp;
  float mscale = p.attn_factor;
  if (p.ext_factor != 0.0) {
    float low = max(0.0, floor(CorrDim(p.beta_fast)));
    float high = min(float(p.n_rot - 1u), ceil(CorrDim(p.beta_slow)));
    float y = (float(i) - low) / max(0.001, high - low);
    float mix_ = (1.0 - min(1.0, max(0.0, y))) * p.ext_factor;
    theta = theta_interp * (1.0 - mix_) + theta_extrap * mix_;
    mscale *= 1.0 + 0.1 * log(1.0 / p.freq_scale);
  }
  // Reduce to [-pi, pi] in two steps: sin/cos of large arguments are imprecise on some drivers.
  float turns = round(theta * 0.15915494309189535);
  float r = fma(-turns, 6.28318548202514648, theta);
  r = fma(-turns, -1.7484556000744883e-07, r);
  float c = cos(r) * mscale, s = sin(r) * mscale;
  uint base = p.x_off + th * p.head_dim;
  uint i0 = p.neox != 0u ? i : 2u * i;
  uint i1 = p.neox != 0u ? i + half_rot : 2u * i + 1u;
  float x0 = x[base + i0], x1 = x[base + i1];
  x[base + i0] = x0 * c - x1 * s;
  x[base + i1] = x0 * s + x1 * c;
}
