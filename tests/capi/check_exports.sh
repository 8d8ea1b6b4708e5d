#!/usr/bin/env bash
# libbraid.so must export the braid_ C ABI and nothing else (no C++ or library symbols).
set -euo pipefail
lib=$1
exported=$(nm -D --defined-only "$lib" | awk '{print $NF}')
leaked=$(echo "$exported" | grep -v -E '^(braid_|_init$|_fini$|_edata$|_end$|__bss_start$)' || true)
if [ -n "$leaked" ]; then
  echo "libbraid.so exports symbols outside the braid_ ABI:" >&2
  echo "$leaked" | head -20 >&2
  exit 1
fi
# Every entry point of braid/data.h, braid/bubble.h, braid/tensor.h and braid/vocabulary.h.
for sym in braid_reorder_create braid_reorder_destroy braid_reorder_info_get braid_reorder_ranks \
  braid_reorder_cells braid_reorder_microbatches braid_reorder_order \
  braid_bubble_scheduler_create braid_bubble_scheduler_destroy braid_bubble_scheduler_run \
  braid_bubble_scheduler_report braid_bubble_scheduler_program \
  braid_contrastive_forward braid_contrastive_backward \
  braid_vocabulary_size braid_vocabulary_name; do
  if ! grep -qx "$sym" <<<"$exported"; then
    echo "libbraid.so does not export $sym" >&2
    exit 1
  fi
done
count=$(echo "$exported" | grep -c '^braid_')
echo "libbraid.so exports $count braid_ symbols and nothing else"
[ "$count" -ge 42 ]
