#!/usr/bin/env python3
"""Exports a trained polychip-tiny checkpoint to GGUF (arch `llama`, F16 matrices).

Usage: python3 tools/train-tiny/export.py [--workdir DIR] [--out models/polychip-tiny.gguf]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import gguf_write as gw  # noqa: E402
from model import Config, Llama  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


DESCRIPTION = ("Tiny llama/GQA model trained by polychip's tools/train-tiny on the King "
               "James Bible (Debian package bible-kjv)")


def export(model, tok, path, name="polychip-tiny", description=DESCRIPTION):
    cfg = model.cfg
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gw.GGUFWriter()
    w.add_string("general.architecture", "llama")
    w.add_string("general.name", name)
    w.add_string("general.description", description)
    w.add_string("general.license", "public-domain")
    w.add_u32("general.file_type", 1)  # mostly F16
    w.add_u32("general.alignment", gw.ALIGNMENT)
    w.add_u32("llama.context_length", cfg.ctx)
    w.add_u32("llama.embedding_length", cfg.dim)
    w.add_u32("llama.block_count", cfg.n_layers)
    w.add_u32("llama.feed_forward_length", cfg.ffn_dim)
    w.add_u32("llama.attention.head_count", cfg.n_heads)
    w.add_u32("llama.attention.head_count_kv", cfg.n_kv_heads)
    w.add_u32("llama.rope.dimension_count", cfg.dim // cfg.n_heads)
    w.add_f32("llama.rope.freq_base", cfg.rope_base)
    w.add_f32("llama.attention.layer_norm_rms_epsilon", cfg.norm_eps)
    w.add_u32("llama.vocab_size", tok.vocab_size)

    n = tok.vocab_size
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "gpt-2")
    w.add_array("tokenizer.ggml.tokens", gw.T_STRING, [tok.token_text(i) for i in range(n)])
    w.add_array("tokenizer.ggml.token_type", gw.T_INT32,
                [3 if i >= len(tok.token_bytes) else 1 for i in range(n)])  # 3 = control
    w.add_array("tokenizer.ggml.merges", gw.T_STRING, tok.merge_strings())
    w.add_u32("tokenizer.ggml.bos_token_id", tok.special["<|bos|>"])
    # Generation ends at <|im_end|>, the end of a ChatML turn (the model was taught it).
    w.add_u32("tokenizer.ggml.eos_token_id", tok.special["<|im_end|>"])
    w.add_u32("tokenizer.ggml.eot_token_id", tok.special["<|im_end|>"])
    w.add_u32("tokenizer.ggml.padding_token_id", tok.special["<|eos|>"])
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_eos_token", False)
    w.add_string("tokenizer.chat_template", CHATML)

    f16, f32 = gw.GGML_F16, gw.GGML_F32
    w.add_tensor("token_embd.weight", sd["tok_emb.weight"], f16)  # [vocab, dim]
    for i in range(cfg.n_layers):
        p, b = f"blocks.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", sd[p + "attn_norm.weight"], f32)
        w.add_tensor(b + "attn_q.weight", sd[p + "wq.weight"], f16)        # [H*hd, dim]
        w.add_tensor(b + "attn_k.weight", sd[p + "wk.weight"], f16)        # [KV*hd, dim]
        w.add_tensor(b + "attn_v.weight", sd[p + "wv.weight"], f16)
        w.add_tensor(b + "attn_output.weight", sd[p + "wo.weight"], f16)   # [dim, H*hd]
        w.add_tensor(b + "ffn_norm.weight", sd[p + "ffn_norm.weight"], f32)
        w.add_tensor(b + "ffn_gate.weight", sd[p + "w_gate.weight"], f16)  # [ffn, dim]
        w.add_tensor(b + "ffn_up.weight", sd[p + "w_up.weight"], f16)
        w.add_tensor(b + "ffn_down.weight", sd[p + "w_down.weight"], f16)  # [dim, ffn]
    w.add_tensor("output_norm.weight", sd["norm.weight"], f32)
    # Trained tied; written out explicitly so loaders need no tying logic.
    w.add_tensor("output.weight", sd["tok_emb.weight"], f16)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w.write(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default=os.path.join(os.path.dirname(__file__), "work"))
    ap.add_argument("--out", default=os.path.join(REPO, "models", "polychip-tiny.gguf"))
    args = ap.parse_args()
    tok = bpe.Tokenizer.load(os.path.join(args.workdir, "tokenizer.json"))
    ck = torch.load(os.path.join(args.workdir, "ckpt.pt"))
    model = Llama(Config(**ck["config"]))
    model.load_state_dict(ck["model"])
    export(model, tok, args.out)
    print(f"step {ck['step']} -> {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
