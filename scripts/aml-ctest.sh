#!/usr/bin/env bash
# The AML drop-in check (CI runs it): installs libaml into a temporary prefix, builds the C
# programs of crates/ferry-aml/tests/c with the C compiler (cc) and the C++ compiler (c++)
# against the installed headers and library through pkg-config only, runs them (shared and
# static library), and under valgrind where it is installed. Needs cc, c++ and pkg-config.
# Usage: scripts/aml-ctest.sh [--release]
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in cc c++ pkg-config; do
  command -v "$tool" >/dev/null || { echo "aml-ctest: $tool is required" >&2; exit 1; }
done
prefix=$(mktemp -d /tmp/aml-prefix.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
scripts/aml-install.sh "$prefix" "$@"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cflags=$(pkg-config --cflags aml)
libs=$(pkg-config --libs aml)
static=$(pkg-config --libs --static aml | sed 's/-laml/-l:libaml.a/')
out=$prefix/bin
mkdir -p "$out"
run() { # name, command...
  local name=$1; shift
  echo "== $name" >&2
  LD_LIBRARY_PATH="$prefix/lib" "$@" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; echo "aml-ctest: $name failed" >&2; exit 1; }
  tail -n 1 "$out/$name.log"
}
for src in crates/ferry-aml/tests/c/*.c; do
  name=$(basename "$src" .c)
  # The C and C++ builds: the same source, unchanged; only include and link flags.
  cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O1 -g $cflags "$src" -o "$out/$name-c" $libs -lpthread
  c++ -x c++ -std=c++11 -Wall -Wextra -Werror -O1 -g $cflags "$src" -o "$out/$name-cxx" $libs -lpthread
  cc -std=c11 -D_GNU_SOURCE -O1 -g $cflags "$src" -o "$out/$name-static" $static -lpthread
  run "$name-c" "$out/$name-c"
  run "$name-cxx" "$out/$name-cxx"
  run "$name-static" "$out/$name-static"
  if command -v valgrind >/dev/null; then
    run "$name-valgrind" valgrind --quiet --error-exitcode=1 --leak-check=full "$out/$name-c"
  else
    echo "aml-ctest: valgrind not installed, memory check of $name skipped" >&2
  fi
done
echo "aml-ctest: OK" >&2
