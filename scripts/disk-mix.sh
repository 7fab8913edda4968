#!/usr/bin/env bash
# Issue 35: how fast a machine puts bytes into files buffered (the page cache), with O_DIRECT
# (the disk), and both at once (a share buffered beside the rest O_DIRECT, the hybrid writer's
# idea), in parallel dd streams of 16 MiB blocks from /dev/zero, `sync` (untimed) before each
# row. The time is from the first stream's start to the last one's end; the buffered share's
# writeback is not waited for (a save into the page cache returns without it).
#   bash scripts/disk-mix.sh DIR "TOTAL_GIB:BUFFERED_GIB[:STREAMS]" ...
# e.g. 8:8 8:0 8:4 16:16 16:0 16:10: 8 GiB buffered, O_DIRECT, half and half, then 16 GiB.
set -euo pipefail
dir=${1:?usage: disk-mix.sh DIR TOTAL:BUFFERED[:STREAMS]...}
shift
mkdir -p "$dir"
now() { date +%s.%N; }
dirty() { awk '/^(Dirty|Writeback):/ {printf "%s %d MiB ", $1, $2 / 1024}' /proc/meminfo; }
echo "dirty_ratio $(sysctl -n vm.dirty_ratio) dirty_background_ratio $(sysctl -n vm.dirty_background_ratio)" \
  "dirty_bytes $(sysctl -n vm.dirty_bytes) $(awk '/^(MemTotal|MemAvailable):/ {printf "%s %d GiB ", $1, $2 / 1048576}' /proc/meminfo)"
for row in "$@"; do
  IFS=: read -r total buffered streams <<<"$row"
  streams=${streams:-4}
  direct=$((total - buffered))
  sync
  t0=$(now)
  pids=()
  # Each share cut over `streams` files (a share of 0 GiB starts none).
  for kind in buffered direct; do
    gib=$buffered flag=()
    [ $kind = direct ] && gib=$direct flag=(oflag=direct)
    [ "$gib" -gt 0 ] || continue
    blocks=$((gib * 64 / streams))
    for s in $(seq "$streams"); do
      dd if=/dev/zero of="$dir/$kind-$s" bs=16M count="$blocks" "${flag[@]}" status=none &
      pids+=($!)
    done
  done
  wait "${pids[@]}"
  t1=$(now)
  awk -v a="$t0" -v b="$t1" -v t="$total" -v bu="$buffered" -v d="$direct" -v n="$streams" -v m="$(dirty)" \
    'BEGIN { s = b - a; printf "row %s GiB (buffered %s, O_DIRECT %s, %s streams each): %.3f s, %.2f GB/s; %s\n", t, bu, d, n, s, t * 1.073741824 / s, m }'
  rm -f "$dir"/buffered-* "$dir"/direct-*
done
sync
