#!/usr/bin/env bash
# Compares the polychip cpu backend with llama.cpp on the same GGUF files, same thread count,
# in one run, and prints one markdown table (stdout; progress on stderr). Each model runs -r
# rounds of one timed repetition, polychip and llama.cpp alternating, with a read-bandwidth probe
# before, between and after the two runs of each round:
#   model | test | polychip t/s | llama.cpp t/s | ratio | decode % of bandwidth (ours, theirs),
#   against the whole run's bandwidth (the larger of a probe before and one after all runs),
#   against the median of the model's probes, and run by run: each run against the mean of the
#   probes just before and after it (median over the rounds). The VMs' bandwidth moves by half
#   within minutes; the run-by-run figure is the one that drift disturbs least.
# "% of bandwidth" = tokens/s x bytes read per token (model tensors, minus the embedding table
# unless tied; of a mixture of experts' expert tensors only the share a token runs) / measured
# read bandwidth of this machine with the same threads.
#
# usage: bench/compare-cpu.sh [-t THREADS] [-r REPS] [-p N_PROMPT] [-n N_GEN] [-B BATCH]
#                             [--models "qwen05-q4_0 ..."]
# models: qwen05-{q8_0,q4_0,q4_k,f16,q4_1,q5_1,iq4_nl,iq4_xs} llama1b-q4_0 qwen3moe-q4_k_m
#         (the default set is below; the others by --models)
# env:   POLYCHIP_BUILD_DIR (default: build), POLYCHIP_LLAMA_CPP_DIR (default:
#        /root/.cache/polychip/llama.cpp, with build/bin/llama-bench and models/ vocab GGUFs),
#        POLYCHIP_BENCH_CACHE (synthesized models; default ~/.cache/polychip/bench-models)
set -euo pipefail

source "$(dirname "$0")/paths.sh"
THREADS=2 REPS=3 NP=128 NG=64 BATCH=16
MODELS="qwen05-q8_0 qwen05-q4_0 qwen05-q4_k qwen05-f16 llama1b-q4_0 qwen3moe-q4_k_m"
BATCH_MODELS="qwen05-q4_0"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -t) THREADS="$2"; shift 2 ;;
    -r) REPS="$2"; shift 2 ;;
    -p) NP="$2"; shift 2 ;;
    -n) NG="$2"; shift 2 ;;
    -B) BATCH="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --batch-models) BATCH_MODELS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { echo "[compare-cpu] $*" >&2; }
[[ -x "$PC" ]] || { echo "missing $PC (build first, or set POLYCHIP_BUILD_DIR)" >&2; exit 1; }
llama_tool llama-bench
[[ -x "$LB/llama-bench" ]] || { echo "missing $LB/llama-bench" >&2; exit 1; }
export LD_LIBRARY_PATH="$LB:${LD_LIBRARY_PATH:-}"
export POLYCHIP_DEVICE_BACKEND="${POLYCHIP_DEVICE_BACKEND:-cpu}"
mkdir -p "$CACHE"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

model_spec() {  # name -> "shape vocab type"
  case "$1" in
    qwen05-q8_0) echo "qwen2.5-0.5b qwen2 Q8_0" ;;
    qwen05-q4_0) echo "qwen2.5-0.5b qwen2 Q4_0" ;;
    qwen05-q4_k) echo "qwen2.5-0.5b qwen2 Q4_K" ;;
    qwen05-f16) echo "qwen2.5-0.5b qwen2 F16" ;;
    qwen05-q4_1) echo "qwen2.5-0.5b qwen2 Q4_1" ;;
    qwen05-q5_1) echo "qwen2.5-0.5b qwen2 Q5_1" ;;
    qwen05-iq4_nl) echo "qwen2.5-0.5b qwen2 IQ4_NL" ;;
    qwen05-iq4_xs) echo "qwen2.5-0.5b qwen2 IQ4_XS" ;;  # mostly IQ4_NL: 896-wide rows
    llama1b-q4_0) echo "llama-3.2-1b llama-bpe Q4_0" ;;
    qwen3moe-q4_k_m) echo "qwen3moe-1.5b qwen2 Q4_K_M" ;;
    # K-quant mixtures (--models): on qwen2.5-0.5b most rows (896 wide) fall back to Q4_0,
    # Q5_0, Q5_1 or Q8_0; the qwen3-0.6b shape's rows are multiples of 256 (real K-quants).
    qwen05-q2_k|qwen05-q3_k_m|qwen05-q4_k_m|qwen05-q5_k_m|qwen05-q6_k)
      echo "qwen2.5-0.5b qwen2 $(echo "${1#qwen05-}" | tr a-z A-Z)" ;;
    qwen3-q2_k|qwen3-q3_k_m|qwen3-q4_k_m|qwen3-q5_k_m|qwen3-q6_k)
      echo "qwen3-0.6b qwen2 $(echo "${1#qwen3-}" | tr a-z A-Z)" ;;
    *) echo "unknown model $1" >&2; exit 2 ;;
  esac
}

