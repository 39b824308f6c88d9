#!/usr/bin/env bash
# Before/after of a change on a shared machine: runs `polychip bench` from two build trees in
# alternation (old, new, old, new, ...), so both meet the same moments of the host, and prints
# each pair's t/s and the median of the new/old ratios. A single run of each is not enough on a
# VM whose bandwidth moves by half within minutes (docs/performance.md, "Reading the figures").
#
# usage: bench/compare-builds.sh OLD_BUILD NEW_BUILD MODEL.gguf [-r ROUNDS] [-t THREADS]
#                                [-p N_PROMPT] [-n N_GEN]
#   OLD_BUILD, NEW_BUILD: build directories (or copies of one: bin/ and lib/ are what is used),
#   e.g. `cp -a build/bin build/lib /tmp/before` before the change, then `build` after it.
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n 2,11p "$0" >&2; exit 2; }
OLD="$1" NEW="$2" MODEL="$3"; shift 3
ROUNDS=8 THREADS=2 NP=0 NG=64
while [[ $# -gt 0 ]]; do
  case "$1" in
    -r) ROUNDS="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    -p) NP="$2"; shift 2 ;;
    -n) NG="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
for b in "$OLD" "$NEW"; do
  [[ -x "$b/bin/polychip" ]] || { echo "missing $b/bin/polychip" >&2; exit 1; }
done
[[ -f "$MODEL" ]] || { echo "missing model $MODEL" >&2; exit 1; }
export POLYCHIP_DEVICE_BACKEND="${POLYCHIP_DEVICE_BACKEND:-cpu}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
for r in $(seq "$ROUNDS"); do
  for side in old new; do
    dir="$OLD"; [[ $side == new ]] && dir="$NEW"
    echo "[compare-builds] round $r/$ROUNDS: $side" >&2
    "$dir/bin/polychip" bench --model-path "$MODEL" -p "$NP" -n "$NG" -r 2 -t "$THREADS" -o json \
      > "$OUT/$side.$r.json" 2> "$OUT/$side.log" || { cat "$OUT/$side.log" >&2; exit 1; }
  done
done
python3 - "$OUT" "$ROUNDS" "$NP" "$NG" <<'PY'
import json, statistics, sys
out, rounds, np_, ng = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def ts(side, r, kind):
    rs = json.load(open(f"{out}/{side}.{r}.json"))
    return next(x["avg_ts"] for x in rs if (x["n_prompt"] > 0) == (kind == "pp"))
for kind in (["pp"] if np_ > 0 else []) + (["tg"] if ng > 0 else []):
    pairs = [(ts("old", r, kind), ts("new", r, kind)) for r in range(1, rounds + 1)]
    ratios = [n / o for o, n in pairs]
    print(f"{kind}: " + "  ".join(f"{o:.1f}/{n:.1f}" for o, n in pairs))
    print(f"{kind}: new/old median {statistics.median(ratios):.3f} "
          f"(lowest {min(ratios):.3f}, highest {max(ratios):.3f}, {rounds} pairs)")
PY
