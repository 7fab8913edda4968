#!/usr/bin/env bash
# The stress test at a chosen size (release build), then the fault-injection tests.
#
#   scripts/stress.sh [seconds] [max-ops] [threads]     (default: 120 s, 10^9 ops, 6 threads)
#
# FERRY_STRESS_SEED=<n> replays a run; the seed is printed at the start and in every failure.
# Runs under `nice -n 10`; the machine is shared.
set -euo pipefail
cd "$(dirname "$0")/.."
export FERRY_STRESS_SECS="${1:-120}" FERRY_STRESS_OPS="${2:-1000000000}" FERRY_STRESS_THREADS="${3:-6}"
nice -n 10 cargo test -p ferry --release --test stress -- --nocapture
nice -n 10 cargo test -p ferry --release --test faults -- --nocapture
