#!/usr/bin/env bash
# Builds AML programs that need a GPU (AML's CUDA tests and tutorials, or any C program of
# AML's API) against a prebuilt AML library, CUDA's headers and its static runtime, into a
# folder that runs on a GPU host with no compiler, then runs them (unless --no-run). The
# programs and the library come from outside as arguments: nothing of AML is in this
# repository.
#
#   scripts/aml-cuda-programs.sh [OPTIONS] PREFIX OUTDIR PROGRAM.c[,HELPER.c...]...
#   bash OUTDIR/run.sh [LOGDIR]          # on the GPU host: one line per program, then counts
#
# PREFIX holds the library (PREFIX/lib/pkgconfig/aml.pc: `scripts/aml-install.sh PREFIX`, or
# AML's own install). Each argument after OUTDIR is one program: its source, then the helper
# sources it links with, comma-separated. A program is named after its path relative to --root
# (slashes as underscores). Exit codes, as AML's test suite reads them: 0 pass, 77 skip (no
# GPU, said by the program), anything else a failure.
#
# Options:
#   --cuda DIR      CUDA's headers (DIR/include: cuda.h, cuda_runtime.h) and static runtime
#                   (DIR/lib64 or DIR/lib: libcudart_static.a); default $CUDA_HOME, else
#                   /usr/local/cuda. The runtime is linked in statically; the driver
#                   (libcuda.so.1) is the GPU host's.
#   -I DIR          an include directory for the programs (repeatable).
#   --cflags "ARGS" more compiler arguments (e.g. -fopenmp).
#   --libs "ARGS"   more link arguments (e.g. -lnuma for AML's own library).
#   --root DIR      the directory program names are relative to (default: none, base names;
#                   a program outside DIR keeps its base name).
#   --rpath PATH    where the programs find the library at run time, relative to OUTDIR
#                   (e.g. ../.gpu/aml/lib: the GPU bundle's libaml, for an OUTDIR beside
#                   .gpu); default: PREFIX/lib.
#   --copy-lib      copy PREFIX/lib's shared libraries into OUTDIR/lib and find them there
#                   (an RPATH, which the library's own dependencies are looked up in too).
#   --shared-cudart link CUDA's shared runtime (libcudart.so, copied along with --copy-lib)
#                   rather than the static one: for a library that uses the runtime itself
#                   (AML's own), so that the process holds one runtime.
#   --timeout S     seconds per program in run.sh (default 120).
#   --no-run        build only.
set -euo pipefail
cuda=${CUDA_HOME:-/usr/local/cuda}
incs=()
libs=""
extra=""
root=""
rpath=""
copy_lib=0
shared_cudart=0
limit=120
run=1
while [ $# -gt 0 ]; do
  case $1 in
    --cuda) cuda=$2; shift 2 ;;
    -I) incs+=("-I$2"); shift 2 ;;
    --libs) libs=$2; shift 2 ;;
    --cflags) extra=$2; shift 2 ;;
    --root) root=$(cd "$2" && pwd); shift 2 ;;
    --rpath) rpath=$2; shift 2 ;;
    --copy-lib) copy_lib=1; shift ;;
    --shared-cudart) shared_cudart=1; shift ;;
    --timeout) limit=$2; shift 2 ;;
    --no-run) run=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "aml-cuda-programs: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 3 ]; then
  echo "usage: scripts/aml-cuda-programs.sh [OPTIONS] PREFIX OUTDIR PROGRAM.c[,HELPER.c...]... (--help)" >&2
  exit 2
fi
prefix=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
shift 2
[ -f "$prefix/lib/pkgconfig/aml.pc" ] || { echo "aml-cuda-programs: no $prefix/lib/pkgconfig/aml.pc" >&2; exit 2; }
[ -f "$cuda/include/cuda_runtime.h" ] || { echo "aml-cuda-programs: no $cuda/include/cuda_runtime.h (--cuda DIR)" >&2; exit 2; }
if [ "$shared_cudart" = 1 ]; then
  rt=libcudart.so
else
  rt=libcudart_static.a
