#!/usr/bin/env bash
# On the GPU host, from the repository's root (the copy the device tool carries): the GPU
# tests, the Python module's tests, then the measurements the open issues ask for, each step
# under its own time limit (a hang costs only its slot). One log per step in LOGDIR, one
# summary line per step on stdout; bench JSON beside the logs.
#
# Here, first (the bundle and the wheel travel in ignored folders named in `carry`):
#   CARGO_TARGET_DIR=... scripts/gpu-bundle.sh .gpu
#   maturin build --release -m crates/ferry-py/Cargo.toml -o .whl   # + KvikIO's wheels in .whl
# There, in one call:
#   bash scripts/gpu-measure.sh "$OUT" [STEP...]     # default: every step, in this order
# A device call is limited to 10 minutes: `tests python` in one call, `caller pipeline files`
# in the next (about 2-3 and 5-7 minutes on the H200 host) keep each well inside it.
#
# Steps: tests python caller pipeline files cufile (the last only where asked: it writes udev
# records, scripts/cufile-udev.sh), and survey testsplain aml ab aball fill kvorder blocks blocksclean disk confirm agenttests ckpt cold snapshot agent
# cpu cpuab nixl nixltcp tcpstreams nixltcpdev (only where asked). `survey`: the machine (GPU, driver, cores, memory, the bundle's
# commit); `tests` runs every test binary under FERRY_TEST_POLICIES (default both completion
# policies), `testsplain` under the plain policy alone (after `tests` with
# FERRY_TEST_POLICIES=tuned, so that the steps between come first).
# Environment: BUNDLE (default .gpu), WHEELS (default .whl), STEP_TIMEOUT (seconds per bench
# step, default 240), TESTS_TIMEOUT (seconds for the `tests` step, default 560); `ckpt`:
# CKPT_SCALE, CKPT_ROWS, CKPT_LIMIT (below); CALL_END, AFTER_STEP (step(), below).
set -uo pipefail
log=${1:?usage: gpu-measure.sh LOGDIR [STEP...]}
shift
mkdir -p "$log"
log=$(cd "$log" && pwd)
bundle=${BUNDLE:-.gpu}
wheels=${WHEELS:-.whl}
limit=${STEP_TIMEOUT:-240}
ferry="$bundle/ferry"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tests python caller pipeline files)
export PYTHONUNBUFFERED=1
fail=0

# step NAME LIMIT CMD...: runs CMD with its output in NAME.txt; prints status and seconds.
# CALL_END (epoch seconds, set by gpu-call.sh): the device call's end; a step's limit is cut
# to end 15 s before it, and a step with less than 20 s left is skipped (SKIP), so that a call
# never dies mid-step with its logs unpacked. AFTER_STEP: a command run after each step (the
# logs packed into the call's output, gpu-call.sh).
step() {
  local name=$1 lim=$2 t0 rc status left
  shift 2
  t0=$(date +%s)
  if [ -n "${CALL_END:-}" ]; then
    left=$((CALL_END - t0 - 15))
    if [ "$left" -lt 20 ]; then
      printf '%-4s %-22s %4d s (the call has %d s left)\n' SKIP "$name" 0 $((CALL_END - t0))
      fail=1
      return
    fi
    [ "$lim" -le "$left" ] || lim=$left
  fi
  timeout -k 5 "$lim" "$@" >"$log/$name.txt" 2>&1
  rc=$?
  case $rc in 0) status=ok ;; 124 | 137) status=TIME; fail=1 ;; *) status=FAIL; fail=1 ;; esac
  printf '%-4s %-22s %4d s\n' "$status" "$name" $(($(date +%s) - t0))
  [ -z "${AFTER_STEP:-}" ] || eval "$AFTER_STEP"
}

bench() { # bench NAME ARGS...: one `ferry bench --engine cuda` step with its JSON
  local name=$1
  shift
  step "$name" "$limit" "$ferry" bench --engine cuda "$@" --json "$log/$name.json"
}

