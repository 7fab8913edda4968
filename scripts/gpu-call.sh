#!/usr/bin/env bash
# One device call's worth of GPU measurements, from packing here to logs back there.
#
# Here (a Rust toolchain; the folders are ignored through .git/info/exclude and travel in the
# device call's `carry`):
#   bash scripts/gpu-call.sh pack [OLD_REV]
#     builds the bundle (scripts/gpu-bundle.sh .gpu) and packs it into .gpu-pack/gpu.tar.xz with
#     its commit, the Python wheel into .whl/, and with OLD_REV the `ferry` CLI of that revision
#     (a worktree in target/old-rev, its own target folder) into .gpu-pack/old.tar.xz for the
#     before/after step `ab`. OLD_NAME=NAME: that CLI as .gpu-old/NAME instead (its commit in
#     .gpu-old/NAME.commit), packed into .gpu-pack/old-NAME.tar.xz beside the others (a second
#     old binary, e.g. for `cpuab`).
# There (the device call; carry [".gpu-pack", ".whl"]):
#   bash scripts/gpu-call.sh NAME STEP...
#     unpacks the bundles (.gpu, .gpu-old), runs scripts/gpu-measure.sh's STEPs with their logs in
#     /tmp/gpu-logs/NAME and packs that folder into $OUT/NAME.tar.xz (the device tool brings
#     back 8 files at most, 2 folders deep), after every step too. Each step prints one summary
#     line. CALL_LIMIT: the device call's timeout in seconds (default 590); the steps' own
#     limits are cut to end inside it, and a step with too little time left is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: gpu-call.sh pack [OLD_REV] | gpu-call.sh NAME STEP...}
shift

if [ "$mode" = pack ]; then
  set -e
  bash scripts/gpu-bundle.sh .gpu
  git rev-parse HEAD >.gpu/COMMIT
  git diff --quiet HEAD || echo "(with uncommitted changes)" >>.gpu/COMMIT
  mkdir -p .gpu-pack .whl
  tar -cf - .gpu | xz -T2 -6 >.gpu-pack/gpu.tar.xz
  rm -f .whl/ferry-*.whl
  venv=${PY_VENV:-target/py-venv}
  [ -x "$venv/bin/maturin" ] || { python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q "maturin>=1.5,<2"; }
  "$venv/bin/maturin" build --release -q -m crates/ferry-py/Cargo.toml -o .whl
  if [ -n "${1:-}" ]; then
    old=target/old-rev
    git worktree remove --force "$old" 2>/dev/null || rm -rf "$old"
    git worktree add --detach "$old" "$1"
    (cd "$old" && CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
      CARGO_TARGET_DIR=../old-target cargo build --release -q -p ferry-cli)
    rm -rf .gpu-old && mkdir -p .gpu-old
    if [ -n "${OLD_NAME:-}" ]; then
      cp target/old-target/release/ferry ".gpu-old/$OLD_NAME"
      git rev-parse "$1" >".gpu-old/$OLD_NAME.commit"
      tar -cf - .gpu-old | xz -T2 -6 >".gpu-pack/old-$OLD_NAME.tar.xz"
    else
      cp target/old-target/release/ferry .gpu-old/ferry
      git rev-parse "$1" >.gpu-old/COMMIT
      tar -cf - .gpu-old | xz -T2 -6 >.gpu-pack/old.tar.xz
    fi
    git worktree remove --force "$old"
  fi
  du -ch .gpu-pack/* .whl/* | tail -1
  exit 0
fi

: "${OUT:?OUT: the device call output folder}"
for pack in .gpu-pack/gpu.tar.xz .gpu-pack/old.tar.xz .gpu-pack/old-*.tar.xz; do
  [ -e "$pack" ] && xz -dc "$pack" | tar -xf -
done
echo "bundle $(head -1 .gpu/COMMIT 2>/dev/null); old $(head -1 .gpu-old/COMMIT 2>/dev/null || echo none)"
# The wheels (ferry's, peers') for every step that imports them, the `python` step's pytest too.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
mkdir -p /tmp/gpu-logs
# The logs are packed after every step, so that a call killed at its limit still brings back
# what ran; CALL_LIMIT (seconds, default 590: pass the device call's timeout) cuts the last
# steps' limits to end inside it (gpu-measure.sh's step()).
pack() { tar -C /tmp/gpu-logs -cf - "$mode" | xz -T4 -6 >"$OUT/$mode.tar.xz"; }
export CALL_END=$(($(date +%s) + ${CALL_LIMIT:-590}))
export AFTER_STEP="tar -C /tmp/gpu-logs -cf - '$mode' | xz -T4 -6 >'$OUT/$mode.tar.xz'"
bash scripts/gpu-measure.sh "/tmp/gpu-logs/$mode" "$@"
rc=$?
pack
exit $rc
