#!/usr/bin/env bash
# Quantized KV caches (--kv-cache-dtype f16, q8_0, q4_0, fp8_e4m3) on the cpu plugin, printed as
# markdown tables (stdout; progress on stderr):
#
# 1. Speed at a long context: prefill (pp) and decode (tg) of one sequence with DEPTH tokens
#    already in the cache (polychip bench -d, llama-bench -d), per KV type, against f16 and
#    against llama.cpp's llama-bench -ctk/-ctv (flash attention on: llama.cpp quantizes V only
#    with it) on the same file and threads. fp8_e4m3 has no llama.cpp counterpart.
# 2. Serving capacity: the most sequences of SEQ_TOKENS tokens a fixed KV budget holds (the
#    emu plugin with a fixed device memory and --mem-fraction-static, as `serve --print-config`
#    resolves it), f16 against q8_0, and the decode throughput of that many sequences decoding
#    together at that length on the cpu plugin (polychip bench --batch N -d SEQ_TOKENS).
#
# usage: bench/kv-quant.sh [-t THREADS] [-r REPS] [-d DEPTH] [-p N_PROMPT] [-n N_GEN]
#                          [--model NAME] [--serve-model NAME] [--budget-mib MIB]
#                          [--seq-tokens N] [--skip-speed] [--skip-serving]
# models: qwen05-q4_0 (qwen2.5-0.5b, Q4_0; the speed default), qwen2-4x256-q4_0 (4 layers x 256,
#         the serving default: its prefill of many 2k-token sequences stays short)
# env:   POLYCHIP_BUILD_DIR, POLYCHIP_LLAMA_CPP_DIR, POLYCHIP_BENCH_CACHE (bench/paths.sh)
set -euo pipefail

source "$(dirname "$0")/paths.sh"
THREADS=2 REPS=1 DEPTH=4096 NP=256 NG=32
MODEL=qwen05-q4_0 SERVE_MODEL=qwen2-4x256-q4_0 BUDGET_MIB=64 SEQ_TOKENS=2048
SPEED=1 SERVING=1
TYPES="f16 q8_0 q4_0 fp8_e4m3"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t) THREADS="$2"; shift 2 ;;
    -r) REPS="$2"; shift 2 ;;
    -d) DEPTH="$2"; shift 2 ;;
    -p) NP="$2"; shift 2 ;;
    -n) NG="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --serve-model) SERVE_MODEL="$2"; shift 2 ;;
    --budget-mib) BUDGET_MIB="$2"; shift 2 ;;
    --seq-tokens) SEQ_TOKENS="$2"; shift 2 ;;
    --skip-speed) SPEED=0; shift ;;
    --skip-serving) SERVING=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { echo "[kv-quant] $*" >&2; }
[[ -x "$PC" ]] || { echo "missing $PC (build first, or set POLYCHIP_BUILD_DIR)" >&2; exit 1; }
[[ $SPEED == 0 ]] || llama_tool llama-bench
export LD_LIBRARY_PATH="$LB:${LD_LIBRARY_PATH:-}"
mkdir -p "$CACHE"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

synth() {  # name -> the file, synthesized once
  local f="$CACHE/$1.gguf"
  if [[ ! -f "$f" ]]; then
    log "synthesizing $f"
    case "$1" in
      qwen05-q4_0) "$PC" gguf synth --vocab "$VOCAB/ggml-vocab-qwen2.gguf" --shape qwen2.5-0.5b \
                     --type Q4_0 --out "$f" -q >&2 ;;
      qwen2-4x256-q4_0) "$PC" gguf synth --vocab "$VOCAB/ggml-vocab-qwen2.gguf" \
                          --shape qwen2.5-0.5b --layers 4 --embd 256 --heads 4 --kv-heads 2 \
                          --ff 512 --type Q4_0 --out "$f" -q >&2 ;;
      *) echo "unknown model $1" >&2; exit 2 ;;
    esac
  fi
  echo "$f"
}

# avg_ts of the record whose test starts with $2 in the JSON array $1 ("-" when absent).
ts() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
try:
    recs = json.load(open(sys.argv[1]))
except Exception:
    recs = []
for r in recs:
    t = r.get("test", "")
    # llama-bench: n_prompt/n_gen/n_depth; polychip: "pp256 @ d4096"
    name = t if t else ("pp%d" % r["n_prompt"] if r.get("n_prompt") else "tg%d" % r["n_gen"])
    if name.startswith(sys.argv[2]):
        print("%.2f" % r["avg_ts"]); break
else:
    print("-")
