#!/usr/bin/env bash
# Builds every GPU test binary (tests/cuda_*.rs), the measurement examples (examples/cuda_*.rs),
# the path benchmarks (benches/cuda_*.rs, run by hand from BUNDLE/benches/)
# and the `ferry` CLI in release mode without
# debug info, strips them, and copies them into a bundle folder (default `.gpu/`) with a
# `run.sh` that runs them all on a GPU host with no Rust toolchain:
#
#   scripts/gpu-bundle.sh [BUNDLE_DIR]      # here
#   bash BUNDLE_DIR/run.sh LOGDIR           # on the GPU host; exit status 0 iff all passed
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
bundle=${1:-.gpu}
# Small binaries: no debug info, symbols stripped (the workspace's release profile keeps
# debug=1 for profiling; the bundle does not need it).
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols

rm -rf "$bundle"
mkdir -p "$bundle/tests"

json=$(cargo test --release -p ferry -p ferry-capi --no-run --message-format=json --test 'cuda_*')
exes=$(printf '%s\n' "$json" | jq -r 'select(.reason == "compiler-artifact" and .executable != null and (.target.kind | index("test"))) | "\(.target.name) \(.executable)"')
if [ -z "$exes" ]; then
  echo "no cuda_* test binaries found" >&2
  exit 1
fi
while read -r name exe; do
  cp "$exe" "$bundle/tests/$name"
  strip "$bundle/tests/$name" 2>/dev/null || true
done <<<"$exes"

# Measurement examples (examples/cuda_*.rs), run after the tests.
mkdir -p "$bundle/examples"
ex=$(cargo build --release -p ferry --example 'cuda_*' --message-format=json | jq -r 'select(.reason == "compiler-artifact" and .executable != null) | "\(.target.name) \(.executable)"')
while read -r name exe; do
  [ -n "$name" ] || continue
  cp "$exe" "$bundle/examples/$name"
  strip "$bundle/examples/$name" 2>/dev/null || true
done <<<"$ex"

# Benchmarks of the library's paths (benches/cuda_*.rs), run by hand: BUNDLE/benches/NAME.
mkdir -p "$bundle/benches"
bx=$(cargo bench -p ferry --no-run --bench 'cuda_*' --message-format=json | jq -r 'select(.reason == "compiler-artifact" and .executable != null and (.target.kind | index("bench"))) | "\(.target.name) \(.executable)"')
while read -r name exe; do
  [ -n "$name" ] || continue
  cp "$exe" "$bundle/benches/$name"
  strip "$bundle/benches/$name" 2>/dev/null || true
done <<<"$bx"

cli=$(cargo build --release -p ferry-cli --message-format=json | jq -r 'select(.reason == "compiler-artifact" and .executable != null and .target.name == "ferry") | .executable')
if [ -n "$cli" ]; then
  cp "$cli" "$bundle/ferry"
  strip "$bundle/ferry" 2>/dev/null || true
fi

cat >"$bundle/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every test binary of this bundle; one log per binary in LOGDIR (default ./logs), and a
# summary line per binary on stdout. Exit status 0 iff every binary passed.
here=$(cd "$(dirname "$0")" && pwd)
# Never NVLink multicast (NVLS); ferry's NCCL engine uses point-to-point operations only.
export NCCL_NVLS_ENABLE=0
# NCCL from the nvidia-nccl-cu13 Python wheel, where present (ferry loads libnccl.so.2 at run
# time; without it the NCCL tests print `skipped: no NCCL library`).
nccl_dir=$(python3 -c 'import nvidia.nccl as m, os; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])' 2>/dev/null || true)
if [ -n "$nccl_dir" ] && [ -e "$nccl_dir/lib/libnccl.so.2" ]; then
  export LD_LIBRARY_PATH="$nccl_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
log=${1:-logs}
mkdir -p "$log"
log=$(cd "$log" && pwd)
fail=0
{ nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1 || true; } >"$log/gpu.txt"
if [ -x "$here/ferry" ]; then "$here/ferry" info >>"$log/gpu.txt" 2>&1 || echo "ferry info failed" >>"$log/gpu.txt"; fi
for t in "$here"/tests/*; do
  name=$(basename "$t")
  start=$(date +%s%N)
  if "$t" --nocapture >"$log/$name.log" 2>&1; then status=ok; else status=FAIL; fail=1; fi
  end=$(date +%s%N)
  printf '%-4s %-20s %7d ms  %s\n' "$status" "$name" $(((end - start) / 1000000)) "$(grep -E '^test result' "$log/$name.log" | tail -1)"
done
for x in "$here"/examples/*; do
  [ -x "$x" ] || continue
  name=$(basename "$x")
  if "$x" >"$log/$name.txt" 2>&1; then echo "ok   $name (output in $name.txt)"; else echo "FAIL $name"; fail=1; fi
done
# Optional: `FERRY_BENCH_TESTS=a,b bash run.sh LOGDIR` also runs those `ferry bench` tests in
# this environment (NCCL found as above), writing bench.txt and bench.json.
if [ -n "${FERRY_BENCH_TESTS:-}" ] && [ -x "$here/ferry" ]; then
  if "$here/ferry" bench --test "$FERRY_BENCH_TESTS" --json "$log/bench.json" >"$log/bench.txt" 2>&1; then
    echo "ok   ferry bench $FERRY_BENCH_TESTS (output in bench.txt, bench.json)"
  else
    echo "FAIL ferry bench $FERRY_BENCH_TESTS (see bench.txt)"; fail=1
  fi
fi
exit $fail
RUN
chmod +x "$bundle/run.sh"
du -sh "$bundle"
ls -l "$bundle" "$bundle/tests"
