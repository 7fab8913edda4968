#!/usr/bin/env bash
# Builds every GPU test binary (tests/cuda_*.rs of ferry, ferry-capi and ferry-bench), the
# numbered examples and the `ferry` CLI (whose `ferry bench` holds every timing) in release
# mode without debug info, strips them, and copies them into a bundle folder (default `.gpu/`)
# with a `run.sh` that runs them all on a GPU host with no Rust toolchain:
#
#   scripts/gpu-bundle.sh [BUNDLE_DIR]      # here
#   bash BUNDLE_DIR/run.sh LOGDIR           # on the GPU host, every test under both completion
#                                           # policies; exit status 0 iff all passed
#   bash BUNDLE_DIR/sanitize.sh LOGDIR      # the tests again under compute-sanitizer
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
bundle=${1:-.gpu}
# Small binaries: no debug info, symbols stripped (the workspace's release profile keeps
# debug=1 for profiling; the bundle does not need it).
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols

rm -rf "$bundle"
mkdir -p "$bundle/tests"

# The tests are built with the `gpu` feature (without it they are marked ignored) and the
# `fault-injection` hooks (tests/cuda_faults.rs arms them; they are disarmed otherwise, a relaxed
# atomic load per staged chunk).
json=$(cargo test --release -p ferry -p ferry-capi -p ferry-bench --features ferry/gpu,ferry-capi/gpu,ferry-bench/gpu,ferry/fault-injection --no-run --message-format=json --test 'cuda_*')
exes=$(printf '%s\n' "$json" | jq -r 'select(.reason == "compiler-artifact" and .executable != null and (.target.kind | index("test"))) | "\(.target.name) \(.executable)"')
if [ -z "$exes" ]; then
  echo "no cuda_* test binaries found" >&2
  exit 1
fi
while read -r name exe; do
  cp "$exe" "$bundle/tests/$name"
  strip "$bundle/tests/$name" 2>/dev/null || true
done <<<"$exes"
# The binaries that make their engines through crates/ferry/tests/cuda_common, which reads the
# completion policy from FERRY_TEST_COMPLETION: run.sh runs them under each policy.
grep -l '^mod cuda_common;' crates/ferry/tests/cuda_*.rs | xargs -n1 basename | sed 's/\.rs$//' \
  >"$bundle/tests-by-policy.txt"

# Every example (the numbered ones), run after the tests.
mkdir -p "$bundle/examples"
ex=$(cargo build --release -p ferry --examples --message-format=json | jq -r 'select(.reason == "compiler-artifact" and .executable != null) | "\(.target.name) \(.executable)"')
while read -r name exe; do
  [ -n "$name" ] || continue
  cp "$exe" "$bundle/examples/$name"
  strip "$bundle/examples/$name" 2>/dev/null || true
done <<<"$ex"

cli=$(cargo build --release -p ferry-cli --message-format=json | jq -r 'select(.reason == "compiler-artifact" and .executable != null and .target.name == "ferry") | .executable')
if [ -n "$cli" ]; then
  cp "$cli" "$bundle/ferry"
  strip "$bundle/ferry" 2>/dev/null || true
fi

# libaml (crates/ferry-aml, AML's API): installed in the bundle, its C test program built
# against it through pkg-config (run with the tests: the CUDA DMA part runs where a GPU is),
# and the AML-vs-Rust strided 3-D bench as an example.
scripts/aml-install.sh "$bundle/aml" --release
rm -f "$bundle/aml/lib/libaml.a"
PKG_CONFIG_PATH="$bundle/aml/lib/pkgconfig" bash -c 'cc -std=c11 -D_GNU_SOURCE -O2 $(pkg-config --cflags aml) crates/ferry-aml/tests/c/test_aml.c -o "$0/tests/aml_c_test" $(pkg-config --libs aml) -lpthread -Wl,-rpath,\$ORIGIN/../aml/lib' "$bundle"
ex=$(cargo build --release -p ferry-aml --examples --message-format=json | jq -r 'select(.reason == "compiler-artifact" and .executable != null) | .executable')
for exe in $ex; do
  cp "$exe" "$bundle/examples/"
  strip "$bundle/examples/$(basename "$exe")" 2>/dev/null || true
