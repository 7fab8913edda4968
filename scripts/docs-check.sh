#!/usr/bin/env bash
# Checks what the README tells a user to run outside cargo test (CI runs it; needs cc):
# - the C example's lines (the ```sh block after `<!-- c-example -->`), run from the repository
#   root with CARGO_TARGET_DIR set to an absolute path (where the library is), and the program's
#   last line "copy_tile: OK";
# - scripts/aml-install.sh with a relative PREFIX, called from another directory: the files
#   land under that directory (they landed under the repository).
# Usage: scripts/docs-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d /tmp/docs-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
target=$(cargo metadata --format-version 1 --no-deps | sed 's/.*"target_directory":"\([^"]*\)".*/\1/')
# The C example, as the README gives it, its output program in the scratch folder.
awk '/<!-- c-example -->/ {on = 1; next} on && /^```sh/ {inside = 1; next}
     inside && /^```/ {exit} inside {print}' README.md >"$work/c-example.sh"
grep -q 'copy_tile.c' "$work/c-example.sh" || { echo "docs-check: no C example in README.md" >&2; exit 1; }
sed -i "s|-o copy_tile|-o $work/copy_tile|; s|^\./copy_tile|$work/copy_tile|" "$work/c-example.sh"
CARGO_TARGET_DIR=$target bash -e "$work/c-example.sh" >"$work/c-example.log" 2>&1 || {
  cat "$work/c-example.log"; echo "docs-check: the README's C example failed" >&2; exit 1; }
tail -n 1 "$work/c-example.log" | grep -qx 'copy_tile: OK' || {
  cat "$work/c-example.log"; echo "docs-check: copy_tile did not end with OK" >&2; exit 1; }
echo "docs-check: README C example ok" >&2
# aml-install.sh with a relative prefix, from another directory.
mkdir -p "$work/caller"
(cd "$work/caller" && "$root/scripts/aml-install.sh" rel/prefix) 2>"$work/install.log" || {
  cat "$work/install.log"; echo "docs-check: aml-install.sh failed" >&2; exit 1; }
for f in lib/libaml.so lib/libaml.a include/aml.h lib/pkgconfig/aml.pc; do
  [[ -e $work/caller/rel/prefix/$f ]] || { echo "docs-check: $f not under the caller's rel/prefix" >&2; exit 1; }
done
[[ ! -e $root/rel ]] || { echo "docs-check: aml-install.sh wrote under the repository" >&2; exit 1; }
grep -q "^prefix=$work/caller/rel/prefix\$" "$work/caller/rel/prefix/lib/pkgconfig/aml.pc" || {
  cat "$work/caller/rel/prefix/lib/pkgconfig/aml.pc"; echo "docs-check: aml.pc names another prefix" >&2; exit 1; }
echo "docs-check: aml-install.sh relative prefix ok" >&2
