#!/usr/bin/env bash
# The cost of LoRA adapters (docs/lora.md): `polychip bench` decode and prefill of a model with
# no adapter, 1 adapter and 4 distinct adapters (sequence s runs adapter s % 4), at rank 16 and
# 64, at batch 1 and 16; and llama.cpp's llama-bench at batch 1 on the same files and threads,
# with --lora where its llama-bench takes it, else llama-perplexity's prefill time per pass
# without and with the adapter. Prints one table and each configuration's speed relative to the
# base model (decode at batch 1; prefill and decode together at batch 16, as bench reports them).
# llama.cpp's decode with and without an adapter comes from llama-completion (this llama-bench
# has no --lora; llama-batched-bench parses it but loads no adapter): N_GEN greedy tokens after
# a short prompt, its "eval time" rate, in as many rounds.
# The configurations run in ROUNDS rounds, one after the other within each round, and the table
# gives the median speed and the median of each round's ratio to that round's base: a shared
# VM's bandwidth drifts by a third within a minute, so only runs moments apart compare.
# The "paired" rows come from `polychip bench --lora-vs-base`: every decode position run with the
# adapters and without, alternating, in one process, so each round's ratio is taken at the same
# moments (the separate runs' ratios move by 5 points and more between rounds).
# Goal: rank-16 decode within 10% of the base model's speed (the paired rows judge it).
# With the default shape and type, each round also runs bench/decode_kernels.cc's lora mode (the
# step's matmuls without the engine): the rank-16 adapter's LORA launches after each matmul, and
# a plain read of the same bytes in their places: what reading them there costs with no kernel
# (the engine, which runs some terms two at a time, can do a little better than that at times).
#
# usage: bench/lora.sh [-s SHAPE] [-y TYPE] [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-r REPS]
#                      [-R ROUNDS]
#   defaults: qwen2.5-0.5b shape (qwen2 vocabulary), Q4_K_M, 2 threads, -p 128 -n 32 -r 2 -R 3
set -euo pipefail
source "$(dirname "$0")/paths.sh"
SHAPE=qwen2.5-0.5b TYPE=Q4_K_M THREADS=2 NP=128 NG=32 REPS=2 ROUNDS=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    -s) SHAPE="$2"; shift 2 ;;
    -y) TYPE="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    -p) NP="$2"; shift 2 ;;
    -n) NG="$2"; shift 2 ;;
    -r) REPS="$2"; shift 2 ;;
    -R) ROUNDS="$2"; shift 2 ;;
    *) sed -n 2,24p "$0" >&2; exit 2 ;;
  esac
done
[[ -x "$PC" ]] || { echo "missing $PC (build the polychip target)" >&2; exit 1; }
DIR="${POLYCHIP_BENCH_DIR:-$ROOT/build/bench-models}"
mkdir -p "$DIR"
MODEL="$DIR/lora-base-$SHAPE-$TYPE.gguf"
[[ -f "$MODEL" ]] || "$PC" gguf synth --vocab "$LLAMA_DIR/models/ggml-vocab-qwen2.gguf" \
  --shape "$SHAPE" --type "$TYPE" --quiet --out "$MODEL"
adapter() {  # rank index -> path
  local f="$DIR/lora-$SHAPE-$TYPE-r$1-$2.gguf"
  [[ -f "$f" ]] || "$PC" gguf synth --lora-for "$MODEL" --lora-rank "$1" --lora-alpha $(( $1 * 2 )) \
    --type F16 --seed "$2" --quiet --out "$f"
  echo "$f"
}
export POLYCHIP_DEVICE_BACKEND=cpu
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
run() {  # label batch lora-flags...
  local label="$1" batch="$2"; shift 2
  "$PC" bench --model-path "$MODEL" -t "$THREADS" -p "$NP" -n "$NG" -r "$REPS" --batch "$batch" \
    -o json "$@" > "$OUT/$label.r$round.json" 2> "$OUT/$label.log" || { cat "$OUT/$label.log" >&2; exit 1; }
  [[ $round -gt 1 ]] || echo "$label" >> "$OUT/order"
}
paired() {  # label lora-flags...: decode at batch 1, with and without the adapters alternating
  local label="$1"; shift
  "$PC" bench --model-path "$MODEL" -t "$THREADS" -p 0 -n "$NG" -r "$REPS" --batch 1 --lora-vs-base \
    -o json "$@" > "$OUT/paired $label.r$round.json" 2> "$OUT/paired.log" ||
    { cat "$OUT/paired.log" >&2; exit 1; }
  [[ $round -gt 1 ]] || echo "$label" >> "$OUT/paired-order"
}
if [[ "$SHAPE" == qwen2.5-0.5b && "$TYPE" == Q4_K_M && -f "$KERNELS_LIB" ]]; then
  build_decode_kernels "$OUT/decode_kernels"
