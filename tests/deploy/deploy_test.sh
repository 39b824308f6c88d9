#!/usr/bin/env bash
# The deployment examples (Dockerfile, deploy/systemd, deploy/kubernetes) checked offline, one
# check per ctest test; FILE replaces the example checked (the tests that a check refuses a
# broken file):
#   deploy_test.sh systemd SRC BUILD [FILE]     systemd-analyze verify on the unit, its ExecStart
#                                               pointed at the built binary; any warning fails
#   deploy_test.sh kubernetes SRC BUILD [FILE]  the manifests against the Kubernetes API's
#                                               schemas (validate_k8s.mjs), and the ConfigMap's
#                                               serve.yaml through polychip's own config checks
#   deploy_test.sh dockerfile SRC BUILD [FILE]  the Dockerfile linted (npm dockerfile-utils), its
#                                               shape (Debian 12 stages, non-root, 0.0.0.0, the
#                                               plugins installed) and its run-time stage's
#                                               packages against what the binary and plugins link
# The image itself is not built here: no registry to pull debian:12-slim from.
set -euo pipefail
check="$1" src="$2" build="$3" file="${4:-}"
npm_dir="${POLYCHIP_NPM_DIR:-$HOME/.cache/polychip/npm}"
fail() { echo "FAIL: $*" >&2; exit 1; }
need_npm() {
  for p in "$@"; do
    [ -f "$npm_dir/node_modules/$p/package.json" ] ||
      fail "npm package $p is not in $npm_dir: run tests/setup/setup-test-deps.sh"
  done
}

case "$check" in
systemd)
  command -v systemd-analyze >/dev/null || fail "systemd-analyze missing: scripts/install-deps.sh installs systemd"
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  sed "s|/opt/polychip/bin/polychip|$build/bin/polychip|" "${file:-$src/deploy/systemd/polychip.service}" \
    > "$tmp/polychip.service"
  grep -q "^ExecStart=$build/bin/polychip serve " "$tmp/polychip.service" || fail "no ExecStart running polychip serve"
  out="$(systemd-analyze verify "$tmp/polychip.service" 2>&1)" || fail "systemd-analyze verify: $out"
  [ -z "$out" ] || fail "systemd-analyze verify warns: $out"
  echo "systemd-analyze verify: polychip.service clean"
  ;;
kubernetes)
  need_npm kubernetes-models typescript yaml
  manifest="${file:-$src/deploy/kubernetes/polychip.yaml}"
  POLYCHIP_NPM_DIR="$npm_dir" node "$src/tests/deploy/validate_k8s.mjs" "$manifest"
  for probe in startupProbe livenessProbe readinessProbe; do
    grep -q "^ *$probe:" "$manifest" || fail "the Deployment has no $probe"
  done
  grep -q 'prometheus.io/scrape: "true"' "$manifest" || fail "no Prometheus scrape annotation"
  # The ConfigMap's serve.yaml (the block under `serve.yaml: |`), as the container runs it.
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  awk '/serve.yaml: \|/{f=1;next} f&&/^    /{sub(/^    /,"");print;next} f{exit}' "$manifest" \
    > "$tmp/serve.yaml"
  [ -s "$tmp/serve.yaml" ] || fail "no serve.yaml in the ConfigMap"
  "$build/bin/polychip" serve --host 0.0.0.0 --port 30000 --config "$tmp/serve.yaml" \
    --model-path "" --print-config >/dev/null || fail "polychip refuses the ConfigMap's serve.yaml"
  echo "serve.yaml of the ConfigMap: accepted by polychip serve --print-config"
  ;;
dockerfile)
  need_npm dockerfile-utils
  df="${file:-$src/Dockerfile}"
  node "$npm_dir/node_modules/dockerfile-utils/bin/dockerfile-utils" lint "$df" || fail "dockerfile-utils lint"
  froms="$(grep -c '^FROM ' "$df")"
  [ "$froms" -ge 2 ] || fail "not multi-stage ($froms FROM lines)"
  # (no grep -q after a pipe: with pipefail, the SIGPIPE of the first grep would be a failure)
  if grep '^FROM ' "$df" | grep -v 'debian:12' >/dev/null; then fail "a stage not on Debian 12"; fi
  user="$(grep '^USER ' "$df" | tail -1 | awk '{print $2}')"
  [ -n "$user" ] && [ "$user" != root ] && [ "$user" != 0 ] || fail "the image runs as root"
  grep '^ENTRYPOINT' "$df" | grep '"--host", "0.0.0.0"' >/dev/null || fail "the server is not on 0.0.0.0"
  grep -q -- '--component plugins' "$df" || fail "the plugins are not installed in the image"
  # The run-time stage installs the package of every library the binary, libpolychip.so and
  # the plugins link directly (libc6, libstdc++6, libgcc-s1 and zlib1g are in debian:12-slim).
  runtime="$(awk '/^FROM /{n++} n==2' "$df")"
  files=("$build/bin/polychip" "$build"/lib/libpolychip.so.1 "$build"/lib/polychip/*.so)
  missing=()
  for f in "${files[@]}"; do
    for soname in $(objdump -p "$f" | awk '/NEEDED/{print $2}'); do
      case "$soname" in
        libpolychip.so*|libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libz.so*|ld-linux*) continue ;;
        # A sanitizer build's runtimes (make asan): the image is built without them.
        libasan.so*|libubsan.so*|liblsan.so*|libtsan.so*) continue ;;
      esac
      lib="$(ldconfig -p | awk -v s="$soname" '$1==s && !n++ {print $NF}')"
      [ -n "$lib" ] || { missing+=("$soname (not found here)"); continue; }
      # dpkg knows the path the package shipped (/lib or /usr/lib: merged /usr).
      pkg="$( (dpkg -S "$(readlink -f "$lib")" || dpkg -S "$lib" || true) 2>/dev/null |
              awk -F: 'NR==1{print $1}')"
      grep -qw -- "$pkg" <<<"$runtime" || missing+=("$soname of $(basename "$f") (package $pkg)")
    done
  done
  [ ${#missing[@]} -eq 0 ] || fail "the run-time stage lacks: ${missing[*]}"
  echo "Dockerfile: lint clean, $froms stages on Debian 12, USER $user, 0.0.0.0, run-time packages cover ${#files[@]} binaries"
  ;;
*) fail "unknown check '$check'" ;;
esac
