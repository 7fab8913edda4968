#!/usr/bin/env bash
# Memory checking of the core (layouts, planner, CPU and multiplex engines):
#   1. Miri (nightly, `rustup +nightly component add miri`) over tests/faults.rs and
#      tests/stress.rs; heavy cases are `#[cfg_attr(miri, ignore)]`, small_cases_for_miri and a
#      12-operation, 2-thread stress run cover the same paths with small buffers.
#   2. AddressSanitizer (nightly) over the same test binaries at full size.
#   3. valgrind memcheck over the faults test binary (stable build).
#
#   scripts/sanitize.sh [miri|asan|valgrind]...     (default: all three)
#
# Runs under `nice -n 10`; the machine is shared. Exit status: 0 when every step is clean.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(miri asan valgrind)
for s in "${steps[@]}"; do
    echo "== $s (started $(date -u +%FT%TZ))"
    case "$s" in
    miri)
        # Many threads and a counting allocator: Miri's defaults (isolation on, Stacked Borrows).
        nice -n 10 cargo +nightly miri test -p ferry --test faults --test stress
        ;;
    asan)
        RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address" ASAN_OPTIONS="detect_leaks=1" \
            nice -n 10 cargo +nightly test -p ferry --target x86_64-unknown-linux-gnu \
            --target-dir target/asan --test faults --test stress
        ;;
    valgrind)
        nice -n 10 cargo test -p ferry --test faults --no-run
        bin=$(ls -t target/debug/deps/faults-* | grep -v '\.d$' | head -1)
        # The leak test spawns the binary again (a child process); valgrind follows it too.
        nice -n 10 valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
            --trace-children=yes "$bin" --test-threads=1
        ;;
    *)
        echo "unknown step $s" >&2
        exit 2
        ;;
    esac
done
