#!/usr/bin/env python3
"""Trains polychip-tiny: a small llama/GQA model on the King James Bible (bible-kjv).

Stages (each skipped when its output already exists in --workdir):
  1. corpus: `bible -f "Gen1:1-Rev22:21"`, verse references stripped, one verse a line,
     a blank line between chapters; every 50th chapter is held out for evaluation.
  2. tokenizer: byte-level BPE (GPT-2 pre-tokenizer) trained on the training text.
  3. training: AdamW, warmup + cosine LR, fixed seed, checkpoints (resumable).
  4. evaluation: held-out perplexity computed the way llama-perplexity does it.
  5. export: GGUF via our own writer (gguf_write.py) to models/polychip-tiny.gguf.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import time

# torch parallelizes around BLAS calls itself; nested OpenBLAS threads only fight it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
from model import Config, Llama  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def build_corpus(args):
    raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    chapters, last = [], None
    for line in raw.splitlines():
        if not line.strip():
            continue
        ref, text = line.split(" ", 1)
        chap = ref.split(":")[0]  # e.g. "Ge1"
        if chap != last:
            chapters.append([])
            last = chap
        chapters[-1].append(text.strip())
    train, held = [], []
    for i, verses in enumerate(chapters):
        (held if i % args.heldout_every == args.heldout_every - 1 else train).append(verses)
    log(f"corpus: {len(chapters)} chapters, {len(train)} train, {len(held)} held out")
    return train, held


def chapters_text(chapters):
    return "".join("\n".join(v) + "\n\n" for v in chapters)


def chat_stream(tok, chapters, per_chapter, rng):
    """ChatML samples: the user says a verse, the assistant answers with what follows.

    Teaches the model the chat template's special tokens and to stop with <|im_end|>.
    Fragments between special tokens are encoded separately, as llama.cpp does.
    """
    sp = tok.special
    out = []
    for verses in chapters:
        if len(verses) < 3:
            continue
        for _ in range(per_chapter):
            i = rng.randrange(len(verses) - 2)
            n = rng.choice((1, 1, 2))
            user, answer = verses[i], " ".join(verses[i + 1:i + 1 + n])
            out += [sp["<|bos|>"], sp["<|im_start|>"]] + tok.encode("user\n" + user)
            out += [sp["<|im_end|>"]] + tok.encode("\n") + [sp["<|im_start|>"]]
            out += tok.encode("assistant\n" + answer) + [sp["<|im_end|>"]] + tok.encode("\n")
    return out


def prepare(args):
    os.makedirs(args.workdir, exist_ok=True)
    tok_path = os.path.join(args.workdir, "tokenizer.json")
    data_path = os.path.join(args.workdir, "data.npz")
    heldout_path = os.path.join(REPO, "models", "polychip-tiny.heldout.txt")
    if os.path.exists(tok_path) and os.path.exists(data_path):
        tok = bpe.Tokenizer.load(tok_path)
        d = np.load(data_path)
        return tok, d["text"], d["chat"], d["held"]
    train, held = build_corpus(args)
    train_text, held_text = chapters_text(train), chapters_text(held)
    os.makedirs(os.path.dirname(heldout_path), exist_ok=True)
    with open(heldout_path, "w") as f:
        f.write(held_text)
    t0 = time.time()
    tok = bpe.train(train_text, args.vocab_size, log=log)
    log(f"bpe trained in {time.time() - t0:.0f}s, vocab {tok.vocab_size}")
    tok.save(tok_path)
    text_ids = np.array(tok.encode(train_text), dtype=np.int16)
    chat_ids = np.array(chat_stream(tok, train, args.chat_per_chapter,
                                    random.Random(args.seed)), dtype=np.int16)
    held_ids = np.array(tok.encode(held_text), dtype=np.int16)
    log(f"tokens: text {len(text_ids)} ({len(train_text.encode()) / len(text_ids):.2f} B/tok),"
        f" chat {len(chat_ids)}, held-out {len(held_ids)}")
    np.savez(data_path, text=text_ids, chat=chat_ids, held=held_ids)
    return tok, text_ids, chat_ids, held_ids


def get_batch(step, args, text, chat, bos):
    """Deterministic per step: windows [bos] + stream[off:off+ctx]."""
    g = np.random.default_rng([args.seed, step])
    xs, ys = [], []
    for _ in range(args.batch):
        src = chat if g.random() < args.chat_frac else text
        off = int(g.integers(0, len(src) - args.ctx))
        w = src[off:off + args.ctx].astype(np.int64)
        xs.append(np.concatenate(([bos], w[:-1])))
        ys.append(w)
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


@torch.no_grad()
def heldout_ppl(model, held, bos, ctx):
    """llama-perplexity's method: tokens = [bos] + text; chunks of ctx with the first
    token replaced by bos; score the predictions of positions ctx/2 .. ctx-2."""
    model.eval()
    toks = np.concatenate(([bos], held.astype(np.int64)))
    n_chunk = len(toks) // ctx
    nll, count = 0.0, 0
    first = ctx // 2
    for c in range(0, n_chunk, 16):
        chunk = np.stack([toks[i * ctx:(i + 1) * ctx] for i in range(c, min(c + 16, n_chunk))])
        chunk[:, 0] = bos
        x = torch.from_numpy(chunk)
        logp = F.log_softmax(model(x).float(), dim=-1)
        tgt = x[:, first + 1:]
        lp = logp[:, first:-1].gather(-1, tgt[..., None])[..., 0]
        nll -= lp.sum().item()
        count += tgt.numel()
    model.train()
    return math.exp(nll / count), n_chunk


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(p, 1.0))))


def make_optimizer(model, args):
    """AdamW with weight decay on the matrices only (not norms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def resume(ckpt_path, model, opt, args):
    """Loads a checkpoint if there is one (not in --bench); returns (step, train_seconds)."""
    if not os.path.exists(ckpt_path) or args.bench:
        return 0, 0.0
    ck = torch.load(ckpt_path)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    log(f"resumed at step {ck['step']}")
    return ck["step"], ck["train_seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=os.path.join(os.path.dirname(__file__), "work"))
    ap.add_argument("--out", default=os.path.join(REPO, "models", "polychip-tiny.gguf"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--heldout-every", type=int, default=50)
    ap.add_argument("--chat-per-chapter", type=int, default=3)
    ap.add_argument("--chat-frac", type=float, default=0.1)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--bench", type=int, default=0, help="only time this many steps")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)

    tok, text, chat, held = prepare(args)
    bos = tok.special["<|bos|>"]
    cfg = Config(vocab_size=tok.vocab_size, dim=args.dim, n_layers=args.layers,
                 n_heads=args.heads, n_kv_heads=args.kv_heads, ffn_dim=args.ffn, ctx=args.ctx)
    model = Llama(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {cfg.to_dict()}, {n_params / 1e6:.2f}M parameters")
    opt = make_optimizer(model, args)
    ckpt_path = os.path.join(args.workdir, "ckpt.pt")
    step, train_seconds = resume(ckpt_path, model, opt, args)

    total = args.bench or args.steps
    t_last, loss_acc, n_acc = time.time(), 0.0, 0
    while step < total:
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, args)
        x, y = get_batch(step, args, text, chat, bos)
        loss = F.cross_entropy(model(x).view(-1, cfg.vocab_size), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_acc += loss.item()
        n_acc += 1
        if step % 20 == 0 or step == total:
            now = time.time()
            train_seconds += now - t_last
            tps = n_acc * args.batch * args.ctx / (now - t_last)
            log(f"step {step}/{total} loss {loss_acc / n_acc:.3f} lr {lr_at(step, args):.2e}"
                f" {tps:.0f} tok/s, {train_seconds / 60:.1f} min")
            t_last, loss_acc, n_acc = now, 0.0, 0
        if args.bench:
            continue
        if step % args.eval_every == 0 or step == total:
            ppl, _ = heldout_ppl(model, held, bos, args.ctx)
            log(f"step {step} held-out perplexity {ppl:.2f}")
            t_last = time.time()
        if step % args.ckpt_every == 0 or step == total:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "train_seconds": train_seconds, "config": cfg.to_dict()},
                       ckpt_path + ".tmp")
            os.replace(ckpt_path + ".tmp", ckpt_path)
    if args.bench:
        return

    ppl, n_chunk = heldout_ppl(model, held, bos, args.ctx)
    summary = {"config": cfg.to_dict(), "params": n_params, "steps": step,
               "tokens_seen": step * args.batch * args.ctx, "train_seconds": train_seconds,
               "heldout_ppl_torch": ppl, "heldout_chunks": n_chunk, "seed": args.seed,
               "args": vars(args)}
    log("summary:", json.dumps(summary))
    with open(os.path.join(args.workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    import export  # noqa: E402
    export.export(model, tok, args.out)
    log(f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
