#!/usr/bin/env python3
"""Builds a constructed speculative pair: a draft D and a large qwen2 target T that computes
D's function plus noise of a chosen size, so D's agreement with T is known by construction (no
trained weights of the benchmark's shape exist here).

    spec-constructed-pair.py --draft-base D0.gguf --base T0.gguf --noise S \
        --draft-out D.gguf --out T.gguf

D0 and T0 are `polychip gguf synth` files of architecture qwen2 with the same vocabulary, head
size, RoPE base and norm epsilon; T0 is the larger (the benchmark's shape, e.g. qwen2.5-0.5b).

D is D0 with ffn_down multiplied by --draft-ffn-scale (default 10). With tied embeddings and
equal weight scales, a random model's greedy token is mostly the current one or a token that
the context's mean attention output points to, so its output repeats itself; a feed-forward
output several times the embedding's size makes the next token a random function of the
current one instead, and the text stops repeating.

T is T0 with these tensors rewritten (its shape, types and bytes per token are T0's: a zero F16
weight costs what any other does):

- the residual stream holds D's in its first d = D's width dimensions and zeros elsewhere:
  token_embd rows are [D's row, 0 ...] (tied: the output matrix too);
- T's first L = D's block count layers are D's layers: D's query heads go to the first query
  heads of the corresponding key/value head group of T, its key/value heads to T's first ones,
  the feed-forward to the first rows/columns; every other weight and bias of those layers is 0,
  so nothing is written outside the first d dimensions;
- RMS norm weights (those layers' and the output's) are D's times sqrt(d / T's width): with
  zeros in the other dimensions the mean square over T's width is d / width of D's, and the
  factor undoes that (the epsilon is scaled up by width / d, negligible);
- layers L and above keep T0's random weights with attn_output and ffn_down multiplied by S:
  with S = 0 T's greedy tokens are D's (up to rounding); S sets how often they differ.

Needs numpy (Debian's /usr/bin/python3 with python3-numpy).
"""
import argparse
import math
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                "train-tiny"))
import gguf_write as gw  # noqa: E402


def hparams(meta):
    arch = meta["general.architecture"]
    if arch != "qwen2":
        sys.exit(f"architecture {arch}: only qwen2 (biased q/k/v, tied or untied output) is built")
    width = meta[f"{arch}.embedding_length"]
    heads = meta[f"{arch}.attention.head_count"]
    return {
        "width": width,
        "layers": meta[f"{arch}.block_count"],
        "heads": heads,
        "kv_heads": meta[f"{arch}.attention.head_count_kv"],
        "head_dim": width // heads,
        "ff": meta[f"{arch}.feed_forward_length"],
        "rope_base": meta.get(f"{arch}.rope.freq_base"),
        "eps": meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        "vocab": len(meta["tokenizer.ggml.tokens"]),
    }


def check_compatible(d, t):
    for key in ("head_dim", "rope_base", "eps", "vocab"):
        if d[key] != t[key]:
            sys.exit(f"draft and base differ in {key}: {d[key]} vs {t[key]}")
    for key in ("width", "layers", "kv_heads", "ff"):
        if d[key] > t[key]:
            sys.exit(f"the draft's {key} {d[key]} is larger than the base's {t[key]}")
    if d["heads"] // d["kv_heads"] > t["heads"] // t["kv_heads"]:
        sys.exit("the draft has more query heads per key/value head than the base")


def query_head_map(d, t):
    """T's query head for each of D's: same group (key/value head), same place in it."""
    d_group = d["heads"] // d["kv_heads"]
    t_group = t["heads"] // t["kv_heads"]
    return [(h // d_group) * t_group + h % d_group for h in range(d["heads"])]


def scale_matrices(tensors, selected, factor):
    for name, w in tensors.items():
        if selected(name):
            w[...] = (w.astype("float32") * factor).astype(w.dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft-base", required=True, help="the small random model D0 (gguf synth)")
    ap.add_argument("--draft-ffn-scale", type=float, default=10.0,
                    help="factor on D0's ffn_down (default 10)")
    ap.add_argument("--draft-out", required=True, help="the draft D written")
    ap.add_argument("--base", required=True, help="a random model T0 of the target's shape")
    ap.add_argument("--noise", type=float, required=True,
                    help="factor on attn_output and ffn_down of T's layers past D's")
    ap.add_argument("--out", required=True, help="the target T written")
    args = ap.parse_args()

    draft_tmp = args.draft_out + ".tmp"
    shutil.copyfile(args.draft_base, draft_tmp)
    d_meta, dt = gw.read_gguf(draft_tmp, writable=True)
    scale_matrices(dt, lambda name: name.endswith(".ffn_down.weight"), args.draft_ffn_scale)
    d = hparams(d_meta)
    t_meta, _ = gw.read_gguf(args.base)
    t = hparams(t_meta)
    check_compatible(d, t)
    if d_meta["tokenizer.ggml.tokens"] != t_meta["tokenizer.ggml.tokens"]:
        sys.exit("draft and base have different vocabularies")

    tmp = args.out + ".tmp"
    shutil.copyfile(args.base, tmp)
    _, tt = gw.read_gguf(tmp, writable=True)
    width, hd = d["width"], d["head_dim"]
    norm_scale = math.sqrt(d["width"] / t["width"])

    def put(name, value):
        """Zeroes T's tensor, then writes D's values into its leading block."""
        dst = tt[name]
        if dst.ndim != value.ndim:
            sys.exit(f"{name}: rank {dst.ndim} in the base, {value.ndim} in the draft")
        dst[...] = 0
        dst[tuple(slice(0, n) for n in value.shape)] = value

    put("token_embd.weight", dt["token_embd.weight"])
    if "output.weight" in tt:
        if "output.weight" not in dt:
            sys.exit("the base has an output matrix and the draft ties it: not built")
        put("output.weight", dt["output.weight"])
    put("output_norm.weight", dt["output_norm.weight"].astype("float32") * norm_scale)

    q_map = query_head_map(d, t)
    for layer in range(d["layers"]):
        p = f"blk.{layer}."
        for norm in ("attn_norm", "ffn_norm"):
            put(p + norm + ".weight", dt[p + norm + ".weight"].astype("float32") * norm_scale)
        # Query rows and attn_output columns move head by head; key/value heads keep their
        # index (D's g-th goes to T's g-th), so they are its leading rows.
        q_w, q_b = tt[p + "attn_q.weight"], tt[p + "attn_q.bias"]
        o_w = tt[p + "attn_output.weight"]
        q_w[...] = 0
        q_b[...] = 0
        o_w[...] = 0
        for dh, th in enumerate(q_map):
            src, dst = slice(dh * hd, (dh + 1) * hd), slice(th * hd, (th + 1) * hd)
            q_w[dst, :width] = dt[p + "attn_q.weight"][src, :]
            q_b[dst] = dt[p + "attn_q.bias"][src]
            o_w[:width, dst] = dt[p + "attn_output.weight"][:, src]
        for name in ("attn_k.weight", "attn_k.bias", "attn_v.weight", "attn_v.bias",
                     "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"):
            put(p + name, dt[p + name])
    scale_matrices(tt, lambda name: name.startswith("blk.") and
                   int(name.split(".")[1]) >= d["layers"] and
                   name.endswith((".attn_output.weight", ".ffn_down.weight")), args.noise)
    # Shared mappings: the writes are already the files' (the page cache holds them).
    os.replace(draft_tmp, args.draft_out)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
