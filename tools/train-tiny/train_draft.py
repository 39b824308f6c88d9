#!/usr/bin/env python3
"""Trains polychip-tiny-draft: a smaller model distilled from polychip-tiny, for speculative
decoding (docs/speculative-decoding.md) of the bundled model.

A draft is worth what fraction of its guesses the target keeps, so the student learns the
teacher's next-token distribution (KL(teacher || student) at every position of the same
training windows the teacher saw: Bible text and ChatML samples), not the corpus's: where the
teacher is wrong, a draft that is wrong the same way is kept. The tokenizer is the teacher's,
read from its GGUF, so both share every token id.

Stages (each skipped when its output already exists in --workdir):
  1. data: the training chapters (train.py's corpus and held-out split) and chat samples,
     tokenized with the teacher's tokenizer.
  2. distillation: AdamW, warmup + cosine LR, fixed seed, checkpoints (resumable).
  3. evaluation on the held-out chapters: perplexity, and how often the student's greedy
     token is the teacher's (the greedy acceptance rate to expect).
  4. export: GGUF (arch llama, F16 matrices) to models/polychip-tiny-draft.gguf.

Usage: /usr/bin/python3 tools/train-tiny/train_draft.py [--steps N] [--threads 1]
"""
import argparse
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import export  # noqa: E402
import gguf_write as gw  # noqa: E402
from check import model_from_gguf  # noqa: E402
from model import Config, Llama  # noqa: E402
from train import (build_corpus, chapters_text, chat_stream, get_batch, heldout_ppl,  # noqa: E402
                   lr_at, make_optimizer, resume)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def teacher_tokenizer(meta):
    tokens = meta["tokenizer.ggml.tokens"]
    tid = {s: i for i, s in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = bpe.Tokenizer([(tid[a], tid[b]) for a, b in merges])
    assert [tok.token_text(i) for i in range(tok.vocab_size)] == tokens, "tokenizer differs"
    return tok


def prepare(args, tok):
    path = os.path.join(args.workdir, "draft-data.npz")
    if os.path.exists(path):
        d = np.load(path)
        return d["text"], d["chat"], d["held"]
    os.makedirs(args.workdir, exist_ok=True)
    train, held = build_corpus(args)
    text = np.array(tok.encode(chapters_text(train)), dtype=np.int16)
    chat = np.array(chat_stream(tok, train, args.chat_per_chapter, random.Random(args.seed)),
                    dtype=np.int16)
    held_ids = np.array(tok.encode(chapters_text(held)), dtype=np.int16)
    log(f"tokens: text {len(text)}, chat {len(chat)}, held-out {len(held_ids)}")
    np.savez(path, text=text, chat=chat, held=held_ids)
    return text, chat, held_ids


@torch.no_grad()
def greedy_agreement(student, teacher, held, bos, ctx):
    """Fraction of held-out positions where the student's argmax is the teacher's."""
    student.eval()
    toks = np.concatenate(([bos], held.astype(np.int64)))
    n_chunk = len(toks) // ctx
    same = total = 0
    for c in range(0, n_chunk, 16):
        chunk = np.stack([toks[i * ctx:(i + 1) * ctx] for i in range(c, min(c + 16, n_chunk))])
        chunk[:, 0] = bos
        x = torch.from_numpy(chunk)
        same += (student(x).argmax(-1) == teacher(x).argmax(-1)).sum().item()
        total += x.numel()
    student.train()
    return same / total


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=os.path.join(os.path.dirname(__file__), "work"))
    ap.add_argument("--teacher", default=os.path.join(REPO, "models", "polychip-tiny.gguf"))
    ap.add_argument("--out", default=os.path.join(REPO, "models", "polychip-tiny-draft.gguf"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--heldout-every", type=int, default=50)  # train.py's split
    ap.add_argument("--chat-per-chapter", type=int, default=3)
    ap.add_argument("--chat-frac", type=float, default=0.1)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=384)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--bench", type=int, default=0, help="only time this many steps")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)

    meta, tensors = gw.read_gguf(args.teacher)
    tok = teacher_tokenizer(meta)
    teacher = model_from_gguf(meta, tensors)
    for p in teacher.parameters():
        p.requires_grad_(False)
    ctx = teacher.cfg.ctx
    args.ctx = ctx  # get_batch's window
    text, chat, held = prepare(args, tok)
    bos = tok.special["<|bos|>"]
    cfg = Config(vocab_size=tok.vocab_size, dim=args.dim, n_layers=args.layers,
                 n_heads=args.heads, n_kv_heads=args.kv_heads, ffn_dim=args.ffn, ctx=ctx,
                 rope_base=teacher.cfg.rope_base, norm_eps=teacher.cfg.norm_eps)
    student = Llama(cfg)
    n_params = sum(p.numel() for p in student.parameters())
    log(f"student: {cfg.to_dict()}, {n_params / 1e6:.2f}M parameters")
    opt = make_optimizer(student, args)
    ckpt_path = os.path.join(args.workdir, "draft-ckpt.pt")
    step, train_seconds = resume(ckpt_path, student, opt, args)

    total = args.bench or args.steps
    t_last, loss_acc, n_acc = time.time(), 0.0, 0
    while step < total:
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, args)
        # Other windows than the teacher's training batches (seed + 1): the same distribution.
        x, _ = get_batch(step, argparse.Namespace(**{**vars(args), "seed": args.seed + 1}),
                         text, chat, bos)
        with torch.no_grad():
            p_teacher = F.log_softmax(teacher(x).float(), dim=-1)
        logp = F.log_softmax(student(x), dim=-1)
        loss = F.kl_div(logp.view(-1, cfg.vocab_size), p_teacher.view(-1, cfg.vocab_size),
                        log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        step += 1
        loss_acc += loss.item()
        n_acc += 1
        if step % 20 == 0 or step == total:
            now = time.time()
            train_seconds += now - t_last
            log(f"step {step}/{total} kl {loss_acc / n_acc:.3f} lr {lr_at(step, args):.2e}"
                f" {n_acc * args.batch * ctx / (now - t_last):.0f} tok/s,"
                f" {train_seconds / 60:.1f} min")
            t_last, loss_acc, n_acc = now, 0.0, 0
        if args.bench:
            continue
        if step % args.eval_every == 0 or step == total:
            agree = greedy_agreement(student, teacher, held, bos, ctx)
            log(f"step {step} held-out greedy agreement with the teacher {agree:.3f}")
            t_last = time.time()
        if step % args.ckpt_every == 0 or step == total:
            torch.save({"model": student.state_dict(), "opt": opt.state_dict(), "step": step,
                        "train_seconds": train_seconds, "config": cfg.to_dict()},
                       ckpt_path + ".tmp")
            os.replace(ckpt_path + ".tmp", ckpt_path)
    if args.bench:
        return

    ppl, n_chunk = heldout_ppl(student, held, bos, ctx)
    agree = greedy_agreement(student, teacher, held, bos, ctx)
    summary = {"config": cfg.to_dict(), "params": n_params, "steps": step,
               "tokens_seen": step * args.batch * ctx, "train_seconds": train_seconds,
               "heldout_ppl_torch": ppl, "heldout_greedy_agreement": agree,
               "heldout_chunks": n_chunk, "seed": args.seed, "args": vars(args)}
    log("summary:", json.dumps(summary))
    with open(os.path.join(args.workdir, "draft-summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    export.export(student, tok, args.out, name="polychip-tiny-draft",
                  description="Draft model for speculative decoding of polychip-tiny, distilled "
                  "from it by polychip's tools/train-tiny/train_draft.py on the King James "
                  "Bible (Debian package bible-kjv)")
    log(f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