EOF
}
ratio() { python3 -c "import sys; a,b=sys.argv[1:3]; print('-' if '-' in (a,b) else '%.2f' % (float(a)/float(b)))" "$1" "$2"; }

if [[ $SPEED == 1 ]]; then
  f="$(synth "$MODEL")"
  for t in $TYPES; do
    log "$MODEL: polychip bench -d $DEPTH --kv-cache-dtype $t"
    POLYCHIP_DEVICE_BACKEND=cpu "$PC" bench --model-path "$f" -p "$NP" -n "$NG" -d "$DEPTH" \
      -r "$REPS" -t "$THREADS" --kv-cache-dtype "$t" -o json > "$OUT/ours.$t.json" \
      2> "$OUT/ours.$t.log" || { tail -5 "$OUT/ours.$t.log" >&2; echo '[]' > "$OUT/ours.$t.json"; }
    [[ $t == fp8_e4m3 ]] && continue
    log "$MODEL: llama-bench -d $DEPTH -ctk $t -ctv $t -fa 1"
    "$LB/llama-bench" -m "$f" -p "$NP" -n "$NG" -d "$DEPTH" -r "$REPS" -t "$THREADS" \
      -ctk "$t" -ctv "$t" -fa 1 -o json > "$OUT/theirs.$t.json" 2> "$OUT/theirs.$t.log" ||
      { tail -5 "$OUT/theirs.$t.log" >&2; echo '[]' > "$OUT/theirs.$t.json"; }
  done
  echo "### $MODEL, $THREADS threads, context $DEPTH already in the cache"
  echo
  echo "| KV type | test | polychip t/s | vs polychip f16 | llama.cpp t/s (-fa 1) | polychip / llama.cpp |"
  echo "| --- | --- | ---: | ---: | ---: | ---: |"
  for test in "pp$NP" "tg$NG"; do
    base="$(ts "$OUT/ours.f16.json" "$test")"
    for t in $TYPES; do
      ours="$(ts "$OUT/ours.$t.json" "$test")"
      theirs="-"
      [[ -f "$OUT/theirs.$t.json" ]] && theirs="$(ts "$OUT/theirs.$t.json" "$test")"
      echo "| $t | $test @ d$DEPTH | $ours | $(ratio "$ours" "$base") | $theirs | $(ratio "$ours" "$theirs") |"
    done
  done
  echo
fi

if [[ $SERVING == 1 ]]; then
  f="$(synth "$SERVE_MODEL")"
  # A device of BUDGET_MIB / 0.9 MiB on the emu plugin; 90% of its free memory, less the
  # weights, is the KV budget: the same bytes for every KV type.
  mem=$(( BUDGET_MIB * 10 / 9 + $(stat -c %s "$f") / 1048576 + 1 ))
  cat > "$OUT/emu.yaml" <<EOF
backend: {name: emu, params: {memory_mb: $mem}}
EOF
  echo "### $SERVE_MODEL: sequences of $SEQ_TOKENS tokens in one KV budget (emu, $mem MiB, --mem-fraction-static 0.9)"
  echo
  echo "| KV type | bytes per token | sequences that fit | vs f16 | decode t/s at that batch (cpu, $THREADS threads) |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  n_f16=0
  for t in f16 q8_0; do
    line="$("$PC" serve --print-config --config "$OUT/emu.yaml" --model-path "$f" \
              --mem-fraction-static 0.9 --context-length "$SEQ_TOKENS" \
              --max-running-requests 4096 --kv-cache-dtype "$t" 2>/dev/null | grep '# resolved')"
    bytes="$(sed -E 's/.* tokens x ([0-9]+) bytes.*/\1/' <<< "$line")"
    n="$(sed -E 's/.*room for ([0-9]+) sequence.*/\1/' <<< "$line")"
    [[ $t == f16 ]] && n_f16="$n"
    log "$t: $n sequences of $SEQ_TOKENS ($line)"
    log "$t: polychip bench --batch $n -d $SEQ_TOKENS -n $NG"
    POLYCHIP_DEVICE_BACKEND=cpu "$PC" bench --model-path "$f" -p 0 -n "$NG" -d "$SEQ_TOKENS" \
      --batch "$n" -r "$REPS" -t "$THREADS" --kv-cache-dtype "$t" -o json \
      > "$OUT/serve.$t.json" 2> "$OUT/serve.$t.log" ||
      { tail -5 "$OUT/serve.$t.log" >&2; echo '[]' > "$OUT/serve.$t.json"; }
    tput="$(ts "$OUT/serve.$t.json" "pp0+tg$NG")"
    echo "| $t | $bytes | $n | $(ratio "$n" "$n_f16") | $tput |"
  done
  echo
fi
