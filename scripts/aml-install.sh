#!/usr/bin/env bash
# Installs libaml (crates/ferry-aml: AML's DMA API on ferry) into PREFIX: headers in
# PREFIX/include (aml.h, aml/...), libaml.so and libaml.a in PREFIX/lib, and
# PREFIX/lib/pkgconfig/aml.pc. An AML program then builds with
#   cc prog.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs aml)
# Usage: scripts/aml-install.sh PREFIX [--release]. A relative PREFIX is taken from the
# directory the script is called from; the library is taken from wherever cargo builds it
# (CARGO_TARGET_DIR or a configured target-dir included).
set -euo pipefail
prefix=${1:?usage: scripts/aml-install.sh PREFIX [--release]}
# Resolved before the cd below: against the caller's directory, not the repository.
case $prefix in
  /*) ;;
  *) prefix=$PWD/$prefix ;;
esac
cd "$(dirname "$0")/.."
profile=debug
flags=()
if [[ ${2:-} == --release ]]; then profile=release; flags=(--release); fi
cargo build -p ferry-aml "${flags[@]}" >&2
target=$(cargo metadata --format-version 1 --no-deps | sed 's/.*"target_directory":"\([^"]*\)".*/\1/')
mkdir -p "$prefix/include" "$prefix/lib/pkgconfig"
cp -r crates/ferry-aml/include/. "$prefix/include/"
cp "$target/$profile/libaml.so" "$target/$profile/libaml.a" "$prefix/lib/"
sed "s|@PREFIX@|$(cd "$prefix" && pwd)|" crates/ferry-aml/aml.pc.in >"$prefix/lib/pkgconfig/aml.pc"
echo "libaml installed in $prefix" >&2
