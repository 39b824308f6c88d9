#!/usr/bin/env bash
# tp 2 on two emu devices: the device-memory comm plugin (emuccl: collectives on the devices'
# buffers, enqueued on their streams) against shm with the framework's host staging (each
# all-reduce copies the hidden states device -> host, reduces in shared memory, copies them
# back). A synthesized F16 llama of width 512 and 4 layers (8 all-reduces per step), greedy
# decoding; R alternated runs of each. Prints, as markdown, per plugin: the median decode rate,
# the median step time, and the bytes and copies each path stages through host memory per step
# (from the ranks' "dist: tp group ..." log lines).
#
# usage: bench/emuccl-tp2.sh [-r RUNS] [--tokens N]
# env:   POLYCHIP_BUILD_DIR (default: build), POLYCHIP_LLAMA_CPP_DIR (vocabulary GGUFs),
#        POLYCHIP_BENCH_CACHE (synthesized model; default ~/.cache/polychip/bench-models)
set -euo pipefail

source "$(dirname "$0")/paths.sh"
RUNS=3 TOKENS=48
while [[ $# -gt 0 ]]; do
  case "$1" in
    -r) RUNS="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

mkdir -p "$CACHE"
LAYERS=4 EMBD=512
MODEL="$CACHE/emuccl-llama-f16-${LAYERS}x${EMBD}.gguf"
if [[ ! -f "$MODEL" ]]; then
  "$PC" gguf synth --vocab "$VOCAB/ggml-vocab-llama-spm.gguf" --shape tiny --arch llama \
    --layers "$LAYERS" --embd "$EMBD" --heads 8 --kv-heads 8 --ff 1408 --type F16 --seed 5 \
    --weight-std 0.08 -q --out "$MODEL" >&2
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for p in emuccl shm; do echo "comm: {tp: $p}" > "$WORK/$p.yaml"; done

# One run: "<tok/s> <staged bytes>".
run() {
  "$PC" run -m "$MODEL" -p "Once upon a time" -n "$TOKENS" --ignore-eos \
    --config "$WORK/$1.yaml" --device emu:0,1 --tp-size 2 > /dev/null 2> "$WORK/log"
  local rate bytes
  rate=$(sed -n 's/.*generation [0-9]* tokens, [0-9.]* s, \([0-9.]*\) tok\/s.*/\1/p' "$WORK/log")
  bytes=$(sed -n "s/.*tp group through '$1' ([a-z]* memory): \([0-9]*\) bytes staged.*/\1/p" \
    "$WORK/log")
  echo "$rate ${bytes:-0}"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A RATES BYTES
for ((i = 0; i < RUNS; i++)); do
  for p in emuccl shm; do
    read -r rate bytes < <(run "$p")
    RATES[$p]+="$rate "
    BYTES[$p]=$bytes
  done
done

# Steps: the prompt's and each generated token's (one decode step each).
STEPS=$((TOKENS + 1))
echo "tp 2 on emu:0,1, llama F16 ${LAYERS} layers x ${EMBD}, $TOKENS tokens, median of $RUNS"
echo
echo "| comm | decode tok/s | step ms | bytes staged through host / step | host copies / step |"
echo "|---|---|---|---|---|"
for p in emuccl shm; do
  rate=$(tr ' ' '\n' <<< "${RATES[$p]}" | grep . | median)
  step=$(awk -v r="$rate" 'BEGIN {printf "%.2f", 1000 / r}')
  per_step=$(( ${BYTES[$p]} / STEPS ))
  # Each staged all-reduce copies device -> host and back: 2 copies, 2 per layer.
  copies=$([[ ${BYTES[$p]} -gt 0 ]] && echo $((2 * 2 * LAYERS)) || echo 0)
  echo "| $p | $rate | $step | $per_step | $copies |"
done
echo
echo "(staged bytes: rank 0's over the whole run, the prompt step included, per step)"
