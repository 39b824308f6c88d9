#!/usr/bin/env bash
# Perplexity of the Vulkan plugin against llama.cpp's CPU build on synthesized models (the
# issue's "within 0.5%" check), one line per model:
#   [ARCHS="llama qwen2 qwen3"] plugins/backends/vulkan/check_perplexity.sh [BUILD_DIR] [TYPES...]
# BUILD_DIR (default build) holds bin/polychip and the plugins; llama.cpp's tools come from
# tests/setup/fetch-llama-cpp.sh (POLYCHIP_LLAMA_CPP_DIR, default ~/.cache/polychip/llama.cpp).
# Lavapipe is slow: the models are the `tiny` shapes and the text is the 5 KB lighthouse file.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=${1:-$root/build}
shift || true
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(F16 Q8_0 Q4_0 Q4_K_M Q6_K)
llama=${POLYCHIP_LLAMA_CPP_DIR:-$HOME/.cache/polychip/llama.cpp}
text=$root/tests/data/lighthouse.txt
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ppl() { grep -o "Final estimate: PPL = [0-9.]*" | awk "{print \$NF}" | tail -1 || true; }
printf '%-22s %12s %12s %9s\n' model llama.cpp vulkan diff
for case in "llama-spm llama tiny" "qwen2 qwen2 tiny" "qwen2 qwen3 qwen3-tiny"; do
  read -r vocab arch shape <<<"$case"
  [ -n "${ARCHS:-}" ] && [[ " $ARCHS " != *" $arch "* ]] && continue  # ARCHS="qwen2 qwen3"
  for type in "${types[@]}"; do
    model=$out/${arch}_$type.gguf
    if ! "$build/bin/polychip" gguf synth --vocab "$llama/models/ggml-vocab-$vocab.gguf" \
      --shape "$shape" --arch "$arch" --type "$type" --seed 7 --weight-std 0.08 --quiet \
      --out "$model" >/dev/null 2>&1; then
      printf '%-22s %s\n' "${arch}_$type" "(cannot synthesize with this build)"
      continue
    fi
    ref=""
    for _ in 1 2 3 4; do  # llama.cpp's log thread sometimes exits before the last line
      ref=$("$llama/build/bin/llama-perplexity" -m "$model" -f "$text" -c 128 -b 128 -t 2 2>&1 | ppl)
      [ -n "$ref" ] && break
    done
    ours=$("$build/bin/polychip" perplexity --device vulkan:0 --model-path "$model" -f "$text" \
      --ctx 128 --batch 128 2>&1 | ppl)
    printf '%-22s %12s %12s %8.3f%%\n' "${arch}_$type" "$ref" "$ours" \
      "$(awk -v a="$ref" -v b="$ours" 'BEGIN { d = (b - a) / a * 100; print (d < 0 ? -d : d) }')"
    rm -f "$model"
  done
done
