#!/usr/bin/env python3
"""Tests bench/spec-constructed-pair.py on tiny qwen2 files: with noise 0 the target's logits are
the draft's (a numpy forward pass of both), with noise they are not, and the draft written is
the base draft with ffn_down scaled.

Run: /usr/bin/python3 bench/test_spec_constructed_pair.py (needs numpy)
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "train-tiny"))
import gguf_write as gw  # noqa: E402

VOCAB = [f"t{i}" for i in range(40)]
ROPE_BASE, EPS = 10000.0, 1e-6


def write_qwen2(path, width, layers, heads, kv_heads, ff, rng):
    hd = width // heads
    w = gw.GGUFWriter()
    w.add_string("general.architecture", "qwen2")
    for key, value in (("embedding_length", width), ("block_count", layers),
                       ("attention.head_count", heads), ("attention.head_count_kv", kv_heads),
                       ("feed_forward_length", ff)):
        w.add_u32("qwen2." + key, value)
    w.add_f32("qwen2.rope.freq_base", ROPE_BASE)
    w.add_f32("qwen2.attention.layer_norm_rms_epsilon", EPS)
    w.add_array("tokenizer.ggml.tokens", gw.T_STRING, VOCAB)

    def rand(*shape, std=0.3):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(len(VOCAB), width), gw.GGML_F32)
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", 1 + rand(width, std=0.1), gw.GGML_F32)
        w.add_tensor(p + "attn_q.weight", rand(heads * hd, width), gw.GGML_F32)
        w.add_tensor(p + "attn_k.weight", rand(kv_heads * hd, width), gw.GGML_F32)
        w.add_tensor(p + "attn_v.weight", rand(kv_heads * hd, width), gw.GGML_F32)
        w.add_tensor(p + "attn_q.bias", rand(heads * hd), gw.GGML_F32)
        w.add_tensor(p + "attn_k.bias", rand(kv_heads * hd), gw.GGML_F32)
        w.add_tensor(p + "attn_v.bias", rand(kv_heads * hd), gw.GGML_F32)
        w.add_tensor(p + "attn_output.weight", rand(width, heads * hd), gw.GGML_F32)
        w.add_tensor(p + "ffn_norm.weight", 1 + rand(width, std=0.1), gw.GGML_F32)
        w.add_tensor(p + "ffn_gate.weight", rand(ff, width), gw.GGML_F32)
        w.add_tensor(p + "ffn_up.weight", rand(ff, width), gw.GGML_F32)
        w.add_tensor(p + "ffn_down.weight", rand(width, ff), gw.GGML_F32)
    w.add_tensor("output_norm.weight", 1 + rand(width, std=0.1), gw.GGML_F32)
    w.write(path)


def rms_norm(x, weight):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * weight


def rope_neox(x, positions):
    """x: [tokens, heads, hd]; qwen2 rotates element i with i + hd/2."""
    hd = x.shape[-1]
    freqs = ROPE_BASE ** (-np.arange(0, hd, 2) / hd)
    angle = positions[:, None] * freqs[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def logits(path, tokens):
    """The model's logits at every position, float64, with causal attention."""
    meta, t = gw.read_gguf(path)
    t = {name: np.asarray(a, dtype=np.float64) for name, a in t.items()}
    heads = meta["qwen2.attention.head_count"]
    kv_heads = meta["qwen2.attention.head_count_kv"]
    hd = meta["qwen2.embedding_length"] // heads
    n = len(tokens)
    positions = np.arange(n, dtype=np.float64)
    x = t["token_embd.weight"][tokens]
    for i in range(meta["qwen2.block_count"]):
        p = f"blk.{i}."
        h = rms_norm(x, t[p + "attn_norm.weight"])
        q = (h @ t[p + "attn_q.weight"].T + t[p + "attn_q.bias"]).reshape(n, heads, hd)
        k = (h @ t[p + "attn_k.weight"].T + t[p + "attn_k.bias"]).reshape(n, kv_heads, hd)
        v = (h @ t[p + "attn_v.weight"].T + t[p + "attn_v.bias"]).reshape(n, kv_heads, hd)
        q, k = rope_neox(q, positions), rope_neox(k, positions)
        out = np.zeros((n, heads, hd))
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for head in range(heads):
            g = head // (heads // kv_heads)
            s = q[:, head] @ k[:, g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, head] = (s / s.sum(axis=1, keepdims=True)) @ v[:, g]
        x = x + out.reshape(n, heads * hd) @ t[p + "attn_output.weight"].T
        h = rms_norm(x, t[p + "ffn_norm.weight"])
        gate = h @ t[p + "ffn_gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ t[p + "ffn_up.weight"].T)) @ \
            t[p + "ffn_down.weight"].T
    return rms_norm(x, t["output_norm.weight"]) @ t["token_embd.weight"].T


class ConstructedPairTest(unittest.TestCase):
    def build(self, d, noise):
        rng = np.random.default_rng(3)
        paths = {name: os.path.join(d, name + ".gguf") for name in ("d0", "t0", "draft", "target")}
        # The draft: 2 query heads sharing 1 key/value head; the target: 6 query heads in 2
        # groups of 3, more layers, wider everything; the same head size (4).
        write_qwen2(paths["d0"], width=8, layers=2, heads=2, kv_heads=1, ff=12, rng=rng)
        write_qwen2(paths["t0"], width=24, layers=4, heads=6, kv_heads=2, ff=40, rng=rng)
        subprocess.run([sys.executable, os.path.join(HERE, "spec-constructed-pair.py"),
                        "--draft-base", paths["d0"], "--base", paths["t0"],
                        "--noise", str(noise), "--draft-ffn-scale", "2",
                        "--draft-out", paths["draft"], "--out", paths["target"]], check=True)
        return paths

    def test_without_noise_the_target_computes_the_draft(self):
        tokens = [3, 17, 5, 5, 29, 0, 11]
        with tempfile.TemporaryDirectory() as d:
            paths = self.build(d, noise=0)
            draft, target = logits(paths["draft"], tokens), logits(paths["target"], tokens)
            _, d0 = gw.read_gguf(paths["d0"])
            _, dw = gw.read_gguf(paths["draft"])
            np.testing.assert_allclose(dw["blk.1.ffn_down.weight"],
                                       2 * d0["blk.1.ffn_down.weight"], rtol=1e-6)
            np.testing.assert_array_equal(dw["blk.0.attn_q.weight"], d0["blk.0.attn_q.weight"])
        # The norm's epsilon is scaled by 24 / 8 in the target: agreement to ~1e-6, not bits.
        np.testing.assert_allclose(target, draft, rtol=1e-4, atol=1e-5)
        self.assertGreater(np.abs(draft).max(), 0.1)  # not trivially zero

    def test_noise_moves_the_target_away(self):
        tokens = [3, 17, 5, 5, 29, 0, 11]
        with tempfile.TemporaryDirectory() as d:
            paths = self.build(d, noise=1.0)
            draft, target = logits(paths["draft"], tokens), logits(paths["target"], tokens)
        self.assertGreater(np.abs(target - draft).max(), 1e-2)


if __name__ == "__main__":
    unittest.main()
