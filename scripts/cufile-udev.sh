#!/usr/bin/env bash
# For a GPU host without udevd (a VM with no /run/udev, such as the H200 host): libcufile
# reads a file's filesystem attributes (ID_FS_USAGE, ID_FS_TYPE) from the udev database and,
# without them, registers no file, compatibility mode included ("udev property not found:
# ID_FS_USAGE vda" in its log). This writes the records udevd would have written for the
# block devices holding / and /tmp, runs CMD with them, then removes
# what it wrote; a record already there is left alone. Needs root; changes nothing on the GPU.
#
#   scripts/cufile-udev.sh CMD [ARG...]
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: cufile-udev.sh CMD [ARG...]" >&2; exit 2; }
made=()
cleanup() { [ ${#made[@]} -eq 0 ] || rm -f "${made[@]}"; }
trap cleanup EXIT
mkdir -p /run/udev/data || { echo "cannot write /run/udev/data" >&2; exit 1; }
# "MAJ:MIN FSTYPE" of the filesystems at / and /tmp, from mountinfo.
while read -r mm fs; do
  f="/run/udev/data/b$mm"
  [ -e "$f" ] && continue
  type=disk
  [ -e "/sys/dev/block/$mm/partition" ] && type=partition
  printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\nE:DEVTYPE=%s\n' "$fs" "$type" >"$f" && made+=("$f")
  echo "cufile-udev.sh: wrote $f (ID_FS_TYPE=$fs)" >&2
done < <(
  awk '$5 == "/" || $5 == "/tmp" { for (i = 7; i <= NF; i++) if ($i == "-") { print $3, $(i + 1); break } }' /proc/self/mountinfo | sort -u
)
"$@"