fi
for round in $(seq "$ROUNDS"); do
  echo "[lora] round $round of $ROUNDS" >&2
  [[ ! -x "$OUT/decode_kernels" ]] ||
    THREADS="$THREADS" RANK=16 "$OUT/decode_kernels" lora 20 > "$OUT/kernels.r$round.txt"
  for batch in 1 16; do
    run "base b$batch" "$batch"
    for rank in 16 64; do
      run "1 adapter r$rank b$batch" "$batch" --lora "a=$(adapter $rank 1)"
      flags=()
      for i in 1 2 3 4; do flags+=(--lora "a$i=$(adapter $rank $i)"); done
      run "4 adapters r$rank b$batch" "$batch" "${flags[@]}"
    done
  done
  for rank in 16 64; do
    paired "1 adapter r$rank" --lora "a=$(adapter $rank 1)"
    flags=()
    for i in 1 2 3 4; do flags+=(--lora "a$i=$(adapter $rank $i)"); done
    paired "4 adapters r$rank" "${flags[@]}"
  done
done
LLAMA_BENCH="$LB/llama-bench" LLAMA_PPL="$LB/llama-perplexity" LLAMA_COMPLETION="$LB/llama-completion"
export LD_LIBRARY_PATH="$LB:${LD_LIBRARY_PATH:-}"
llama_tool llama-completion
if [[ -x "$LLAMA_COMPLETION" ]]; then
  PROMPT="$(head -c 300 "$ROOT/tests/data/lighthouse.txt")"
  for round in $(seq "$ROUNDS"); do
    echo "[lora] llama.cpp decode, round $round of $ROUNDS" >&2
    for rank in 0 16 64; do
      lora=()
      [[ $rank == 0 ]] || lora=(--lora "$(adapter $rank 1)")
      "$LLAMA_COMPLETION" -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n "$NG" -no-cnv --ignore-eos --temp 0 \
        "${lora[@]}" > "$OUT/llama-decode-r$rank.$round.log" 2>&1 < /dev/null ||
        echo "llama-completion failed (rank $rank)" >&2
    done
  done
else
  echo "no $LLAMA_COMPLETION: llama.cpp's decode with an adapter is not measured" >&2
fi
if [[ -x "$LLAMA_BENCH" ]]; then
  "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p "$NP" -n "$NG" -r "$REPS" -o json > "$OUT/llama-base.json" 2>/dev/null || true
  # llama-bench has no --lora (this build's): llama.cpp's prefill with an adapter comes from
  # llama-perplexity's time per pass of NP tokens (its first pass, one batch), without and with.
  if "$LLAMA_BENCH" --help 2>&1 | grep -q -- '--lora'; then
    for rank in 16 64; do
      "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p "$NP" -n "$NG" -r "$REPS" --lora "$(adapter $rank 1)" -o json \
        > "$OUT/llama-r$rank.json" 2>/dev/null || echo "llama-bench --lora failed (rank $rank)" >&2
    done
  elif [[ -x "$LLAMA_PPL" ]]; then
    TEXT="$ROOT/tests/data/lighthouse.txt"
    for rank in 0 16 64; do
      lora=()
      [[ $rank == 0 ]] || lora=(--lora "$(adapter $rank 1)")
      "$LLAMA_PPL" -m "$MODEL" -f "$TEXT" -c "$NP" -b "$NP" -t "$THREADS" --chunks 2 "${lora[@]}" \
        > "$OUT/llama-ppl-r$rank.log" 2>&1 || echo "llama-perplexity failed (rank $rank)" >&2
    done
  fi
else
  echo "no $LLAMA_BENCH: build it with cmake --build $LLAMA_DIR/build --target llama-bench" >&2
fi
python3 - "$OUT" "$NP" "$ROUNDS" <<'PY'
import json, os, re, statistics, sys
out, n_prompt, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def records(path):
    try:
        rec = json.load(open(path))
    except (OSError, ValueError):
        return []
    return rec if isinstance(rec, list) else rec.get("results", [rec])
def speeds(rec):
    # At batch > 1 polychip bench reports one record of prefill and decode together
    # ("pp128+tg32@16"): its tokens/s goes in the last column.
    nan = float("nan")
    pp = next((r["avg_ts"] for r in rec if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0), nan)
    tg = next((r["avg_ts"] for r in rec if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0), nan)
    both = next((r["avg_ts"] for r in rec if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) > 0), nan)
    return pp, tg, both