for m in $MODELS $BATCH_MODELS; do
  f="$CACHE/$m.gguf"
  [[ -f "$f" ]] && continue
  read -r shape vocab type < <(model_spec "$m")
  log "synthesizing $f ($shape, $type)"
  "$PC" gguf synth --vocab "$VOCAB/ggml-vocab-$vocab.gguf" --shape "$shape" --type "$type" \
    --out "$f" -q >&2
done

log "measuring read bandwidth with $THREADS threads"
# Two measurements, the larger wins: bench/membw.c built for this CPU, and polychip's own.
cc -O3 -march=native -pthread "$ROOT/bench/membw.c" -o "$OUT/membw"
"$OUT/membw" "$THREADS" 2>/dev/null > "$OUT/membw.c.txt"
"$PC" bench --membw -t "$THREADS" -o json > "$OUT/membw.json"

for m in $MODELS; do
  f="$CACHE/$m.gguf"
  # REPS rounds of one timed repetition each, polychip and llama.cpp alternating, so both see
  # the same moments of a shared machine; the ratio is the median of the rounds' ratios. On a
  # shared VM the bandwidth can move by half within minutes, so a figure taken at the start can
  # be far from the one a run saw: a probe (~2 s) before, between and after the two runs.
  probe() {
    "$OUT/membw" "$THREADS" 2>/dev/null > "$OUT/$m.probe.$1.txt" || echo 0 > "$OUT/$m.probe.$1.txt"
  }
  for r in $(seq "$REPS"); do
    log "$m: round $r/$REPS: polychip bench, llama-bench"
    probe "$r.0"
    "$PC" bench --model-path "$f" -p "$NP" -n "$NG" -r 1 -t "$THREADS" -o json \
      > "$OUT/$m.ours.$r.json" 2> "$OUT/$m.ours.log" || { cat "$OUT/$m.ours.log" >&2; echo '[]' > "$OUT/$m.ours.$r.json"; }
    probe "$r.1"
    "$LB/llama-bench" -m "$f" -p "$NP" -n "$NG" -r 1 -t "$THREADS" -o json \
      > "$OUT/$m.theirs.$r.json" 2> "$OUT/$m.theirs.log" || { cat "$OUT/$m.theirs.log" >&2; echo '[]' > "$OUT/$m.theirs.$r.json"; }
    probe "$r.2"
  done
done

# Once more after the single-sequence runs: on a shared VM the bandwidth can move during a run,
# and the table shows both figures (the % column uses the larger, the conservative choice).
log "measuring read bandwidth again"
"$OUT/membw" "$THREADS" 2>/dev/null > "$OUT/membw.c.end.txt"

for m in $BATCH_MODELS; do
  f="$CACHE/$m.gguf"
  log "$m: polychip bench --batch $BATCH"
  "$PC" bench --model-path "$f" -p "$NP" -n "$NG" -r "$REPS" -t "$THREADS" --batch "$BATCH" \
    -o json > "$OUT/$m.ours_batch.json" 2> "$OUT/$m.ours_batch.log" || { cat "$OUT/$m.ours_batch.log" >&2; echo '[]' > "$OUT/$m.ours_batch.json"; }
  log "$m: llama-batched-bench -npl $BATCH"
  ctx=$(( (NP + NG + 1) * BATCH + 256 ))
  "$LB/llama-batched-bench" -m "$f" -c "$ctx" -b 2048 -ub 512 -npp "$NP" -ntg "$NG" \
    -npl "$BATCH" -t "$THREADS" --output-format jsonl \
    > "$OUT/$m.theirs_batch.jsonl" 2> "$OUT/$m.theirs_batch.log" || { cat "$OUT/$m.theirs_batch.log" >&2; : > "$OUT/$m.theirs_batch.jsonl"; }
done

python3 - "$OUT" "$THREADS" "$MODELS" "$BATCH_MODELS" "$BATCH" "$REPS" <<'PY'
import json, os, statistics, sys
out, threads, models, batch_models, batch = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split(), int(sys.argv[5])
reps = int(sys.argv[6])
def load(p):
    try:
        with open(p) as f: return json.load(f)
    except Exception: return []
