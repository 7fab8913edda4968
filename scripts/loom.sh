#!/usr/bin/env bash
# Model checking of ferry's lock-free completion code with loom (https://docs.rs/loom): the
# completion slot (a completion against a waker's registration, a sleeping waiter, another
# completion), the CPU pool's hand-off of a request's chunks between its workers and the
# thread waiting for it, and the staging subsystem's host copy workers (a job posted to sleeping
# workers, its untaken indices taken back, its join, a worker's panic, the shutdown), fills on
# them (cut into pieces, their completion, sleeping workers, a filler's drop),
# ring (a slot refilled only after its reader's request completed) and the staged copy's
# hand-off of a slot between a host worker and the coordinator
# (`engine/cuda/paths/staged/handoff.rs`: filled or drained slot to the coordinator, the slot
# back only after its DMA ended, a failed coordinator releasing a waiting worker). `--cfg loom` swaps std's synchronisation types for loom's in the
# files that use `crates/ferry/src/sync.rs`; only the library's unit tests build so (loom is a
# dev-dependency), and the filter runs the models alone (`loom_tests` modules). The models are
# linted first: no other build compiles them. Its own target directory: RUSTFLAGS differ from
# every other build, which would otherwise rebuild from scratch each time one follows the
# other. About 3 minutes from a cold target directory on 2 cores, the models themselves about
# 30 seconds of CPU (the fill queue's most of it).
#
#   scripts/loom.sh                         # every model, at most 4 preemptions each
#   LOOM_MAX_PREEMPTIONS=6 scripts/loom.sh  # deeper (about 2 minutes of models)
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"
cargo clippy -p ferry --lib --profile test -- -D warnings
cargo test -p ferry --lib loom -- "$@"
