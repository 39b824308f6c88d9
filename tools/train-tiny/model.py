"""Tiny llama-architecture model: RMSNorm, RoPE (adjacent pairs), GQA, SwiGLU.

RoPE rotates adjacent pairs (x[2i], x[2i+1]) like Meta's original complex-number
formulation; that is llama.cpp's "normal" rope for GGUF arch `llama`, so the weights
export without any Q/K permutation.
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab_size: int = 4096
    dim: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 2
    ffn_dim: int = 704
    ctx: int = 256
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg, device=None):
    hd = cfg.dim // cfg.n_heads
    inv = cfg.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)  # [hd/2]
    ang = torch.arange(cfg.ctx, dtype=torch.float64)[:, None] * inv[None, :]  # [ctx, hd/2]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x, cos, sin):
    # x: [B, H, T, hd]; pairs are (x[..., 2i], x[..., 2i+1]).
    T = x.shape[2]
    x2 = x.reshape(*x.shape[:-1], -1, 2)
    a, b = x2[..., 0], x2[..., 1]
    c, s = cos[:T], sin[:T]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hd = cfg.dim // cfg.n_heads
        self.cfg = cfg
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w_gate = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin, mask):
        cfg = self.cfg
        B, T, _ = x.shape
        hd = cfg.dim // cfg.n_heads
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, cfg.n_heads, hd).transpose(1, 2)     # [B, H, T, hd]
        k = self.wk(h).view(B, T, cfg.n_kv_heads, hd).transpose(1, 2)  # [B, KV, T, hd]
        v = self.wv(h).view(B, T, cfg.n_kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = cfg.n_heads // cfg.n_kv_heads
        k = k.repeat_interleave(rep, dim=1)  # query head h uses kv head h // rep
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + mask[:T, :T]  # [B, H, T, T]
        o = F.softmax(att, dim=-1) @ v
        x = x + self.wo(o.transpose(1, 2).reshape(B, T, -1))
        h = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        # Output projection is tied to the embedding (exported as both tensors).
        cos, sin = rope_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        mask = torch.full((cfg.ctx, cfg.ctx), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)
        self.apply(self._init)
        for b in self.blocks:  # scaled init of residual projections (GPT-2)
            for w in (b.wo.weight, b.w_down.weight):
                nn.init.normal_(w, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        x = self.tok_emb(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin, self.mask)
        return self.norm(x) @ self.tok_emb.weight.t()  # [B, T, vocab]
