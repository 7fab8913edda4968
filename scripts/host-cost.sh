#!/usr/bin/env bash
# ferry's host-side cost per request, without a GPU: builds the null CUDA driver
# (bench/null-cuda/null_cuda.c in its synchronous mode, NULL_CUDA_ASYNC unset: every call
# answered at once, copies done by memmove on the calling thread) as
# target/null-cuda/libcuda.so.1 and runs `ferry bench --engine cuda` against it. A row's ferry time minus its raw time is ferry's own work per request (plan,
# route, request, wait); the GB/s figures are host memmoves, never GPU figures.
#
#   scripts/host-cost.sh                      # cuda-latency and cuda-latency-spin, 4 B..64 KiB
#   scripts/host-cost.sh --test cuda-h2d-pinned --sizes 4K,64K
set -euo pipefail
cd "$(dirname "$0")/.."
out=${CARGO_TARGET_DIR:-target}/null-cuda
mkdir -p "$out"
cc -O2 -Wall -Wextra -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" bench/null-cuda/null_cuda.c -lpthread
ln -sf libcuda.so.1 "$out/libcuda.so"
cargo build --release -q -p ferry-cli
ferry=${CARGO_TARGET_DIR:-target}/release/ferry
[ $# -gt 0 ] || set -- --test cuda-latency,cuda-latency-spin --samples 30
LD_LIBRARY_PATH="$(cd "$out" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$ferry" bench --engine cuda "$@"
