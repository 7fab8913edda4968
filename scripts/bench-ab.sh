#!/usr/bin/env bash
# A before/after comparison of two `ferry` binaries on one machine in one run: each selected
# test runs under the old binary, then the new one, test by test (so drift over the run falls
# on both alike), each writing its own JSON. scripts/bench-ab.py joins them into a table.
#
#   scripts/bench-ab.sh OLD_FERRY NEW_FERRY OUTDIR [ferry bench options]
#   python3 scripts/bench-ab.py OUTDIR            # the table (markdown)
#
# The tests are the ones `NEW_FERRY bench --list` says are available here, after the options'
# --engine (default: every engine), or those AB_TESTS lists (comma separated); a test that fails
# under either binary is named on stderr and the rest go on. Exit status 0 iff every run passed.
set -uo pipefail
AB_TESTS=${AB_TESTS:-}
if [ $# -lt 3 ]; then
  sed -n 2,12p "$0" >&2
  exit 2
fi
old=$1 new=$2 out=$3
shift 3
mkdir -p "$out"
engine=all
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --engine) engine=${args[i + 1]:-all} ;;
    --engine=*) engine=${args[i]#--engine=} ;;
  esac
done
# `--list` prints a line per test (name, kind, engine, sizes, words) and under it `available`
# or `unavailable: why`.
tests=${AB_TESTS//,/ }
[ -n "$tests" ] || tests=$("$new" bench --list | awk -v e="$engine" '
  /^[a-z]/ { name = $1; eng = $3; next }
  /^ +available/ { if (e == "all" || e == eng) print name }')
fail=0
for t in $tests; do
  for side in old new; do
    bin=$old
    [ "$side" = new ] && bin=$new
    if ! "$bin" bench --test "$t" --json "$out/$side.$t.json" "$@" >"$out/$side.$t.txt" 2>&1; then
      echo "bench-ab: $t failed under the $side binary (see $out/$side.$t.txt)" >&2
      fail=1
    fi
  done
done
exit $fail
