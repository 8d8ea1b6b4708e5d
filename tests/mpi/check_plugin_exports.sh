#!/usr/bin/env bash
# A plugin must export its interface struct(s) and nothing else (plugins/plugin.map).
set -euo pipefail
lib=$1
shift
exported=$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -vxE '_init|_fini|_edata|_end|__bss_start' | sort)
expected=$(printf '%s\n' "$@" | sort)
if [ "$exported" != "$expected" ]; then
  echo "$lib exports:" >&2
  echo "$exported" | head -20 >&2
  echo "expected exactly: $*" >&2
  exit 1
fi
echo "$lib exports $* and nothing else"
