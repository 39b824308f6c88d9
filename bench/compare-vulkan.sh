#!/usr/bin/env bash
# Compares the polychip Vulkan plugin with llama.cpp's own Vulkan backend on the same GGUF files,
# same threads, in one run, both on Mesa's lavapipe (a CPU Vulkan driver) with every layer on the
# device (llama-bench -ngl 99), and prints one markdown table (stdout; progress on stderr):
#   model | test | polychip vulkan t/s | llama.cpp vulkan t/s | ratio | polychip cpu t/s
# The models are small synthesized qwen2 shapes (lavapipe is slow; the 0.5B model is for
# correctness, not speed), 4 layers x 256 wide (ff 704), the qwen2 vocabulary (151,936 tokens,
# so decode is mostly the output matrix): qwen2t-* tie the output to token_embd as Qwen2.5-0.5B
# does (in the K-quant mixtures token_embd is then Q6_K, as llama-quantize makes it), qwen2u-*
# have their own output.weight (Q6_K in the mixtures; token_embd the base type). Types: f16,
# q8_0, q4_0, q4_k_m; 8x512 (8 layers x 512, ff 1408) on request.
#
# What llama.cpp runs where: on lavapipe it keeps token_embd, and with this vocabulary the
# output matrix too, in host memory ("tensor 'token_embd.weight' (and 1 others) cannot be used
# with preferred buffer type Vulkan_Host, using CPU instead" under -v; GGML_VK_PERF_LOGGER=1
# lists no vocabulary-sized MUL_MAT), so its decode runs the layers on lavapipe and the output
# projection on its own CPU backend, while polychip runs every op on the device. qwen2s-* (on
# request: untied, llama-spm's 32,000-token vocabulary) is a shape whose output matrix
# llama.cpp keeps on the device, both programs then all on lavapipe.
#
# llama.cpp's Vulkan build: node-llama-cpp@3.21.1's own prebuilt one (npm package
# @node-llama-cpp/linux-x64-vulkan: libggml-vulkan.so loaded as a ggml backend, libllama, ...).
# The first run compiles llama.cpp's llama-bench from the oracle's source tree (the same
# release, tests/setup/fetch-llama-cpp.sh) against those libraries into the cache folder
# (about a minute); later runs reuse it.
#
# usage: bench/compare-vulkan.sh [-t THREADS] [-r REPS] [-p N_PROMPT] [-n N_GEN]
#                                [--models "qwen2t-4x256-f16 ..."]
# env:   POLYCHIP_BUILD_DIR (default: build; needs bin/polychip and the vulkan and cpu plugins),
#        POLYCHIP_LLAMA_CPP_DIR (the oracle's source, for llama-bench and the vocabulary GGUFs),
#        POLYCHIP_LLAMA_VULKAN_DIR (llama-bench linked to the prebuilt Vulkan libraries;
#        default ~/.cache/polychip/llama-vulkan), POLYCHIP_BENCH_CACHE (synthesized models)
set -euo pipefail

source "$(dirname "$0")/paths.sh"
THREADS=2 REPS=3 NP=128 NG=32
MODELS="qwen2t-4x256-f16 qwen2t-4x256-q8_0 qwen2t-4x256-q4_0 qwen2t-4x256-q4_k_m
        qwen2u-4x256-f16 qwen2u-4x256-q8_0 qwen2u-4x256-q4_0 qwen2u-4x256-q4_k_m"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t) THREADS="$2"; shift 2 ;;
    -r) REPS="$2"; shift 2 ;;
    -p) NP="$2"; shift 2 ;;
    -n) NG="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { echo "[compare-vulkan] $*" >&2; }
[[ -x "$PC" ]] || { echo "missing $PC (build first, or set POLYCHIP_BUILD_DIR)" >&2; exit 1; }
[[ -f "$LLAMA_DIR/tools/llama-bench/llama-bench.cpp" ]] ||
  { echo "missing llama.cpp source in $LLAMA_DIR (run tests/setup/fetch-llama-cpp.sh)" >&2; exit 1; }