bw_start = max(load(f"{out}/membw.json")[0]["read_gbps"], float(open(f"{out}/membw.c.txt").read()))
bw_end = float(open(f"{out}/membw.c.end.txt").read())
bw = max(bw_start, bw_end) * 1e9
print(f"Read bandwidth ({threads} threads): {bw/1e9:.2f} GB/s "
      f"(before the runs {bw_start:.2f}, after {bw_end:.2f})\n")
print(f"t/s: mean ± stddev of {reps} rounds, polychip and llama.cpp alternating; ratio: median of "
      "the rounds' ratios (lowest-highest)\n")
print("| model | test | polychip t/s | llama.cpp t/s | ratio | decode % of BW (polychip / llama.cpp) "
      "| % of the median BW around the model's runs (GB/s) | % of the probes beside each run |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
def probe(m, r, i):  # GB/s of the probe taken in round r before (0), between (1), after (2)
    try: return float(open(f"{out}/{m}.probe.{r}.{i}.txt").read().split()[0]) * 1e9
    except (OSError, ValueError, IndexError): return 0
def local_bw(m):  # the median of this model's probes
    probes = [p for r in range(1, reps + 1) for p in (probe(m, r, i) for i in range(3)) if p > 0]
    return statistics.median(probes) if probes else 0
def run_by_run(m, rs, first):  # median over rounds of t/s x bpt / the probes beside the run
    fr = [r["avg_ts"] / ((probe(m, i, first) + probe(m, i, first + 1)) / 2)
          for i, r in enumerate(rs, 1)
          if r and probe(m, i, first) > 0 and probe(m, i, first + 1) > 0]
    return statistics.median(fr) if fr else None
def fmt(r): return f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}" if r else "n/a"
def rounds(m, who, kind):  # the test's t/s in each round (None where a round failed)
    out_rounds = []
    for i in range(1, reps + 1):
        rs = load(f"{out}/{m}.{who}.{i}.json")
        r = next((r for r in rs if (r["n_prompt"] > 0) == (kind == "pp") and r.get("n_seqs", 1) == 1), None)
        out_rounds.append(r)
    return out_rounds
def summary(rs):  # mean ± stddev over the rounds, in the shape of one bench record
    ts = [r["avg_ts"] for r in rs if r]
    if not ts: return None
    first = next(r for r in rs if r)
    return dict(first, avg_ts=statistics.mean(ts), stddev_ts=statistics.stdev(ts) if len(ts) > 1 else 0)
for m in models:
    bpt = next((r.get("bytes_per_token", 0) for r in load(f"{out}/{m}.ours.1.json")), 0)
    for kind in ("pp", "tg"):
        ro, rt = rounds(m, "ours", kind), rounds(m, "theirs", kind)
        o, t = summary(ro), summary(rt)
        if not o and not t: continue  # a test this run skipped (-p 0 or -n 0)
        test = f"pp{o['n_prompt']}" if kind == "pp" and o else (f"tg{o['n_gen']}" if o else kind)
        paired = [a["avg_ts"] / b["avg_ts"] for a, b in zip(ro, rt) if a and b]
        ratio = f"{statistics.median(paired):.2f}x" if paired else "n/a"
        if len(paired) > 1: ratio += f" ({min(paired):.2f}-{max(paired):.2f})"
        frac = local = beside = ""
        if kind == "tg" and bpt:
            frac = " / ".join(f"{100*r['avg_ts']*bpt/bw:.0f}%" if r else "n/a" for r in (o, t))
            lbw = local_bw(m)
            if lbw:
                local = " / ".join(f"{100*r['avg_ts']*bpt/lbw:.0f}%" if r else "n/a" for r in (o, t))
                local += f" ({lbw/1e9:.1f})"
            beside = " / ".join(f"{100*f*bpt:.0f}%" if f else "n/a"
                                for f in (run_by_run(m, ro, 0), run_by_run(m, rt, 1)))
        print(f"| {m} | {test} | {fmt(o)} | {fmt(t)} | {ratio} | {frac} | {local} | {beside} |")
for m in batch_models:
    ours = load(f"{out}/{m}.ours_batch.json")
    o = ours[0] if ours else None
    t = None
    try:
        for line in open(f"{out}/{m}.theirs_batch.jsonl"):
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if r.get("pl") == batch: t = r
    except FileNotFoundError: pass
    ours_ts = f"{o['avg_ts']:.2f} ± {o['stddev_ts']:.2f}" if o else "n/a"
    theirs_ts = f"{t['speed_tg']:.2f}" if t else "n/a"
    ratio = f"{o['avg_ts']/t['speed_tg']:.2f}x" if o and t else "n/a"
    print(f"| {m} | {batch} seqs decode (aggregate) | {ours_ts} | {theirs_ts} | {ratio} | | | |")
PY