done

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
# Each binary under its own limit (FERRY_TEST_TIMEOUT seconds, default 300): a hang costs only
# its own slot, listed as TIME, and the rest still run.
limit=${FERRY_TEST_TIMEOUT:-300}
# Every test binary under the first policy; those of tests-by-policy.txt under the others too
# (FERRY_TEST_POLICIES, default "tuned plain": the completion policies of CudaConfig). Logs:
# LOGDIR/NAME.log for the first policy, LOGDIR/NAME.POLICY.log for the others.
policies=(${FERRY_TEST_POLICIES:-tuned plain})
for policy in "${policies[@]}"; do
  for t in "$here"/tests/*; do
    name=$(basename "$t")
    file=$log/$name.log
    if [ "$policy" != "${policies[0]}" ]; then
      grep -qx "$name" "$here/tests-by-policy.txt" || continue
      file=$log/$name.$policy.log
    fi
    start=$(date +%s%N)
    FERRY_TEST_COMPLETION=$policy timeout -k 5 "$limit" "$t" --nocapture >"$file" 2>&1
    case $? in
      0) status=ok ;;
      124 | 137) status=TIME; fail=1 ;;
      *) status=FAIL; fail=1 ;;
    esac
    end=$(date +%s%N)
    printf '%-4s %-6s %-20s %7d ms  %s\n' "$status" "$policy" "$name" $(((end - start) / 1000000)) "$(grep -E '^test result' "$file" | tail -1)"
  done
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

cat >"$bundle/sanitize.sh" <<'SAN'
#!/usr/bin/env bash
# Runs every test binary of this bundle under compute-sanitizer, one tool after the other
# (memcheck first), each binary with one test thread. Logs in LOGDIR (default ./sanitize-logs):
# NAME.TOOL.san (the sanitizer's report) and NAME.TOOL.out (the tests' output); one summary line
# per binary and tool on stdout. Exit status 0 iff every run passed with 0 sanitizer errors.
#
#   bash sanitize.sh [LOGDIR]
#
# Environment:
#   TOOLS            tools to run (default "memcheck racecheck"; also initcheck, synccheck)
#   SAN_TIMEOUT      seconds per binary and tool before it is stopped (default 120)
#   SAN_TOTAL        seconds for the whole pass (default 540, under the GPU host's 10-minute
#                    command limit): runs that would start later are listed as NOT RUN
#   SAN_ONLY         only binaries whose name matches this regex (default all)
#   SAN_SKIP         test names to skip, space-separated (default: card_filled_out_of_memory, which
#                    fills the card and would also starve the sanitizer's own device memory)
#   SAN_API_ERRORS   --report-api-errors (default "no": ferry asks cuPointerGetAttribute about
#                    plain host memory to recognise pinned memory, and the fault tests provoke
#                    out-of-memory errors, both expected; "explicit" shows them)
#   COMPUTE_SANITIZER  the sanitizer binary (default: on PATH, else /usr/local/cuda*/bin)
# The stress test is sized down here (FERRY_STRESS_OPS/SECS/MAX_MIB, overridable), and the long
# upload-and-kernel loops of cuda_pipeline to FERRY_TEST_ROUNDS=200 rounds (4,000 and 10,000
# rounds ended their process under racecheck after about 90 s, no hazard reported before it).
here=$(cd "$(dirname "$0")" && pwd)
log=${1:-sanitize-logs}
mkdir -p "$log"
log=$(cd "$log" && pwd)
san=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | tail -1)}
if [ -z "$san" ] || [ ! -x "$san" ]; then
  echo "compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2
  exit 2
fi
"$san" --version | tail -1
tools=${TOOLS:-memcheck racecheck}
limit=${SAN_TIMEOUT:-120}
deadline=$(($(date +%s) + ${SAN_TOTAL:-540}))
skip_list=${SAN_SKIP-card_filled_out_of_memory}
skip=()
for t in $skip_list; do skip+=(--skip "$t"); done
export FERRY_STRESS_OPS=${FERRY_STRESS_OPS:-150} FERRY_STRESS_SECS=${FERRY_STRESS_SECS:-30} \
  FERRY_STRESS_MAX_MIB=${FERRY_STRESS_MAX_MIB:-8} FERRY_STRESS_THREADS=${FERRY_STRESS_THREADS:-4} \
  FERRY_TEST_ROUNDS=${FERRY_TEST_ROUNDS:-200}
fail=0
for tool in $tools; do
  for t in "$here"/tests/*; do
    name=$(basename "$t")
    if [ -n "${SAN_ONLY:-}" ] && ! [[ $name =~ $SAN_ONLY ]]; then continue; fi
    start=$(date +%s)
    left=$((deadline - start))
    if [ "$left" -lt 20 ]; then
      printf '%-7s %-10s %-16s (SAN_TOTAL reached)\n' "NOT RUN" "$tool" "$name"
      fail=1
      continue
    fi
    [ "$left" -lt "$limit" ] && run_limit=$left || run_limit=$limit
    timeout -k 10 "$run_limit" "$san" --tool "$tool" --error-exitcode 86 --print-limit 50 \
      --report-api-errors "${SAN_API_ERRORS:-no}" --log-file "$log/$name.$tool.san" \
      "$t" --test-threads=1 --nocapture "${skip[@]}" >"$log/$name.$tool.out" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    summary=$(grep -hE 'SUMMARY' "$log/$name.$tool.san" 2>/dev/null | sed 's/^=* *//' | paste -sd ';' -)
    case $rc in
      0) status=ok ;;
      86) status=ERRORS ;;
      124 | 137) status=TIMEOUT ;;
      *) status=FAIL ;;
    esac
    [ "$status" = ok ] || fail=1
    printf '%-7s %-10s %-16s %5d s  %s | %s\n' "$status" "$tool" "$name" "$secs" "${summary:-no sanitizer summary}" \
      "$(grep -E '^test result' "$log/$name.$tool.out" | tail -1)"
  done
done
exit $fail
SAN
chmod +x "$bundle/sanitize.sh"
du -sh "$bundle"
ls -l "$bundle" "$bundle/tests"
