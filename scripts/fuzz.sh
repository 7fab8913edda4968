#!/usr/bin/env bash
# Runs each cargo-fuzz target for a bounded time, one after another, one process each.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]     (default: 60 s; all targets)
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Each target starts
# from the committed seeds in fuzz/corpus/<target>/ and grows a working corpus in
# fuzz/corpus-run/<target>/ (not committed). Logs: fuzz/logs/<target>.log. Crashes:
# fuzz/artifacts/<target>/. Debug assertions (overflow checks) are on (-a). Runs under
# `nice -n 10` with -jobs=1 -workers=1: the machine is shared.
# Exit status: 0 when no target found a crash.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
for t in "${targets[@]}"; do nice -n 10 cargo +nightly fuzz build -a "$t"; done
mkdir -p logs
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus-run/$t" "artifacts/$t"
    cp -n "corpus/$t"/* "corpus-run/$t/" 2>/dev/null || true
    echo "== $t: ${secs}s (started $(date -u +%FT%TZ))"
    rc=0
    nice -n 10 cargo +nightly fuzz run -a "$t" "corpus-run/$t" -- \
        -max_total_time="$secs" -jobs=1 -workers=1 -print_final_stats=1 \
        >"logs/$t.log" 2>&1 || rc=$?
    [ -f fuzz-0.log ] && mv fuzz-0.log "logs/$t.job.log"
    log="logs/$t.log"
    [ -f "logs/$t.job.log" ] && log="logs/$t.job.log"
    grep -E "^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::peak_rss_mb" "$log" | tail -3 || true
    crashes=$(find "artifacts/$t" -type f | wc -l)
    echo "   exit $rc, corpus $(find "corpus-run/$t" -type f | wc -l) files, artifacts $crashes"
    if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        status=1
        grep -E "panicked|ERROR: libFuzzer|SUMMARY" "$log" | head -5 || true
    fi
done
exit $status
