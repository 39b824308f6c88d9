#!/usr/bin/env python3
"""Checks models/polychip-tiny.gguf against our PyTorch code and against llama.cpp.

  1. The GGUF reads back (our reader) with the metadata and tensors llama.cpp needs.
  2. PyTorch held-out perplexity with the weights read back from the GGUF (F16-rounded).
  3. llama-tokenize gives the same ids as our tokenizer (held-out file + tricky strings).
  4. llama-perplexity on the held-out file agrees with (2).
  5. llama-simple greedy generation, printed.
Exits non-zero when a check fails. llama.cpp checks are skipped if its tools are missing.

Usage: python3 tools/train-tiny/check.py [--llama-bin DIR]
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import gguf_write as gw  # noqa: E402
from model import Config, Llama  # noqa: E402
from train import heldout_ppl  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRICKY = ["In the beginning God created the heaven and the earth.",
          "the LORD's house; they'll say: 'I'm here'  and   it's 1611, 12:30!",
          "Ünïcödé — “quotes” and tabs\tand\n\nnewlines \n end  ",
          "ZZ top 99999 x@y.z <|im_start|> not special here"]


def model_from_gguf(meta, t):
    cfg = Config(vocab_size=int(meta["llama.vocab_size"]), dim=meta["llama.embedding_length"],
                 n_layers=meta["llama.block_count"], n_heads=meta["llama.attention.head_count"],
                 n_kv_heads=meta["llama.attention.head_count_kv"],
                 ffn_dim=meta["llama.feed_forward_length"], ctx=meta["llama.context_length"],
                 rope_base=meta["llama.rope.freq_base"],
                 norm_eps=meta["llama.attention.layer_norm_rms_epsilon"])
    m = Llama(cfg)
    sd = {"tok_emb.weight": t["token_embd.weight"], "norm.weight": t["output_norm.weight"]}
    names = {"attn_norm": "attn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv",
             "attn_output": "wo", "ffn_norm": "ffn_norm", "ffn_gate": "w_gate",
             "ffn_up": "w_up", "ffn_down": "w_down"}
    for i in range(cfg.n_layers):
        for g, p in names.items():
            sd[f"blocks.{i}.{p}.weight"] = t[f"blk.{i}.{g}.weight"]
    m.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in sd.items()})
    assert np.array_equal(t["output.weight"], t["token_embd.weight"])
    return m.eval()


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "models", "polychip-tiny.gguf"))
    ap.add_argument("--heldout", default=os.path.join(REPO, "models",
                                                      "polychip-tiny.heldout.txt"))
    ap.add_argument("--llama-bin", default="/root/.cache/polychip/llama.cpp/build/bin")
    ap.add_argument("--prompt", default="And the LORD said unto Moses,")
    args = ap.parse_args()
    torch.set_num_threads(2)
    failures = []

    meta, t = gw.read_gguf(args.model)
    assert meta["general.architecture"] == "llama"
    assert meta["llama.attention.head_count_kv"] < meta["llama.attention.head_count"]
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tokens = meta["tokenizer.ggml.tokens"]
    tid = {s: i for i, s in enumerate(tokens)}
    tok = bpe.Tokenizer([(tid[a], tid[b]) for a, b in merges])
    assert [tok.token_text(i) for i in range(tok.vocab_size)] == tokens
    print(f"gguf: {len(t)} tensors, vocab {len(tokens)}, {len(merges)} merges")

    text = open(args.heldout).read()
    held = np.array(tok.encode(text))
    model = model_from_gguf(meta, t)
    bos = meta["tokenizer.ggml.bos_token_id"]
    ctx = meta["llama.context_length"]
    ppl_torch, n_chunk = heldout_ppl(model, held, bos, ctx)
    print(f"pytorch (gguf weights) held-out perplexity: {ppl_torch:.4f} over {n_chunk} chunks")
    if not ppl_torch < len(tokens) / 10:
        failures.append("perplexity not far below vocab size")

    exe = lambda name: os.path.join(args.llama_bin, name)  # noqa: E731
    if not os.path.exists(exe("llama-tokenize")):
        print("llama.cpp tools not found; skipping llama.cpp checks")
    else:
        with tempfile.TemporaryDirectory() as d:
            for i, s in enumerate([text] + TRICKY):
                p = os.path.join(d, f"{i}.txt")
                open(p, "w").write(s)
                r = run([exe("llama-tokenize"), "-m", args.model, "-f", p, "--ids", "--no-bos",
                         "--no-escape", "--no-parse-special", "--log-disable"])
                ids = eval(r.stdout.strip().splitlines()[-1])  # "[1, 2, 3]"
                ours = tok.encode(s)
                ok = ids == ours
                print(f"tokenize {'same' if ok else 'DIFFERENT'}: {len(ours)} ids, {s[:40]!r}")
                if not ok:
                    failures.append(f"tokenization differs on {s[:40]!r}")
        # Under a pty: this llama.cpp build loses its last log lines when piped.
        cmd = [exe("llama-perplexity"), "-m", args.model, "-f", args.heldout, "-c", str(ctx),
               "-b", str(ctx), "-t", "2"]
        r = run(["script", "-qec", shlex.join(cmd), "/dev/null"])
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
        if not m:
            failures.append("llama-perplexity gave no estimate")
            print((r.stdout + r.stderr)[-3000:])
        else:
            ppl_llama = float(m.group(1))
            rel = abs(ppl_llama - ppl_torch) / ppl_torch
            print(f"llama-perplexity held-out perplexity: {ppl_llama:.4f} "
                  f"(differs {100 * rel:.3f}% from pytorch)")
            if rel > 0.005:
                failures.append("llama.cpp perplexity differs by more than 0.5%")
        r = run([exe("llama-simple"), "-m", args.model, "-n", "60", args.prompt])
        out = r.stdout.strip().removeprefix("<|bos|>")
        print("llama-simple greedy:", out)
        ids = [bos] + tok.encode(args.prompt)
        with torch.no_grad():
            for _ in range(60):
                ids.append(int(model(torch.tensor([ids[-ctx:]]))[0, -1].argmax()))
        ours = tok.decode(ids[1:])
        print("pytorch greedy:     ", ours)
        if out[:80] != ours[:80]:
            print("note: greedy continuations differ in the first 80 chars (F16/F32 rounding "
                  "can flip near-ties)")
        chat = ("<|im_start|>user\nWho is the good shepherd?<|im_end|>\n"
                "<|im_start|>assistant\n")
        r = run([exe("llama-simple"), "-m", args.model, "-n", "120", chat])
        print("llama-simple chat:", r.stdout.strip().removeprefix("<|bos|>"))
    if failures:
        print("FAILED:", "; ".join(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