order = [l for l in open(os.path.join(out, "order")).read().split("\n") if l]
# [label][round] = (prefill, decode, pp+tg)
runs = {l: [speeds(records(os.path.join(out, f"{l}.r{r}.json"))) for r in range(1, rounds + 1)]
        for l in order}
def median(v):
    v = [x for x in v if x == x]
    return statistics.median(v) if v else float("nan")
print(f"{'configuration':28} {'prefill t/s':>12} {'decode t/s':>11} {'pp+tg t/s':>10} {'vs base':>8}"
      f"  {'each round':>10}")
for l in order:
    base = runs["base " + l.split()[-1]]
    col = 1 if runs[l][0][1] == runs[l][0][1] else 2  # decode at batch 1, pp+tg at 16
    ratios = [mine[col] / ref[col] for mine, ref in zip(runs[l], base)]
    pp, tg, both = (median([r[i] for r in runs[l]]) for i in range(3))
    print(f"{l:28} {pp:12.1f} {tg:11.1f} {both:10.1f} {median(ratios):8.1%}  "
          + " ".join(f"{x:.1%}" for x in ratios))
# The paired runs: "tgN" with the adapters and "tgN base" without, per round.
for l in [l for l in open(os.path.join(out, "paired-order")).read().split("\n") if l]:
    with_a, ratios = [], []
    for r in range(1, rounds + 1):
        rec = records(os.path.join(out, f"paired {l}.r{r}.json"))
        a = next((x["avg_ts"] for x in rec if not x["test"].endswith(" base")), float("nan"))
        b = next((x["avg_ts"] for x in rec if x["test"].endswith(" base")), float("nan"))
        with_a.append(a)
        ratios.append(a / b)
    print(f"{l + ' b1 paired':28} {'':12} {median(with_a):11.1f} {'':10} {median(ratios):8.1%}  "
          + " ".join(f"{x:.1%}" for x in ratios))
# decode_kernels lora: "... (+X%; the launches alone ..." and "in their place ... (+Y%; ...".
kernel_rows = {"r16 LORA launches, kernels": r"\(\+([0-9.]+)%; the launches alone",
               "r16 bytes, a plain read": r"in their place [0-9.]+ ms \(\+([0-9.]+)%"}
for label, pattern in kernel_rows.items():
    ratios = []
    for r in range(1, rounds + 1):
        try:
            m = re.search(pattern, open(os.path.join(out, f"kernels.r{r}.txt")).read())
        except OSError:
            m = None
        ratios.append(1 / (1 + float(m.group(1)) / 100) if m else float("nan"))
    if all(x != x for x in ratios):
        continue
    print(f"{label:28} {'':12} {'':11} {'':10} {median(ratios):8.1%}  "
          + " ".join(f"{x:.1%}" for x in ratios))
for name in ["llama-base", "llama-r16", "llama-r64"]:
    rec = records(os.path.join(out, name + ".json"))
    if not rec:
        continue
    pp, tg, _ = speeds(rec)
    print(f"{'llama.cpp ' + name[6:] + ' b1':28} {pp:12.1f} {tg:11.1f}")
def decode_rate(rank, r):  # llama-completion's "eval time" tokens/s, or nan
    try:
        text = open(os.path.join(out, f"llama-decode-r{rank}.{r}.log"), errors="replace").read()
    except OSError:
        return float("nan")
    m = re.search(r"\s eval time\s*=.*?([0-9.]+) tokens per second", text)
    return float(m.group(1)) if m else float("nan")
decode = {rank: [decode_rate(rank, r) for r in range(1, rounds + 1)] for rank in [0, 16, 64]}
for rank in [0, 16, 64]:
    if all(x != x for x in decode[rank]):
        continue
    label = "base" if rank == 0 else f"r{rank}"
    ratios = [mine / ref for mine, ref in zip(decode[rank], decode[0])]
    print(f"{'llama.cpp ' + label + ' b1 (completion)':28} {'':12} {median(decode[rank]):11.1f} "
          f"{'':10} {median(ratios):8.1%}  " + " ".join(f"{x:.1%}" for x in ratios))
for rank in [0, 16, 64]:
    p = os.path.join(out, f"llama-ppl-r{rank}.log")
    if not os.path.exists(p):
        continue
    m = re.search(r"([0-9.]+) seconds per pass", open(p, errors="replace").read())
    if m:
        label = "base" if rank == 0 else f"r{rank}"
        print(f"{'llama.cpp ' + label + ' (perplexity)':28} {n_prompt / float(m.group(1)):12.1f}")
PY