# ---- llama.cpp's Vulkan llama-bench, built once ----------------------------------------------
NPM_DIR="${POLYCHIP_CACHE:-$HOME/.cache/polychip}/npm"
VK_PKG="$NPM_DIR/node_modules/@node-llama-cpp/linux-x64-vulkan"
VK_BINS="$VK_PKG/bins/linux-x64-vulkan"
LV="${POLYCHIP_LLAMA_VULKAN_DIR:-$HOME/.cache/polychip/llama-vulkan}"
if [[ ! -x "$LV/llama-bench" ]]; then
  if [[ ! -f "$VK_BINS/libggml-vulkan.so" ]]; then
    log "installing @node-llama-cpp/linux-x64-vulkan@3.21.1 into $NPM_DIR"
    mkdir -p "$NPM_DIR"
    npm install --no-audit --no-fund --ignore-scripts --no-save --prefix "$NPM_DIR" \
      "@node-llama-cpp/linux-x64-vulkan@3.21.1" >&2
  fi
  log "building llama-bench against the prebuilt Vulkan libraries in $LV (about a minute)"
  mkdir -p "$LV"
  # ggml looks for its backends (libggml-vulkan.so, libggml-cpu-*.so) beside the executable;
  # the rpath finds the linked libraries there too.
  for f in "$VK_BINS"/*.so; do ln -sf "$f" "$LV/"; done
  nice -n 10 g++ -std=c++17 -O2 -DNDEBUG -I"$LLAMA_DIR/include" -I"$LLAMA_DIR/ggml/include" \
    -I"$LLAMA_DIR/common" -I"$LLAMA_DIR/tools/llama-bench" -I"$LLAMA_DIR/vendor" \
    "$LLAMA_DIR/tools/llama-bench/llama-bench.cpp" "$LLAMA_DIR/tools/llama-bench/main.cpp" \
    -o "$LV/llama-bench.tmp" -L"$LV" -l:libllama-common.so -l:libllama.vulkan.v0.4.0.so \
    -l:libggml.vulkan.v0.4.0.so -l:libggml-base.so -pthread -Wl,-rpath,'$ORIGIN'
  mv "$LV/llama-bench.tmp" "$LV/llama-bench"
fi

# Both on lavapipe with the same threads: llama.cpp skips CPU Vulkan devices unless told.
export GGML_VK_VISIBLE_DEVICES=0 LP_NUM_THREADS="$THREADS"
mkdir -p "$CACHE"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

# name -> the synth arguments: qwen2t-LxE-TYPE (tied, the qwen2.5-0.5b shape resized),
# qwen2u-LxE-TYPE (untied: no shape preset, the qwen2 architecture's own defaults), qwen2s-LxE-TYPE
# (qwen2u's with llama-spm's vocabulary).
synth_args() {
  local name="$1" kind dims type layers embd heads ff
  IFS=- read -r kind dims type <<< "$name"
  [[ -n "$type" ]] || { echo "unknown model $name" >&2; exit 2; }
  case "$dims" in
    4x256) layers=4 embd=256 heads=4 ff=704 ;;
    8x512) layers=8 embd=512 heads=8 ff=1408 ;;
    *) echo "unknown model $name" >&2; exit 2 ;;
  esac
  case "$kind" in
    qwen2t) echo "--vocab $VOCAB/ggml-vocab-qwen2.gguf --shape qwen2.5-0.5b" ;;
    qwen2u) echo "--vocab $VOCAB/ggml-vocab-qwen2.gguf --arch qwen2" ;;
    qwen2s) echo "--vocab $VOCAB/ggml-vocab-llama-spm.gguf --arch qwen2" ;;
    *) echo "unknown model $name" >&2; exit 2 ;;
  esac
  echo "--layers $layers --embd $embd --heads $heads --kv-heads 2 --ff $ff --type ${type^^}"
}

for m in $MODELS; do
  f="$CACHE/$m.gguf"
  [[ -f "$f" ]] && continue
  args="$(synth_args "$m" | tr '\n' ' ')"
  log "synthesizing $f ($args)"
  # shellcheck disable=SC2086
  "$PC" gguf synth $args --out "$f" -q >&2
done

run() {  # label, output, command...
  local label="$1" out="$2"; shift 2
  log "$label"
  "$@" > "$out.json" 2> "$out.log" || { tail -5 "$out.log" >&2; echo '[]' > "$out.json"; }
}
for m in $MODELS; do
  f="$CACHE/$m.gguf"
  run "$m: polychip bench --device vulkan:0" "$OUT/$m.vk" \
    "$PC" bench --device vulkan:0 -m "$f" -p "$NP" -n "$NG" -r "$REPS" -t "$THREADS" -o json
  run "$m: llama-bench (Vulkan, -ngl 99)" "$OUT/$m.llama" \
    "$LV/llama-bench" -m "$f" -p "$NP" -n "$NG" -r "$REPS" -t "$THREADS" -ngl 99 -o json
  run "$m: polychip bench --device cpu:0" "$OUT/$m.cpu" \
    "$PC" bench --device cpu:0 -m "$f" -p "$NP" -n "$NG" -r "$REPS" -t "$THREADS" -o json
done

python3 - "$OUT" "$THREADS" "$MODELS" <<'PY'
import json, sys
out, threads, models = sys.argv[1], sys.argv[2], sys.argv[3].split()
def load(p):
    try:
        with open(p) as f: return json.load(f)
    except Exception: return []
def pick(rows, kind):
    return next((r for r in rows if (r["n_prompt"] > 0) == (kind == "pp")
                 and r.get("n_seqs", 1) == 1), None)
def fmt(r): return f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}" if r else "n/a"
vk_dev = next((r.get("backends", "") for m in models for r in load(f"{out}/{m}.vk.json")), "")
print(f"lavapipe, {threads} threads (LP_NUM_THREADS, -t); polychip device: {vk_dev or 'n/a'}\n")
print("| model | test | polychip vulkan t/s | llama.cpp vulkan t/s | ratio | polychip cpu t/s |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for m in models:
    vk, ll, cpu = (load(f"{out}/{m}.{s}.json") for s in ("vk", "llama", "cpu"))
    for kind in ("pp", "tg"):
        o, t, c = pick(vk, kind), pick(ll, kind), pick(cpu, kind)
        ref = o or c
        test = (f"pp{ref['n_prompt']}" if kind == "pp" else f"tg{ref['n_gen']}") if ref else kind
        ratio = f"{o['avg_ts'] / t['avg_ts']:.2f}x" if o and t else "n/a"
        print(f"| {m} | {test} | {fmt(o)} | {fmt(t)} | {ratio} | {fmt(c)} |")
PY