fi
cudart=$(ls "$cuda"/lib64/$rt "$cuda"/lib/$rt 2>/dev/null | head -1 || true)
[ -n "$cudart" ] || { echo "aml-cuda-programs: no $rt under $cuda/lib64 or $cuda/lib" >&2; exit 2; }
if [ "$shared_cudart" = 1 ]; then
  cudart_dir=$(dirname "$cudart")
  cudart="-L$cudart_dir -Wl,--no-as-needed -lcudart -Wl,--as-needed"
fi

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cflags=$(pkg-config --cflags aml)
amllibs=$(pkg-config --libs aml)
if [ "$copy_lib" = 1 ]; then
  mkdir -p "$out/lib"
  cp -a "$prefix"/lib/*.so* "$out/lib/"
  if [ "$shared_cudart" = 1 ]; then
    cp -L "$cudart_dir"/libcudart.so.[0-9]* "$out/lib/"
  fi
  rpath=lib
fi
if [ -n "$rpath" ]; then
  # Single quotes: the linker gets $ORIGIN literally; the loader resolves it. With --copy-lib
  # an RPATH (not RUNPATH): it also serves the copied library's own dependencies.
  rp='-Wl,-rpath,$ORIGIN/../'"$rpath"
  if [ "$copy_lib" = 1 ]; then rp="$rp -Wl,--disable-new-dtags"; fi
else
  rp="-Wl,-rpath,$prefix/lib"
fi
mkdir -p "$out/bin" "$out/build"
: >"$out/programs.txt"
built=0
failed=0
for spec in "$@"; do
  IFS=, read -r -a srcs <<<"$spec"
  main=${srcs[0]}
  rel=$(basename "$main")
  if [ -n "$root" ]; then
    r=$(realpath --relative-to="$root" "$main")
    case $r in ../*) ;; *) rel=$r ;; esac
  fi
  name=$(printf '%s' "${rel%.c}" | tr / _)
  # shellcheck disable=SC2086 # flag lists are word-split on purpose
  if cc -std=gnu11 -O1 -g -pthread $extra $cflags "${incs[@]}" -I"$cuda/include" \
    "${srcs[@]}" -o "$out/bin/$name" $amllibs $libs $cudart -ldl -lrt -lpthread -lm $rp \
    >"$out/build/$name.log" 2>&1; then
    built=$((built + 1))
    echo "$name" >>"$out/programs.txt"
    echo "built  $name"
  else
    failed=$((failed + 1))
    echo "FAILED $name (build; log: $out/build/$name.log)"
  fi
done
echo "aml-cuda-programs: $built built, $failed failed to build, in $out"

cat >"$out/run.sh" <<RUN
#!/usr/bin/env bash
# Runs each program of this folder (programs.txt) in a scratch directory, under its own time
# limit (AML_CUDA_TIMEOUT seconds, default $limit); one line per program (pass: exit 0, skip:
# exit 77, anything else a failure), its output in LOGDIR/NAME.log (default ./aml-cuda-logs),
# then the counts. Exit status 0 iff none failed.
RUN
cat >>"$out/run.sh" <<'RUN'
here=$(cd "$(dirname "$0")" && pwd)
log=${1:-aml-cuda-logs}
mkdir -p "$log"
log=$(cd "$log" && pwd)
limit=${AML_CUDA_TIMEOUT:-LIMIT}
pass=0 fail=0 skip=0
while read -r name; do
  [ -n "$name" ] || continue
  scratch=$(mktemp -d)
  start=$(date +%s%N)
  (cd "$scratch" && timeout -k 5 "$limit" "$here/bin/$name") >"$log/$name.log" 2>&1
  rc=$?
  ms=$((($(date +%s%N) - start) / 1000000))
  rm -rf "$scratch"
  case $rc in
    0) pass=$((pass + 1)); status=PASS ;;
    77) skip=$((skip + 1)); status=SKIP ;;
    124 | 137) fail=$((fail + 1)); status=TIME ;;
    *) fail=$((fail + 1)); status="FAIL rc=$rc" ;;
  esac
  printf '%-12s %-40s %6d ms\n' "$status" "$name" "$ms"
done <"$here/programs.txt"
echo "$(basename "$here"): $pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
RUN
sed -i "s/LIMIT/$limit/" "$out/run.sh"
chmod +x "$out/run.sh"
if [ "$run" = 1 ]; then
  bash "$out/run.sh" "$out/logs"
fi
