#!/usr/bin/env bash
# Speculative decoding, polychip against llama.cpp's own, on the same GGUF files and threads in
# one run, single stream, greedy. Prints one markdown table (stdout; progress on stderr):
#   case | tool | k | acceptance | tokens per verification | tokens/s | speedup | % of bandwidth
# Cases (the target: the qwen2.5-0.5b shape, F16, random weights, qwen2 vocabulary):
#   self     the draft is the target itself: acceptance 1, the verification overhead and ceiling
#   trunc    a draft made of the target's first L layers (the same seed writes the same weights)
#   ngram    prompt lookup, on a prompt that holds its own continuation (the model's greedy
#            output for a first prompt, then that prompt again); llama.cpp's llama-lookup. On
#            the target (whose random text never repeats, so the lookup finds nothing) and on
#            the bundled model (trained: it continues the echo much as it did the first time)
#   trained  the bundled model (models/polychip-tiny.gguf, trained weights) with the draft
#            distilled from it (models/polychip-tiny-draft.gguf, tools/train-tiny/train_draft.py):
#            real acceptance; its speedup is against the bundled model without speculation
#   constructed  a CONSTRUCTED pair at the target's shape (bench/spec-constructed-pair.py): a
#            small random qwen2 draft (2 layers, width 128, the same vocabulary) and a target
#            that computes the draft's function in its first 2 layers plus the noise of 22
#            random layers scaled by --noise (default 0.006: acceptance ~0.83 at k 4); it reads
#            the full shape's bytes per token. Agreement known by construction, not training;
#            its speedup is against that target without speculation. Needs numpy
#            (POLYCHIP_PYTHON, default /usr/bin/python3).
# polychip: `polychip run` with and without --speculative-*; llama.cpp: llama-bench tg (no
# speculation), llama-speculative (-md, --spec-draft-n-max k, --spec-draft-n-min 0,
# --spec-draft-p-min 0: it drafts
# k every step, as ours does) and llama-lookup (--spec-draft-n-max k).
# "speedup" is against the same tool without speculation; "% of bandwidth": tokens/s x the
# target's bytes per token / this machine's read bandwidth with the same threads (above 100%:
# past the single stream's memory-bandwidth limit).
#
# Every tokens/s is the median of -r runs (default 3), llama-bench's of its own -r.
# env BEFORE_PLUGIN_DIR: also the none and self cases with the cpu plugin found there (an older
# build's, for a before/after in one run).
# usage: bench/speculative.sh [-t THREADS] [-n N_GEN] [-k K] [--layers L] [--shape S] [-r R]
#                             [--tiny-n N_GEN of the bundled model's case, default 200]
#                             [--cases self,trunc,ngram,trained,constructed (default: all)]
#                             [--noise S of the constructed pair, default 0.006]
# ("none", the target without speculation for both tools, always runs.)
# env:   POLYCHIP_BUILD_DIR, POLYCHIP_LLAMA_CPP_DIR, POLYCHIP_BENCH_CACHE (bench/paths.sh)
set -euo pipefail

source "$(dirname "$0")/paths.sh"
THREADS=2 NG=64 K=4 LAYERS=6 SHAPE=qwen2.5-0.5b ROUNDS=3 TNG=200
CASES=self,trunc,ngram,trained,constructed NOISE=0.006
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t) THREADS="$2"; shift 2 ;;
    -n) NG="$2"; shift 2 ;;
    -k) K="$2"; shift 2 ;;
    --layers) LAYERS="$2"; shift 2 ;;
    --shape) SHAPE="$2"; shift 2 ;;
    -r) ROUNDS="$2"; shift 2 ;;
    --tiny-n) TNG="$2"; shift 2 ;;
    --cases) CASES="$2"; shift 2 ;;
    --noise) NOISE="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { echo "[speculative] $*" >&2; }
