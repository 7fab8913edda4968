#!/usr/bin/env bash
# The CUDA engine's tests without a GPU: builds the null CUDA driver
# (bench/null-cuda/null_cuda.c) as target/null-cuda/libcuda.so.1, builds the test binaries of
# crates/ferry/tests/cuda_*.rs with `--features gpu,fault-injection`, and runs each with the
# null driver first on LD_LIBRARY_PATH (cudarc loads the driver at run time), in passes:
#
#   sync/tuned    NULL_CUDA_ASYNC unset (every call done at once), FERRY_TEST_COMPLETION=tuned
#   sync/plain    the same, FERRY_TEST_COMPLETION=plain
#   async/tuned   NULL_CUDA_ASYNC=$NULL_CUDA_TEST_ASYNC_US (default 20): each stream's work
#                 done later on a thread of its own, completions late and out of order
#   async/plain   the same, plain (with --full only)
#
# Tests the null driver cannot serve print `skipped: null CUDA driver: <reason>` (others, such
# as those needing 2 GPUs, their own `skipped: ...`); those lines, counted, and each binary's
# `test result:` line are printed per pass (a failing binary's whole output too). Each binary runs under `timeout` (NULL_CUDA_TEST_TIMEOUT seconds, default 300), two
# binaries at a time (NULL_CUDA_TEST_JOBS, default 2). cuda_stress's random mix runs 20 s a pass
# (FERRY_STRESS_SECS, unless set; 40 s by default), each pass with its own seed. Logs:
# target/null-cuda/logs/<pass>/.
#
#   scripts/null-cuda-test.sh                  # the three passes (CI: .ci/run)
#   scripts/null-cuda-test.sh --full           # the four
#   scripts/null-cuda-test.sh cuda_lazy cuda_wait   # only these binaries
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
out=$target/null-cuda
mkdir -p "$out"
cc -O2 -Wall -Wextra -Werror -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" \
  bench/null-cuda/null_cuda.c -lpthread
ln -sf libcuda.so.1 "$out/libcuda.so"
lib=$(cd "$out" && pwd)
# A driver older than CUDA 13 (12.8's cuMemcpyBatchAsync only): tests that need it re-run
# themselves with it first on LD_LIBRARY_PATH (NULL_CUDA_V1_DIR).
mkdir -p "$out/v1"
cc -O2 -Wall -Wextra -Werror -shared -fPIC -Wl,-soname,libcuda.so.1 -DNULL_CUDA_NO_BATCH_V2 \
  -o "$out/v1/libcuda.so.1" bench/null-cuda/null_cuda.c -lpthread
ln -sf libcuda.so.1 "$out/v1/libcuda.so"
export NULL_CUDA_V1_DIR="$lib/v1"

passes=("sync/tuned" "sync/plain" "async/tuned")
only=()
for a in "$@"; do
  case $a in
    --full) passes+=("async/plain") ;;
    -*) echo "null-cuda-test: unknown option $a" >&2; exit 2 ;;
    *) only+=("$a") ;;
  esac
done

# The test binaries: built (a failure stops here), then listed as cargo names them.
build=(cargo test -p ferry --features gpu,fault-injection --test 'cuda_*' --no-run)
"${build[@]}"
mapfile -t bins < <("${build[@]}" --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | sort)
if ((${#only[@]})); then
  picked=()
  for b in "${bins[@]}"; do
    for o in "${only[@]}"; do [[ $(basename "$b") == "$o"-* ]] && picked+=("$b"); done
  done
  bins=("${picked[@]}")
fi
((${#bins[@]})) || { echo "null-cuda-test: no test binary found" >&2; exit 1; }

jobs=${NULL_CUDA_TEST_JOBS:-2}
limit=${NULL_CUDA_TEST_TIMEOUT:-300}
delay=${NULL_CUDA_TEST_ASYNC_US:-20}
failed=()

# Runs binary $2 in pass $1, output to its log, exit status to <log>.rc.
run_one() {
  local pass=$1 bin=$2 log=$3 mode=${1%/*} policy=${1#*/} rc=0
  local env=(LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FERRY_TEST_COMPLETION="$policy"
    FERRY_STRESS_SECS="${FERRY_STRESS_SECS:-20}")
  [[ $mode == async ]] && env+=(NULL_CUDA_ASYNC="$delay")
  env "${env[@]}" timeout -k 10 "$limit" "$bin" --test-threads=2 --nocapture >"$log" 2>&1 || rc=$?
  echo "$rc" >"$log.rc"
}

for pass in "${passes[@]}"; do
  logs=$out/logs/${pass/\//-}
  rm -rf "$logs" && mkdir -p "$logs"
  echo "== null CUDA driver, $pass: ${#bins[@]} test binaries"
  start=$SECONDS
  running=0
  for bin in "${bins[@]}"; do
    if ((running >= jobs)); then wait -n || true; running=$((running - 1)); fi
    run_one "$pass" "$bin" "$logs/$(basename "$bin" | sed 's/-[0-9a-f]*$//').log" &
    running=$((running + 1))
  done
  wait
  for bin in "${bins[@]}"; do
    name=$(basename "$bin" | sed 's/-[0-9a-f]*$//')
    log=$logs/$name.log
    rc=$(cat "$log.rc")
    result=$(grep -a '^test result:' "$log" || true)
    echo "$name: ${result:-no result line}"
    grep -ao 'skipped: .*' "$log" | sort | uniq -c | sed 's/^ */    /' || true
    if [[ $rc != 0 ]]; then
      [[ $rc == 124 || $rc == 137 ]] && echo "$name: killed after ${limit} s ($pass)"
      echo "---- $name ($pass): exit status $rc, its output:"
      cat "$log"
      failed+=("$name ($pass)")
    fi
  done
  echo "== $pass: $((SECONDS - start)) s"
done

if ((${#failed[@]})); then
  echo "null-cuda-test: failed: ${failed[*]}" >&2
  exit 1
fi
