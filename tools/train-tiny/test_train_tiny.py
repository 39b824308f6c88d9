#!/usr/bin/env python3
"""Unit tests for the train-tiny pieces (fast, no corpus or training needed).

Run: /usr/bin/python3 -m unittest discover -s tools/train-tiny -p 'test_*.py'
"""
import os
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import gguf_write as gw  # noqa: E402
from model import Config, Llama, apply_rope, rope_tables  # noqa: E402

TEXT = ("And God said, Let there be light: and there was light. And God saw the light, "
        "that it was good; and God's light shall shine 1611 times.\n\n") * 20


class BpeTest(unittest.TestCase):
    def test_roundtrip_and_compression(self):
        tok = bpe.train(TEXT, 256 + 40 + len(bpe.SPECIAL_TOKENS), log=lambda *a: None)
        self.assertEqual(tok.vocab_size, 300)
        for s in [TEXT, "Ünïcödé  spaces\t\n end ", "unseen wordz 42"]:
            ids = tok.encode(s)
            self.assertEqual(tok.decode(ids), s)
        self.assertLess(len(tok.encode(TEXT)), len(TEXT.encode()) / 2)

    def test_pretokenizer_is_gpt2(self):
        self.assertEqual(bpe.GPT2_PATTERN.findall("I'm the LORD's  servant!\n\nAnd"),
                         ["I", "'m", " the", " LORD", "'s", " ", " servant", "!", "\n", "\n",
                          "And"])

    def test_byte_map_is_a_bijection_to_printables(self):
        chars = set(bpe.BYTE_TO_UNI.values())
        self.assertEqual(len(chars), 256)
        self.assertEqual(bpe.BYTE_TO_UNI[ord(" ")], "Ġ")
        self.assertEqual(bpe.BYTE_TO_UNI[ord("a")], "a")


class RopeTest(unittest.TestCase):
    def test_adjacent_pairs_match_complex_rotation(self):
        cfg = Config(dim=64, n_heads=4, ctx=16)
        cos, sin = rope_tables(cfg)
        x = torch.randn(1, 2, 16, 16)
        got = apply_rope(x, cos, sin)
        xc = torch.view_as_complex(x.reshape(1, 2, 16, 8, 2).contiguous())
        want = torch.view_as_real(xc * torch.polar(torch.ones_like(cos), torch.atan2(sin, cos)))
        torch.testing.assert_close(got, want.flatten(-2), atol=1e-5, rtol=1e-5)


class GgufTest(unittest.TestCase):
    def test_write_read_roundtrip(self):
        w = gw.GGUFWriter()
        w.add_string("general.architecture", "llama")
        w.add_u32("llama.block_count", 3)
        w.add_f32("llama.rope.freq_base", 10000.0)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_array("tokenizer.ggml.tokens", gw.T_STRING, ["a", "Ġb", "<|bos|>"])
        w.add_array("tokenizer.ggml.token_type", gw.T_INT32, [1, 1, 3])
        a = np.arange(15, dtype=np.float32).reshape(3, 5)
        b = np.linspace(-1, 1, 7).astype(np.float32)
        w.add_tensor("m.weight", a, gw.GGML_F16)
        w.add_tensor("n.weight", b, gw.GGML_F32)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "t.gguf")
            w.write(p)
            with open(p, "rb") as f:
                raw = f.read()
            meta, t = gw.read_gguf(p)
        self.assertEqual(raw[:4], b"GGUF")
        self.assertEqual(int.from_bytes(raw[4:8], "little"), 3)
        self.assertEqual(meta["llama.block_count"], 3)
        self.assertEqual(meta["tokenizer.ggml.tokens"], ["a", "Ġb", "<|bos|>"])
        self.assertEqual(meta["tokenizer.ggml.token_type"], [1, 1, 3])
        self.assertTrue(meta["tokenizer.ggml.add_bos_token"])
        self.assertEqual(t["m.weight"].dtype, np.float16)
        np.testing.assert_array_equal(t["m.weight"], a)
        np.testing.assert_array_equal(t["n.weight"], b)
        # Data section and every tensor offset are 32-byte aligned.
        self.assertEqual(len(raw) % gw.ALIGNMENT, 0)


    def test_writable_read_rewrites_tensors_in_place(self):
        w = gw.GGUFWriter()
        w.add_string("general.architecture", "llama")
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        b = np.linspace(-1, 1, 5).astype(np.float32)
        w.add_tensor("m.weight", a, gw.GGML_F16)
        w.add_tensor("n.weight", b, gw.GGML_F32)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "t.gguf")
            w.write(p)
            size = os.path.getsize(p)
            _, tw = gw.read_gguf(p, writable=True)
            tw["n.weight"][:] = 2 * b
            tw["m.weight"][1, :] = -1
            del tw
            meta, t = gw.read_gguf(p)
            self.assertEqual(os.path.getsize(p), size)
            self.assertEqual(meta["general.architecture"], "llama")
            np.testing.assert_array_equal(t["n.weight"], 2 * b)
            np.testing.assert_array_equal(t["m.weight"], [[0, 1, 2], [-1, -1, -1]])


class ModelTest(unittest.TestCase):
    def test_gqa_forward_is_causal(self):
        torch.manual_seed(0)
        cfg = Config(vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                     ctx=8)
        m = Llama(cfg).eval()
        x = torch.randint(0, 50, (1, 8))
        y = x.clone()
        y[0, 5] = (y[0, 5] + 1) % 50
        with torch.no_grad():
            a, b = m(x), m(y)
        self.assertEqual(tuple(a.shape), (1, 8, 50))
        torch.testing.assert_close(a[:, :5], b[:, :5])
        self.assertFalse(torch.allclose(a[:, 5:], b[:, 5:]))


if __name__ == "__main__":
    unittest.main()