for s in "${steps[@]}"; do
  case $s in
  survey)
    step survey 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,pcie.link.gen.current,pcie.link.width.current --format=csv;
      nproc; free -g; uname -r; cat "$0/COMMIT" 2>/dev/null; "$0/ferry" info' "$bundle" ;;
  tests)
    step tests "${TESTS_TIMEOUT:-560}" bash "$bundle/run.sh" "$log/tests" ;;
  testsplain)
    step testsplain "${TESTS_TIMEOUT:-560}" env FERRY_TEST_POLICIES=plain bash "$bundle/run.sh" "$log/testsplain" ;;
  python)
    # The wheels into a private folder (no network there), then pytest with PyTorch.
    step wheels 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site "$wheels"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    step pytest 300 python3 -m pytest -q -rs crates/ferry-py/tests ;;
  caller) # issue 14: the caller's view, small copies, threads
    bench caller --test cuda-h2d-pinned,cuda-d2h-pinned,cuda-d2d --sizes 64K,1M,16M,256M,1G
    bench latency --test cuda-latency,cuda-wait-cpu,cuda-threads ;;
  pipeline) # issue 13: the pipelines and their sources
    bench pipeline --test cuda-pipeline,cuda-pipeline-upcompute,cuda-pipeline-pageable,cuda-pipeline-file \
      --sizes 64M,256M --trace "$log/pipeline-trace.json"
    FERRY_STAGING_NT_H2D=1 bench pipeline-nt --test cuda-pipeline-pageable,cuda-pipeline-file --sizes 64M,256M ;;
  files) # issue 16: checkpoints against safetensors and KvikIO, cold reads
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    step checkpoint 300 python3 bench/peers/checkpoint_load.py --ferry "$ferry" --gib 4 --repeat 5 \
      --out "$log/checkpoint.json"
    bench file-read --test cuda-file-read,cuda-file-read-direct,cuda-file-read-cufile --sizes 256M,1G ;;
  cufile) # issue 16: cuFile's compatibility mode, with the udev records a VM without udevd lacks
    export CUFILE_FORCE_COMPAT_MODE=true
    step cufile-tests 200 scripts/cufile-udev.sh "$bundle/tests/cuda_cufile" --nocapture --test-threads=1
    step cufile-bench "$limit" scripts/cufile-udev.sh "$ferry" bench --engine cuda \
      --test cuda-file-read-cufile --sizes 256M,1G --json "$log/cufile-bench.json"
    unset CUFILE_FORCE_COMPAT_MODE ;;
  aml) # issue 31: AML's CUDA programs against libaml and AML (.aml-cuda, carried: see
    # scripts/aml-cuda-programs.sh)
    step aml-cuda 300 bash .aml-cuda/run.sh "$log/aml-cuda" ;;
  ab | aball) # issue 30: before/after against OLD_FERRY (default .gpu-old/ferry): `ab` the
    # rows the submission trunk and the staging subsystem touch at five sizes, `aball` every
    # cuda test but the block copies' and the file tests that need a cold disk or cuFile, each
    # at its own sizes, 5 samples (issue 30's done-when table, in one call: the tenth run's
    # took 450 s; pass CALL_LIMIT). AB_TESTS, AB_SIZES ("" for each test's own sizes),
    # AB_SAMPLES, AB_LIMIT (seconds for the step), AB_ROUNDS (below) change them.
    if [ "$s" = aball ]; then
      tests=${AB_TESTS:-cuda-h2d-pinned,cuda-d2h-pinned,cuda-h2d-pageable,cuda-d2h-pageable,cuda-d2d,cuda-bidir,cuda-tile,cuda-h2d-mapped,cuda-d2h-mapped,cuda-transpose,cuda-transpose-h2d,cuda-transpose-bf16,cuda-transpose-h2d-bf16,cuda-transpose-batched,cuda-scatter,cuda-scatter-pageable,cuda-gather-pageable,cuda-latency,cuda-latency-spin,cuda-latency-hybrid,cuda-wait-cpu,cuda-threads,cuda-latency-parts,cuda-file-read,cuda-d2d-split,cuda-pipeline,cuda-pipeline-upcompute,cuda-pipeline-pageable,cuda-pipeline-file}
      sizes=() samples=${AB_SAMPLES:-5}
      [ -z "${AB_SIZES:-}" ] || sizes=(--sizes "$AB_SIZES")
    else
      tests=${AB_TESTS:-cuda-latency,cuda-h2d-pinned,cuda-d2h-pinned,cuda-d2d,cuda-h2d-pageable,cuda-d2h-pageable,cuda-gather-pageable,cuda-scatter,cuda-pipeline-pageable,cuda-file-read}
      sizes=(--sizes "${AB_SIZES-4K,64K,1M,16M,256M}") samples=${AB_SAMPLES:-7}
      [ -n "${AB_SIZES-x}" ] || sizes=()
    fi
    # AB_ROUNDS=N: N rounds, each binary in a process of its own per test and round, into
    # $s.1 .. $s.N (the spread between processes, beside the one between samples).
    rounds=${AB_ROUNDS:-1}
    for r in $(seq "$rounds"); do
      name=$s
      [ "$rounds" -eq 1 ] || name=$s.$r
      step "$name" "${AB_LIMIT:-560}" env AB_TESTS="$tests" \
        bash scripts/bench-ab.sh "${OLD_FERRY:-.gpu-old/ferry}" "$ferry" "$log/$name" --engine cuda \
        --samples "$samples" "${sizes[@]}"
      step "$name-table" 30 python3 scripts/bench-ab.py "$log/$name"
    done ;;
  fill) # issue 30: the pageable pipeline, old binary and new in turns, FILL_ROUNDS rounds
    # (default 3), one line each. FILL_VARIANTS: old or new, then -private (a set of workers of
    # the pipeline's own), -tN (N fill threads), -fM (FERRY_BENCH_FILL mode M), e.g. old-f5.
    for r in $(seq "${FILL_ROUNDS:-3}"); do
      for v in ${FILL_VARIANTS:-old new new-private new-t6 new-t12}; do
        bin=$ferry
        [ "${v%%-*}" = old ] && bin=${OLD_FERRY:-.gpu-old/ferry}
        env=(FERRY_BENCH_FILL_PRIVATE=0)
        IFS=- read -ra parts <<<"$v"
        for p in "${parts[@]:1}"; do
          case $p in
            private) env=(FERRY_BENCH_FILL_PRIVATE=1) ;;
            t*) env+=(FERRY_BENCH_FILL_THREADS=${p#t}) ;;
            f*) env+=(FERRY_BENCH_FILL=${p#f}) ;;
          esac
        done
        step "fill-$v-$r" 60 env "${env[@]}" "$bin" bench --engine cuda \
          --test cuda-pipeline-pageable --sizes 64M,256M --samples 7
        grep -h "^cuda-pipeline-pageable" "$log/fill-$v-$r.txt" | sed "s/^/$v $r /"
      done
    done ;;
  kvorder) # issue 34: kv_blocks.py's h2d rows with the band's first shape changed (ferry
    # measures the 64 KiB-1 MiB host -> device band on its first calls there): 512K first, then
    # 64K first, each in a process of its own
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    for order in 512K,64K 64K,512K; do
      step "kvorder-$order" 120 python3 bench/peers/kv_blocks.py --ways h2d --sizes "$order" \
        --counts 256 --no-interference --json "$log/kvorder-$order.json"
      grep -h "^h2d" "$log/kvorder-$order.txt" | sed "s/^/$order first: /"
    done ;;
  blocksclean) # issue 34: the block copies alone, BLOCKS_SAMPLES samples a series (default
    # 30: a row whose samples change phase mid-row, as the d2h 16 x 32 KiB row's do, then has
    # both phases in every series rather than the median on a boundary of 10)
    bench blocks --test cuda-blocks-h2d,cuda-blocks-d2h,cuda-blocks-d2d --samples "${BLOCKS_SAMPLES:-30}" ;;
  nixltcp) # issue 36: host memory over TCP on loopback, ferry's agent against NIXL's (UCX's
    # TCP); NIXL installed by an earlier call of the same lease into /tmp/site-nixl (its 58 MB
    # wheel fills a call's carry alone: `pip install --target /tmp/site-nixl`), ferry's wheel
    # from WHEELS here
    step wheels 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site "$wheels"/*.whl
    export PYTHONPATH=/tmp/site:/tmp/site-nixl${PYTHONPATH:+:$PYTHONPATH}
    step ipc-tcp "$limit" "$ferry" bench --engine cpu --test ipc-tcp-write,ipc-tcp-read \
      --sizes 4K,64K,1M,16M,64M --json "$log/ipc-tcp.json"
    step nixl-tcp 300 python3 bench/agent/nixl_tcp.py --full --json "$log/nixl_tcp.json" ;;
  tcpstreams) # issue 36: the agent's TCP streams per connection (TCP_STREAMS, default "1 2 4
    # 8") on loopback against a plain socket, then against NIXL (as `nixltcp`: NIXL in
    # /tmp/site-nixl) with the default and with one stream; the agent's tests on 16 cores
    step wheels 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site "$wheels"/*.whl
    export PYTHONPATH=/tmp/site:/tmp/site-nixl${PYTHONPATH:+:$PYTHONPATH}
    step agent-tests 120 "$bundle/tests/cuda_agent" --nocapture --test-threads=1
    for n in ${TCP_STREAMS:-1 2 4 8}; do
      step "ipc-tcp-s$n" "$limit" env FERRY_AGENT_TCP_STREAMS="$n" "$ferry" bench --engine cpu \
        --test ipc-tcp-write,ipc-tcp-read --sizes 64K,1M,16M,64M --json "$log/ipc-tcp-s$n.json"
    done
    step nixl-tcp 300 python3 bench/agent/nixl_tcp.py --full --json "$log/nixl_tcp.json"
    step nixl-tcp-s1 300 python3 bench/agent/nixl_tcp.py --full --streams 1 \
      --json "$log/nixl_tcp_s1.json" ;;
  nixltcpdev) # issue 36: device memory over TCP on loopback (each side stages it through host
    # memory), ferry's agent against NIXL's (UCX_TLS=tcp,cuda_copy; NIXL in /tmp/site-nixl as
    # for `nixltcp`), with the default streams and with one
    step wheels 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site "$wheels"/*.whl
    export PYTHONPATH=/tmp/site:/tmp/site-nixl${PYTHONPATH:+:$PYTHONPATH}
    step nixl-tcp-dev 300 python3 bench/agent/nixl_tcp.py --full --memory device \
      --json "$log/nixl_tcp_dev.json"
    step nixl-tcp-dev-s1 300 python3 bench/agent/nixl_tcp.py --full --memory device --streams 1 \
      --json "$log/nixl_tcp_dev_s1.json" ;;
  blocks) # issue 34: block copies, SMs free and busy, against torch's loops
    bench blocks --test cuda-blocks-h2d,cuda-blocks-d2h,cuda-blocks-d2d
    bench blocks-busy --test cuda-blocks-busy --sizes 8K,64K,512K,2M
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    step kv-blocks 330 python3 bench/peers/kv_blocks.py --json "$log/kv_blocks.json" ;;
  ckpt) # issue 35: sharded bf16 checkpoints against safetensors, fastsafetensors, Run:ai.
    # CKPT_ROWS=load|save|all (default all) and --keep: at --scale 1 (16 GiB) every row did not
    # fit one call (the fourth H100 run: 520 s, no row printed); run `load` then `save` in two
    # calls of one lease, the checkpoint written once under /tmp and kept between them.
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    # CKPT_SAVE_ROWS=writers: the writers' rows alone (ferry's three, save_file, torch.save).
    step "ckpt-${CKPT_ROWS:-all}" "${CKPT_LIMIT:-400}" python3 bench/ckpt/compare.py \
      --scale "${CKPT_SCALE:-0.5}" --repeat "${CKPT_REPEAT:-2}" --rows "${CKPT_ROWS:-all}" --keep \
      --save-rows "${CKPT_SAVE_ROWS:-all}" --ferry-cli "$ferry" --json "$log/ckpt-${CKPT_ROWS:-all}.json"
    grep -h "save\|ratio\|page cache\|writer" "$log/ckpt-${CKPT_ROWS:-all}.txt" | head -32 ;;
  cold) # issue 35: the loads with the page cache dropped before each (as root)
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    step ckpt-cold 400 python3 bench/ckpt/compare.py --scale "${CKPT_SCALE:-0.5}" --repeat 2 \
      --cold --rows load --json "$log/ckpt-cold.json" ;;
  snapshot) # issue 35: the snapshot saves' GPU tests (kept pinned memory) under both policies
    for policy in tuned plain; do
      step "snapshot-$policy" 120 env FERRY_TEST_COMPLETION=$policy \
        "$bundle/tests/cuda_snapshot" --test-threads=1
    done ;;
  disk) # issue 35: the page cache, the disk and both at once (scripts/disk-mix.sh), for the
    # hybrid writer's buffered share; DISK_ROWS to change the rows
    step disk 200 bash scripts/disk-mix.sh /tmp/ferry-disk-mix ${DISK_ROWS:-8:8 8:0 8:4 16:16 16:0 16:10 16:12}
    grep -h "^row\|^dirty" "$log/disk.txt" ;;
  confirm) # issue 35: the hybrid save's GPU test (both policies), the band per size's test,
    # and the writer a GPU save of a generated 4 GiB checkpoint in 8 shards takes (twice)
    for policy in tuned plain; do
      for b in cuda_checkpoint cuda_paths; do
        step "$b-$policy" 120 env FERRY_TEST_COMPLETION=$policy "$bundle/tests/$b" --nocapture
        grep -h "test result" "$log/$b-$policy.txt" | sed "s/^/$b $policy: /"
      done
    done
    grep -h "save 8 tensors\|strategies" "$log/cuda_checkpoint-tuned.txt" "$log/cuda_paths-tuned.txt" | cut -c1-260
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    step confirm-ckpt 120 python3 -c 'import torch, ferry
t = {f"t{i:02}": torch.full((64 << 20,), float(i), dtype=torch.bfloat16) for i in range(32)}
ferry.save_safetensors(t, "/tmp/ferry-confirm", max_shard_size=512 << 20)'
    for r in 1 2; do
      rm -rf /tmp/ferry-confirm-out && mkdir -p /tmp/ferry-confirm-out && sync
      step "confirm-save-$r" 120 "$ferry" save /tmp/ferry-confirm /tmp/ferry-confirm-out --device cuda
      grep -h "saved\|writer" "$log/confirm-save-$r.txt" | cut -c1-300
    done
    rm -rf /tmp/ferry-confirm-out && mkdir -p /tmp/ferry-confirm-out && sync
    step confirm-py 120 python3 -c 'import torch, ferry
t = {f"t{i:02}": torch.full((64 << 20,), float(i), dtype=torch.bfloat16, device="cuda") for i in range(32)}
for r in range(2):
    print("python save from the GPU:", ferry.save_safetensors(t, "/tmp/ferry-confirm-out", max_shard_size=512 << 20))
back = ferry.load_safetensors("/tmp/ferry-confirm-out", device="cuda:0")
print("read back equal:", all(torch.equal(back[k], v) for k, v in t.items()))'
    grep -h "python save\|read back" "$log/confirm-py.txt" | cut -c1-400
    rm -rf /tmp/ferry-confirm /tmp/ferry-confirm-out ;;
  agenttests) # issue 36: the agent's GPU tests alone (a short call), both policies
    for policy in tuned plain; do
      step "cuda_agent-$policy" 150 env FERRY_TEST_COMPLETION=$policy "$bundle/tests/cuda_agent"
      grep -h "test result" "$log/cuda_agent-$policy.txt"
    done ;;
  agent) # issue 36: two processes on one GPU
    step agent 240 "$bundle/examples/09_agent_ipc" --full --json "$log/agent.json"
    bench ipc --test ipc-d2d,ipc-h2d
    step ipc-tcp "$limit" "$ferry" bench --engine cpu --test ipc-tcp-write,ipc-tcp-read \
      --sizes 4K,64K,1M,16M,64M --json "$log/ipc-tcp.json" ;;
  cpu) # issue 32: the CPU engine against the obvious loops on the GPU host's 16 cores
    step cpu 120 "$ferry" bench --engine cpu --test \
      cpu-contig,cpu-tile,cpu-transpose-f32,cpu-transpose-f64,cpu-transpose-bf16 \
      --sizes 4K,64K,1M,16M,256M --json "$log/cpu.json" ;;
  cpuab) # issue 32: the CPU family, CPU_OLD (default .gpu-old/ferry-cpu: `OLD_NAME=ferry-cpu
    # gpu-call.sh pack REV`) and this bundle's binary test by test in turns, CPUAB_ROUNDS rounds
    # (default 2), a table each.
    for r in $(seq "${CPUAB_ROUNDS:-2}"); do
      step "cpuab$r" "${CPUAB_LIMIT:-150}" env AB_TESTS=cpu-contig,cpu-tile,cpu-transpose-f32,cpu-transpose-f64,cpu-transpose-bf16 \
        bash scripts/bench-ab.sh "${CPU_OLD:-.gpu-old/ferry-cpu}" "$ferry" "$log/cpuab$r" --engine cpu \
        --sizes 4K,64K,1M,16M,256M
      step "cpuab$r-table" 30 python3 scripts/bench-ab.py "$log/cpuab$r"
    done ;;
  nixl) # issue 36: the same transfers through NIXL (its wheel in WHEELS)
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    step nixl 300 python3 bench/agent/nixl_compare.py --full --ferry "$log/agent.json" \
      --json "$log/nixl.json" ;;
  *)
    echo "unknown step $s (survey tests testsplain python caller pipeline files cufile aml ab aball fill kvorder blocks blocksclean disk confirm agenttests ckpt cold snapshot agent cpu cpuab nixl nixltcp)" >&2
    fail=1 ;;
  esac
done
exit $fail
