#!/usr/bin/env bash
# Plugin hot reload under load: N greedy streaming requests in flight on a synthesized F16 llama
# while `polychip serve` reloads its device plugin (a copy of cpu at another path, emu, cpu by
# name again), R rounds. Prints, as markdown: per reload the target, HTTP status, swap_ms,
# preempted requests and whether every stream's text equals the run without reload; the swap
# time p50; and the replies to reloads to broken libraries (a file that is not ELF, a shared
# library without the entry symbol), after which a request must still get the reference text.
#
# usage: bench/hot-reload.sh [-n STREAMS] [-r ROUNDS] [-t THREADS] [--tokens N]
# env:   POLYCHIP_BUILD_DIR (default: build), POLYCHIP_LLAMA_CPP_DIR (vocabulary GGUFs),
#        POLYCHIP_BENCH_CACHE (synthesized model; default ~/.cache/polychip/bench-models)
set -euo pipefail

source "$(dirname "$0")/paths.sh"
STREAMS=16 ROUNDS=2 THREADS=2 TOKENS=48
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) STREAMS="$2"; shift 2 ;;
    -r) ROUNDS="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

mkdir -p "$CACHE"
MODEL="$CACHE/hot-reload-llama-f16.gguf"
if [[ ! -f "$MODEL" ]]; then
  "$PC" gguf synth --vocab "$VOCAB/ggml-vocab-llama-spm.gguf" --shape tiny --arch llama \
    --layers 4 --embd 256 --heads 4 --type F16 --seed 5 -q --out "$MODEL" >&2
fi
WORK="$(mktemp -d "$BUILD/hot-reload-bench.XXXXXX")"
chmod 700 "$WORK"
cp "$BUILD/lib/polychip/libpolychip_backend_cpu.so" "$WORK/"
echo "this is not an ELF file" > "$WORK/libpolychip_backend_broken.so"
NO_SYMBOL="$(ls "$BUILD"/lib/libpolychip.so.* | head -1)"
KEY="bench-admin-key"
"$PC" serve --model-path "$MODEL" --device cpu:0 --threads "$THREADS" --port 0 \
  --admin-key "$KEY" --max-running-requests "$STREAMS" > "$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 600); do
  PORT="$(grep -o 'listening on http://[^:]*:[0-9]*' "$WORK/serve.log" | grep -o '[0-9]*$' || true)"
  [[ -n "$PORT" ]] && break
  sleep 0.1
done
[[ -n "$PORT" ]] || { cat "$WORK/serve.log" >&2; exit 1; }

python3 - "$PORT" "$KEY" "$STREAMS" "$ROUNDS" "$TOKENS" "$WORK" "$NO_SYMBOL" <<'EOF'
import json, statistics, sys, threading, time, urllib.request, urllib.error
port, key, streams, rounds, tokens, work, no_symbol = sys.argv[1:]
streams, rounds, tokens = int(streams), int(rounds), int(tokens)
base = f"http://127.0.0.1:{port}"

def post(path, body, auth=None):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    if auth: req.add_header("Authorization", "Bearer " + auth)
    try:
        with urllib.request.urlopen(req, timeout=600) as r: return r.status, r.read()
    except urllib.error.HTTPError as e: return e.code, e.read()

def stream(i, out, errors):
    body = {"prompt": f"Request {i}: the history of", "max_tokens": tokens, "temperature": 0,
            "stream": True}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    text, done = "", False
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "): continue
            if line == "data: [DONE]": done = True; continue
            ev = json.loads(line[6:])
            if "error" in ev: errors.append(ev["error"])
            if ev.get("choices"): text += ev["choices"][0].get("text", "")
    if not done: errors.append(f"stream {i} ended without [DONE]")
    out[i] = text

def run(reload_body=None):
    out, errors = [None] * streams, []
    threads = [threading.Thread(target=stream, args=(i, out, errors)) for i in range(streams)]
    for t in threads: t.start()
    reply = None
    if reload_body is not None:
        # Reload while the streams decode: wait for them all to be running.
        for _ in range(600):
            m = urllib.request.urlopen(base + "/metrics").read().decode()
            if any(l.startswith("polychip_num_running_reqs ") and float(l.split()[1]) >= streams
                   for l in m.splitlines()): break
            time.sleep(0.05)
        status, raw = post("/admin/reload_plugin", reload_body, key)
        reply = (status, json.loads(raw))
    for t in threads: t.join()
    return out, errors, reply

reference, errors, _ = run()
assert not errors, errors
print(f"{streams} greedy streaming requests, {tokens} tokens each; reference run without reload\n")
print("| reload to | status | swap_ms | preempted | old unloaded | generation | texts identical | errors |")
print("|---|---|---|---|---|---|---|---|")
targets = [{"path": f"{work}/libpolychip_backend_cpu.so"}, {"name": "emu"}, {"name": "cpu"}]
swaps, all_ok = [], True
for _ in range(rounds):
    for t in targets:
        out, errors, (status, reply) = run(dict(kind="backend", **t))
        same = sum(a == b for a, b in zip(out, reference))
        all_ok &= status == 200 and same == streams and not errors
        if status == 200: swaps.append(reply["swap_ms"])
        print(f"| {t.get('path', t.get('name'))} | {status} | {reply.get('swap_ms', 0):.1f} | "
              f"{reply.get('preempted_requests')} | {reply.get('old_unloaded')} | "
              f"{reply['backend']['name']} {reply['backend']['generation']} | "
              f"{same}/{streams} | {len(errors)} |")
print(f"\nswap time over {len(swaps)} reloads: p50 {statistics.median(swaps):.1f} ms, "
      f"min {min(swaps):.1f}, max {max(swaps):.1f}\n")
print("| broken reload | status | stage | reason |")
print("|---|---|---|---|")
for path in [f"{work}/libpolychip_backend_broken.so", no_symbol]:
    status, raw = post("/admin/reload_plugin", {"kind": "backend", "path": path}, key)
    r = json.loads(raw)
    all_ok &= status == 422
    print(f"| {path.split('/')[-1]} | {status} | {r.get('stage')} | {r.get('reason')} |")
out, errors, _ = run()
same = sum(a == b for a, b in zip(out, reference))
all_ok &= same == streams and not errors
info = json.loads(urllib.request.urlopen(base + "/get_server_info").read())
print(f"\nafter the refused reloads: backend {info['backend']} generation "
      f"{info['backend_generation']} serving, {same}/{streams} texts identical, {len(errors)} errors")
sys.exit(0 if all_ok else 1)
EOF
