#!/usr/bin/env bash
# Compares the ABI a shared library exports with the baseline committed for it
# (libabigail's abidw/abidiff, Debian package abigail-tools).
#
#   check_abi.sh LIB BASELINE HEADERS_DIR SUPPRESSIONS             check; exit 1 on any difference
#   check_abi.sh LIB BASELINE HEADERS_DIR SUPPRESSIONS --update    record LIB's ABI as the baseline
#
# A check fails on an incompatible change (a removed or changed function, a struct
# whose layout changed other than by growing at its end, a changed enumerator value,
# another soname) and also on a compatible addition the baseline does not record yet,
# so the baseline always describes what ships. Only types declared under HEADERS_DIR
# count: the C++ inside the library is not ABI.
set -euo pipefail
lib=$1 baseline=$2 headers=$3 suppressions=$4 mode=${5:-check}
name=$(basename "$lib")

for tool in abidw abidiff; do
  if ! command -v "$tool" >/dev/null; then
    echo "check_abi: $tool not found: install Debian's abigail-tools (scripts/setup does)" >&2
    exit 2
  fi
done
sections=$(readelf -S "$lib")
if ! grep -q '\.debug_info' <<<"$sections"; then
  echo "check_abi: $lib has no debug information; build with -g (RelWithDebInfo or Debug)" >&2
  exit 2
fi

current=$(mktemp --suffix=.abi)
trap 'rm -f "$current"' EXIT
abidw --no-corpus-path --no-comp-dir-path --no-show-locs --exported-interfaces-only \
  --drop-private-types --headers-dir "$headers" --out-file "$current" "$lib"
# Translation units by file name only, so the baseline does not depend on where the tree is.
sed -i -E "s|(<abi-instr [^>]*path=')[^']*/([^'/]+')|\1\2|" "$current"

if [ "$mode" = "--update" ]; then
  cp "$current" "$baseline"
  echo "check_abi: recorded the ABI of $name in $baseline ($(grep -c '<elf-symbol ' "$baseline") symbols); commit it"
  exit 0
fi
if [ ! -f "$baseline" ]; then
  echo "check_abi: no baseline $baseline: record one with --update" >&2
  exit 1
fi

how_to_update="record it with \`cmake --build <build> --target abi-baseline\` (or this script with --update) and commit $baseline"
set +e
breaks=$(abidiff --suppressions "$suppressions" --no-added-syms "$baseline" "$current")
incompatible=$?
set -e
if [ $incompatible -ne 0 ]; then
  cat >&2 <<MSG
check_abi: $name breaks the ABI recorded in $baseline:

$breaks

Callers compiled against the recorded headers would misbehave with this library.
- Not intended: restore what changed. A shipped signature never changes (add name_v2
  instead); a struct grows only at its end (callers pass struct_size); enumerator values
  never change (add new ones at the end).
- Intended: bump BRAID_ABI_VERSION in capi/include/braid/braid.h (the soname becomes
  libbraid.so.<new version>, so old binaries refuse the new library instead of crashing),
  rebuild, then $how_to_update.
MSG
  exit 1
fi
set +e
additions=$(abidiff --harmless "$baseline" "$current")
set -e
if [ -n "$additions" ]; then
  cat >&2 <<MSG
check_abi: $name adds to the ABI recorded in $baseline (compatible, not recorded yet):

$additions

So that later changes to these additions are checked too, $how_to_update.
MSG
  exit 1
fi
echo "check_abi: $name matches $baseline ($(grep -c '<elf-symbol ' "$baseline") symbols)"