want() { [[ ",$CASES," == *",$1,"* ]]; }
for c in ${CASES//,/ }; do
  [[ "$c" =~ ^(self|trunc|ngram|trained|constructed)$ ]] || { echo "unknown case $c" >&2; exit 2; }
done
[[ -x "$PC" ]] || { echo "missing $PC (build first, or set POLYCHIP_BUILD_DIR)" >&2; exit 1; }
for tool in llama-speculative llama-lookup llama-bench; do
  llama_tool "$tool"
  [[ -x "$LB/$tool" ]] || { echo "missing $LB/$tool" >&2; exit 1; }
done
export LD_LIBRARY_PATH="$LB:${LD_LIBRARY_PATH:-}"
export POLYCHIP_DEVICE_BACKEND="${POLYCHIP_DEVICE_BACKEND:-cpu}"
mkdir -p "$CACHE"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

TARGET="$CACHE/spec-$SHAPE-f16.gguf"
DRAFT="$CACHE/spec-$SHAPE-f16-l$LAYERS.gguf"
synth() {  # out [extra flags]
  local out="$1"; shift
  [[ -f "$out" ]] && return
  log "synthesizing $out"
  "$PC" gguf synth --vocab "$VOCAB/ggml-vocab-qwen2.gguf" --shape "$SHAPE" --type F16 --seed 7 \
    --weight-std 0.04 --quiet --out "$out.tmp" "$@" >&2
  mv "$out.tmp" "$out"
}
synth "$TARGET"
want trunc && synth "$DRAFT" --layers "$LAYERS"

PROMPT="The history of the lighthouse begins with fires lit on hills"
# The ngram case's prompt: the first prompt, the target's greedy continuation, the prompt again.
if want ngram; then
  log "the target's greedy continuation (for the ngram prompt)"
  CONT="$("$PC" run -m "$TARGET" -t "$THREADS" -p "$PROMPT" -n "$NG" --ignore-eos 2>/dev/null)"
  ECHO="$PROMPT$CONT
$PROMPT"
fi

# Generated tokens/s from polychip run's timings line; acceptance and tokens per verification
# step from its speculative line (- without).
pc_run_once() {  # name prompt [flags]
  local name="$1" prompt="$2"; shift 2
  log "polychip $name"
  "$PC" run -m "${PC_MODEL:-$TARGET}" -t "$THREADS" -p "$prompt" -n "$NG" --ignore-eos "$@" \
    >"$OUT/$name.txt" 2>"$OUT/$name.err" || { cat "$OUT/$name.err" >&2; exit 1; }
  local tps acc len
  tps=$(sed -n 's/.*generation [0-9]* tokens, [0-9.]* s, \([0-9.]*\) tok\/s.*/\1/p' "$OUT/$name.err")
  acc=$(sed -n 's/.*(acceptance \([0-9.]*\)).*/\1/p' "$OUT/$name.err")
  len=$(sed -n 's/.*| \([0-9.]*\) tokens per verification step.*/\1/p' "$OUT/$name.err")
  # Speculation that never proposed (an n-gram lookup that found no match) verified nothing.
  if grep -q '| 0 verification steps' "$OUT/$name.err"; then acc="no-drafts" len="-"; fi
  log "polychip $name: $(grep -h -E '^(timings|speculative):' "$OUT/$name.err" | tr '\n' ' ')"
  echo "${tps:-0} ${acc:--} ${len:--}"
}
# llama-speculative / llama-lookup: decoded speed, acceptance (n_accept / n_drafted), and
# tokens per target step (n_predict / (n_predict - n_accept), the steps that emitted them).
ll_run_once() {  # name tool prompt [flags]
  local name="ll-$1" tool="$2" prompt="$3"; shift 3  # its own files: polychip's are compared
  log "llama.cpp ${name#ll-}"
  "$LB/$tool" -m "${PC_MODEL:-$TARGET}" -t "$THREADS" -tb "$THREADS" -p "$prompt" -n "$NG" --temp 0 -s 1 \
    --spec-draft-n-max "$K" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err" ||
    { tail -20 "$OUT/$name.err" >&2; exit 1; }
  awk '/decoded .* tokens in/ { for (i = 1; i <= NF; ++i) if ($i == "speed:") tps = $(i + 1) }
       /n_predict *=/ { np = $NF } /n_drafted *=/ { nd = $NF } /n_accept *=/ { na = $NF }
       END { acc = nd > 0 ? sprintf("%.3f", na / nd) : "-";
             len = np - na > 0 ? sprintf("%.2f", np / (np - na)) : "-";
             print (tps == "" ? 0 : tps), acc, len }' "$OUT/$name.err"
}

# Each measurement R times (the host is shared: load comes and goes), the median tokens/s; the
# acceptance and tokens per verification are those of the last run (greedy: the same each time).
median_of() {  # fn args...: prints "median-tps acc len"
  local runs=() line last
  for _ in $(seq "$ROUNDS"); do
    line="$("$@")"
    runs+=("${line%% *}")
    last="$line"
  done
  local med
  med=$(printf '%s\n' "${runs[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
  log "tokens/s of the $ROUNDS runs: ${runs[*]} (median $med)"
  echo "$med ${last#* }"
}
pc_run() { median_of pc_run_once "$@"; }
ll_run() { median_of ll_run_once "$@"; }

log "read bandwidth, $THREADS threads"
BW=$("$PC" bench --membw -t "$THREADS" -o json | sed -n 's/.*"read_gbps": \([0-9.]*\).*/\1/p')
BPT=$("$PC" bench -m "$TARGET" -t "$THREADS" -p 0 -n 1 -r 1 -o json 2>/dev/null |
      sed -n 's/.*"bytes_per_token": \([0-9]*\).*/\1/p' | head -1)
log "bandwidth $BW GB/s, $BPT bytes per token"

log "llama.cpp without speculation (llama-bench tg$NG)"
LL_BASE=$("$LB/llama-bench" -m "$TARGET" -t "$THREADS" -p 0 -n "$NG" -r "$ROUNDS" -o json 2>/dev/null |
          sed -n 's/.*"avg_ts": \([0-9.]*\).*/\1/p' | head -1)
read -r PC_BASE _ _ <<<"$(pc_run base "$PROMPT")"
want ngram && read -r PC_BASE_ECHO _ _ <<<"$(pc_run base-echo "$ECHO")"

rows=()
row() {  # case tool k acc len tps base [bytes per token]
  local pct speed
  pct=$(awk -v t="$6" -v b="${8:-$BPT}" -v bw="$BW" 'BEGIN { printf "%.0f%%", (bw > 0 ? 100 * t * b / (bw * 1e9) : 0) }')
  speed=$(awk -v t="$6" -v b="$7" 'BEGIN { printf "%.2fx", (b > 0 ? t / b : 0) }')
  rows+=("| $1 | $2 | $3 | $4 | $5 | $6 | $speed | $pct |")
}
row "none" "polychip" - - 1 "$PC_BASE" "$PC_BASE"
row "none" "llama.cpp" - - 1 "$LL_BASE" "$LL_BASE"
SPEC=(--speculative-num-draft-tokens "$K")
if want self; then
  read -r t a l <<<"$(pc_run self "$PROMPT" --speculative-draft-model "$TARGET" "${SPEC[@]}")"
  row "self (draft = target)" "polychip" "$K" "$a" "$l" "$t" "$PC_BASE"
  read -r t a l <<<"$(ll_run self llama-speculative "$PROMPT" -md "$TARGET" --spec-draft-n-min 0 --spec-draft-p-min 0)"
  row "self (draft = target)" "llama.cpp" "$K" "$a" "$l" "$t" "$LL_BASE"
fi
# A before/after of a plugin change in the same run: BEFORE_PLUGIN_DIR holds the older build's
# libpolychip_backend_cpu.so (POLYCHIP_PLUGIN_PATH is searched first).
if [[ -n "${BEFORE_PLUGIN_DIR:-}" ]] && want self; then
  read -r t _ _ <<<"$(POLYCHIP_PLUGIN_PATH="$BEFORE_PLUGIN_DIR" pc_run base-before "$PROMPT")"
  BEFORE_BASE=$t
  row "none, before" "polychip" - - 1 "$t" "$t"
  read -r t a l <<<"$(POLYCHIP_PLUGIN_PATH="$BEFORE_PLUGIN_DIR" pc_run self-before "$PROMPT" --speculative-draft-model "$TARGET" "${SPEC[@]}")"
  row "self (draft = target), before" "polychip" "$K" "$a" "$l" "$t" "$BEFORE_BASE"
fi
if want trunc; then
  read -r t a l <<<"$(pc_run trunc "$PROMPT" --speculative-draft-model "$DRAFT" "${SPEC[@]}")"
  row "trunc ($LAYERS layers)" "polychip" "$K" "$a" "$l" "$t" "$PC_BASE"
  read -r t a l <<<"$(ll_run trunc llama-speculative "$PROMPT" -md "$DRAFT" --spec-draft-n-min 0 --spec-draft-p-min 0)"
  row "trunc ($LAYERS layers)" "llama.cpp" "$K" "$a" "$l" "$t" "$LL_BASE"
fi
if want ngram; then
  read -r t a l <<<"$(pc_run ngram "$ECHO" --speculative-algorithm ngram "${SPEC[@]}")"
  row "ngram (echo prompt)" "polychip" "$K" "$a" "$l" "$t" "$PC_BASE_ECHO"
  read -r t a l <<<"$(ll_run ngram llama-lookup "$ECHO")"
  row "ngram (echo prompt)" "llama.cpp" "$K" "$a" "$l" "$t" "$LL_BASE"
fi
# The constructed pair: the draft from a small synthesized model, the target from $TARGET
# (bench/spec-constructed-pair.py says how); both cached, the target's name holding the noise.
PY="${POLYCHIP_PYTHON:-/usr/bin/python3}"
CDRAFT="$CACHE/spec-constructed-draft-2x128-f16.gguf"
CTARGET="$CACHE/spec-constructed-$SHAPE-f16-noise$NOISE.gguf"
if want constructed && ! "$PY" -c 'import numpy' 2>/dev/null; then
  log "$PY has no numpy (apt-get install python3-numpy, or set POLYCHIP_PYTHON): the constructed case is skipped"
elif want constructed; then
  if [[ ! -f "$CTARGET" || ! -f "$CDRAFT" ]]; then
    log "building the constructed pair ($CDRAFT, $CTARGET)"
    "$PC" gguf synth --vocab "$VOCAB/ggml-vocab-qwen2.gguf" --shape "$SHAPE" --layers 2 --embd 128 \
      --heads 2 --kv-heads 1 --ff 512 --type F16 --seed 11 --weight-std 0.04 --quiet \
      --out "$OUT/draft-base.gguf" >&2
    "$PY" "$ROOT/bench/spec-constructed-pair.py" --draft-base "$OUT/draft-base.gguf" \
      --base "$TARGET" --noise "$NOISE" --draft-out "$CDRAFT" --out "$CTARGET" >&2
  fi
  C_LL_BASE=$("$LB/llama-bench" -m "$CTARGET" -t "$THREADS" -p 0 -n "$NG" -r "$ROUNDS" -o json 2>/dev/null |
              sed -n 's/.*"avg_ts": \([0-9.]*\).*/\1/p' | head -1)
  PC_MODEL=$CTARGET
  read -r C_BASE _ _ <<<"$(pc_run constructed-base "$PROMPT")"
  row "none (constructed target)" "polychip" - - 1 "$C_BASE" "$C_BASE"
  row "none (constructed target)" "llama.cpp" - - 1 "$C_LL_BASE" "$C_LL_BASE"
  read -r t a l <<<"$(pc_run constructed "$PROMPT" --speculative-draft-model "$CDRAFT" "${SPEC[@]}")"
  row "constructed pair, noise $NOISE" "polychip" "$K" "$a" "$l" "$t" "$C_BASE"
  read -r t a l <<<"$(ll_run constructed llama-speculative "$PROMPT" -md "$CDRAFT" --spec-draft-n-min 0 --spec-draft-p-min 0)"
  row "constructed pair, noise $NOISE" "llama.cpp" "$K" "$a" "$l" "$t" "$C_LL_BASE"
  unset PC_MODEL
  # A random model's greedy text can collapse into repeating one token; say how many of the
  # generated tokens are distinct (one more run, not timed).
  C_DISTINCT=$("$PC" run -m "$CTARGET" -t "$THREADS" -p "$PROMPT" -n "$NG" --ignore-eos --print-tokens 2>&1 >/dev/null |
               awk '/^token / { seen[$2] = 1; n++ } END { print length(seen) " distinct of " n }')
  C_NOTE="constructed target greedy output: $C_DISTINCT tokens; "
  log "$C_NOTE"
  cmp -s "$OUT/constructed-base.txt" "$OUT/constructed.txt" ||
    { log "WARNING: polychip constructed-pair output differs from base:"; diff "$OUT/constructed-base.txt" "$OUT/constructed.txt" >&2 || true; }
fi
# The bundled model and its trained draft (tokens of its own vocabulary, a Bible-like prompt;
# the draft's context is the model's, 256).
TINY="$ROOT/models/polychip-tiny.gguf" TINY_DRAFT="$ROOT/models/polychip-tiny-draft.gguf"
TINY_PROMPT="And it came to pass, when the king heard the words of the law, that"
if want trained || want ngram; then
  TINY_BPT=$("$PC" bench -m "$TINY" -t "$THREADS" -p 0 -n 1 -r 1 -o json 2>/dev/null |
             sed -n 's/.*"bytes_per_token": \([0-9]*\).*/\1/p' | head -1)
  TINY_LL_BASE=$("$LB/llama-bench" -m "$TINY" -t "$THREADS" -p 0 -n "$TNG" -r "$ROUNDS" -o json 2>/dev/null |
                 sed -n 's/.*"avg_ts": \([0-9.]*\).*/\1/p' | head -1)
  NG_SAVED=$NG NG=$TNG PC_MODEL=$TINY
  read -r TINY_BASE _ _ <<<"$(pc_run tiny-base "$TINY_PROMPT")"
  row "none (bundled model)" "polychip" - - 1 "$TINY_BASE" "$TINY_BASE" "$TINY_BPT"
  row "none (bundled model)" "llama.cpp" - - 1 "$TINY_LL_BASE" "$TINY_LL_BASE" "$TINY_BPT"
  NG=$NG_SAVED
  unset PC_MODEL
fi
# n-gram lookup where it can pay: a random model's text never repeats its context, so on the
# qwen2.5-0.5b shape the lookup finds nothing; the bundled model, trained, continues an echo of
# its own text (the prompt, its greedy continuation, the prompt again) much as it did the
# first time, which the lookup proposes.
if want ngram; then
  NG_SAVED=$NG NG=$TNG PC_MODEL=$TINY
  log "the bundled model's greedy continuation (for its ngram prompt)"
  TINY_CONT="$("$PC" run -m "$TINY" -t "$THREADS" -p "$TINY_PROMPT" -n "$TNG" --ignore-eos 2>/dev/null)"
  TINY_ECHO="$TINY_PROMPT$TINY_CONT
$TINY_PROMPT"
  read -r TINY_BASE_ECHO _ _ <<<"$(pc_run tiny-base-echo "$TINY_ECHO")"
  read -r t a l <<<"$(pc_run tiny-ngram "$TINY_ECHO" --speculative-algorithm ngram "${SPEC[@]}")"
  row "ngram (echo prompt, bundled model)" "polychip" "$K" "$a" "$l" "$t" "$TINY_BASE_ECHO" "$TINY_BPT"
  read -r t a l <<<"$(ll_run tiny-ngram llama-lookup "$TINY_ECHO")"
  row "ngram (echo prompt, bundled model)" "llama.cpp" "$K" "$a" "$l" "$t" "$TINY_LL_BASE" "$TINY_BPT"
  NG=$NG_SAVED
  unset PC_MODEL
  cmp -s "$OUT/tiny-base-echo.txt" "$OUT/tiny-ngram.txt" ||
    { log "WARNING: polychip ngram output on the bundled model differs:"; diff "$OUT/tiny-base-echo.txt" "$OUT/tiny-ngram.txt" >&2 || true; }
fi
if ! want trained; then
  :
elif [[ -f "$TINY_DRAFT" ]]; then
  NG_SAVED=$NG NG=$TNG PC_MODEL=$TINY
  read -r t a l <<<"$(pc_run trained "$TINY_PROMPT" --speculative-draft-model "$TINY_DRAFT" "${SPEC[@]}")"
  row "trained draft" "polychip" "$K" "$a" "$l" "$t" "$TINY_BASE" "$TINY_BPT"
  read -r t a l <<<"$(ll_run trained llama-speculative "$TINY_PROMPT" -md "$TINY_DRAFT" --spec-draft-n-min 0 --spec-draft-p-min 0)"
  row "trained draft" "llama.cpp" "$K" "$a" "$l" "$t" "$TINY_LL_BASE" "$TINY_BPT"
  NG=$NG_SAVED
  unset PC_MODEL
  cmp -s "$OUT/tiny-base.txt" "$OUT/trained.txt" ||
    { log "WARNING: polychip trained-draft output differs from base:"; diff "$OUT/tiny-base.txt" "$OUT/trained.txt" >&2 || true; }
else
  log "no $TINY_DRAFT: the trained-draft case is skipped"
fi

# Greedy output is the same with and without speculation.
for name in self trunc; do
  want "$name" || continue
  cmp -s "$OUT/base.txt" "$OUT/$name.txt" ||
    { log "WARNING: polychip $name output differs from base:"; diff "$OUT/base.txt" "$OUT/$name.txt" >&2 || true; }
done
if want ngram; then
  cmp -s "$OUT/base-echo.txt" "$OUT/ngram.txt" ||
    { log "WARNING: polychip ngram output differs:"; diff "$OUT/base-echo.txt" "$OUT/ngram.txt" >&2 || true; }
fi

echo "$SHAPE F16, $THREADS threads, $NG tokens, greedy; read bandwidth $BW GB/s, $BPT bytes per token;" \
  "bundled model: ${TINY_BPT:-?} bytes per token, $TNG tokens;" \
  "${C_NOTE:-}load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| case | tool | k | acceptance | tokens per verification | tokens/s | speedup | % of bandwidth |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
printf '%s\n' "${rows[@]}"
