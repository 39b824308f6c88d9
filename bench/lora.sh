#!/usr/bin/env bash
# The cost of LoRA adapters (docs/lora.md): `polychip bench` decode and prefill of a model with
# no adapter, 1 adapter and 4 distinct adapters (sequence s runs adapter s % 4), at rank 16 and
# 64, at batch 1 and 16; and llama.cpp's llama-bench with --lora at batch 1 on the same files
# and threads. Prints one table and each configuration's speed relative to the base model.
# Goal: rank-16 decode within 10% of the base model's speed.
#
# usage: bench/lora.sh [-s SHAPE] [-y TYPE] [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-r REPS]
#   defaults: qwen2.5-0.5b shape (qwen2 vocabulary), Q4_K_M, 2 threads, -p 128 -n 32 -r 2
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${POLYCHIP_BUILD_DIR:-$ROOT/build}/bin/polychip"
LLAMA="${POLYCHIP_LLAMA_CPP_DIR:-$HOME/.cache/polychip/llama.cpp}"
SHAPE=qwen2.5-0.5b TYPE=Q4_K_M THREADS=2 NP=128 NG=32 REPS=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    -s) SHAPE="$2"; shift 2 ;;
    -y) TYPE="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    -p) NP="$2"; shift 2 ;;
    -n) NG="$2"; shift 2 ;;
    -r) REPS="$2"; shift 2 ;;
    *) sed -n 2,9p "$0" >&2; exit 2 ;;
  esac
done
[[ -x "$BIN" ]] || { echo "missing $BIN (build the polychip target)" >&2; exit 1; }
DIR="${POLYCHIP_BENCH_DIR:-$ROOT/build/bench-models}"
mkdir -p "$DIR"
MODEL="$DIR/lora-base-$SHAPE-$TYPE.gguf"
[[ -f "$MODEL" ]] || "$BIN" gguf synth --vocab "$LLAMA/models/ggml-vocab-qwen2.gguf" \
  --shape "$SHAPE" --type "$TYPE" --quiet --out "$MODEL"
adapter() {  # rank index -> path
  local f="$DIR/lora-$SHAPE-$TYPE-r$1-$2.gguf"
  [[ -f "$f" ]] || "$BIN" gguf synth --lora-for "$MODEL" --lora-rank "$1" --lora-alpha $(( $1 * 2 )) \
    --type F16 --seed "$2" --quiet --out "$f"
  echo "$f"
}
export POLYCHIP_DEVICE_BACKEND=cpu
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
run() {  # label batch lora-flags...
  local label="$1" batch="$2"; shift 2
  "$BIN" bench --model-path "$MODEL" -t "$THREADS" -p "$NP" -n "$NG" -r "$REPS" --batch "$batch" \
    -o json "$@" > "$OUT/$label.json" 2> "$OUT/$label.log" || { cat "$OUT/$label.log" >&2; exit 1; }
  echo "$label" >> "$OUT/order"
}
for batch in 1 16; do
  run "base b$batch" "$batch"
  for rank in 16 64; do
    run "1 adapter r$rank b$batch" "$batch" --lora "a=$(adapter $rank 1)"
    flags=()
    for i in 1 2 3 4; do flags+=(--lora "a$i=$(adapter $rank $i)"); done
    run "4 adapters r$rank b$batch" "$batch" "${flags[@]}"
  done
done
LB="$LLAMA/build/bin/llama-bench"
if [[ -x "$LB" ]]; then
  "$LB" -m "$MODEL" -t "$THREADS" -p "$NP" -n "$NG" -r "$REPS" -o json > "$OUT/llama-base.json" 2>/dev/null || true
  for rank in 16 64; do
    "$LB" -m "$MODEL" -t "$THREADS" -p "$NP" -n "$NG" -r "$REPS" --lora "$(adapter $rank 1)" -o json \
      > "$OUT/llama-r$rank.json" 2>/dev/null || echo "llama-bench --lora failed (rank $rank)" >&2
  done
else
  echo "no $LB: build it with cmake --build $LLAMA/build --target llama-bench" >&2
fi
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def ours(label):
    rec = json.load(open(os.path.join(out, label + ".json")))
    rec = rec if isinstance(rec, list) else rec.get("results", [rec])
    pp = next((r["avg_ts"] for r in rec if r.get("n_prompt", 0) > 0), float("nan"))
    tg = next((r["avg_ts"] for r in rec if r.get("n_gen", 0) > 0), float("nan"))
    return pp, tg
order = open(os.path.join(out, "order")).read().split("\n")
rows = {l: ours(l) for l in order if l}
print(f"{'configuration':24} {'prefill t/s':>12} {'decode t/s':>12} {'decode vs base':>15}")
for l, (pp, tg) in rows.items():
    base = rows["base " + l.split()[-1]][1]
    print(f"{l:24} {pp:12.1f} {tg:12.1f} {tg / base:14.1%}")
for name in ["llama-base", "llama-r16", "llama-r64"]:
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p) or os.path.getsize(p) == 0:
        continue
    rec = json.load(open(p))
    pp = next((r["avg_ts"] for r in rec if r["n_prompt"] > 0), float("nan"))
    tg = next((r["avg_ts"] for r in rec if r["n_gen"] > 0), float("nan"))
    print(f"{'llama.cpp ' + name[6:] + ' b1':24} {pp:12.1f} {tg:12.1f}")
PY
