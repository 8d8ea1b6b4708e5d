#!/usr/bin/env bash
# Proves tests/abi/check_abi.sh catches each kind of ABI change, on a toy library built in
# variants (tests/abi/toy_abi.h): usage  test_check_abi.sh CHECKER HEADERS_DIR SUPPRESSIONS VARIANT=LIB...
set -uo pipefail
checker=$1 headers=$2 suppressions=$3
shift 3
declare -A lib
for arg in "$@"; do lib[${arg%%=*}]=${arg#*=}; done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
baseline=$work/toy.abi
failures=0

"$checker" "${lib[base]}" "$baseline" "$headers" "$suppressions" --update >/dev/null || exit $?

# expect VARIANT pass|breaks|adds
expect() {
  local variant=$1 want=$2 out rc got
  out=$("$checker" "${lib[$variant]}" "$baseline" "$headers" "$suppressions" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then got=pass
  elif grep -q "breaks the ABI" <<<"$out" && grep -q "bump BRAID_ABI_VERSION" <<<"$out"; then got=breaks
  elif grep -q "adds to the ABI" <<<"$out"; then got=adds
  else got="rc $rc"
  fi
  if [ "$got" = "$want" ]; then
    echo "ok    $variant: $want"
  else
    echo "FAIL  $variant: expected $want, got $got"
    echo "$out" | sed 's/^/      /'
    failures=$((failures + 1))
  fi
}

expect base pass
expect removed_function breaks
expect changed_signature breaks
expect changed_enum_value breaks
expect middle_field breaks
expect soname breaks
expect end_field adds
expect added_function adds
expect added_enumerator adds
# Once recorded, an addition passes.
"$checker" "${lib[added_function]}" "$baseline" "$headers" "$suppressions" --update >/dev/null || exit 1
expect added_function pass
expect base breaks
exit $((failures > 0))
