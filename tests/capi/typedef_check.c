/* Every entry point assigned to its braid_<name>_fn typedef, in C99 with -Werror: a
 * typedef whose parameters or return type differ from its function's prototype is an
 * incompatible pointer type, and this file fails to compile. dlsym users (test_capi.c,
 * test_hardening.c, bindings) cast to these typedefs, where no compiler could notice.
 * Linked against libbraid, so every name must also exist. Run, it prints the ABI version.
 * A new entry point adds its line here. */
#include <stdio.h>

#include "braid/braid.h"

#define TYPED(name)          \
  do {                       \
    name##_fn typed_ = name; \
    (void)typed_;            \
  } while (0)

int main(void) {
  /* braid.h */
  TYPED(braid_abi_version);
  TYPED(braid_version_string);
  TYPED(braid_status_string);
  TYPED(braid_last_error);
  TYPED(braid_config_load_file);
  TYPED(braid_config_load_string);
  TYPED(braid_config_destroy);
  TYPED(braid_config_devices);
  TYPED(braid_config_run_settings);
  TYPED(braid_config_set_run_settings);
  TYPED(braid_plan_create);
  TYPED(braid_plan_destroy);
  TYPED(braid_plan_strategy);
  TYPED(braid_plan_module_count);
  TYPED(braid_plan_module);
  TYPED(braid_plan_estimate);
  TYPED(braid_plan_to_json);
  TYPED(braid_plan_to_yaml);
  TYPED(braid_plan_alternative_count);
  TYPED(braid_plan_alternative);
  /* braid/pipeline.h */
  TYPED(braid_program_create);
  TYPED(braid_program_destroy);
  TYPED(braid_program_schedule);
  TYPED(braid_program_stage_count);
  TYPED(braid_program_stage);
  TYPED(braid_program_instruction);
  TYPED(braid_simulate);
  TYPED(braid_simulation_destroy);
  TYPED(braid_simulation_result_get);
  TYPED(braid_simulation_stage);
  TYPED(braid_simulation_write_trace);
  TYPED(braid_simulation_gantt);
  TYPED(braid_program_microbatches);
  TYPED(braid_program_rank);
  TYPED(braid_program_rank_instruction);
  TYPED(braid_program_stage_part);
  /* braid/data.h */
  TYPED(braid_reorder_create);
  TYPED(braid_reorder_destroy);
  TYPED(braid_reorder_info_get);
  TYPED(braid_reorder_ranks);
  TYPED(braid_reorder_cells);
  TYPED(braid_reorder_microbatches);
  TYPED(braid_reorder_order);
  /* braid/bubble.h */
  TYPED(braid_bubble_scheduler_create);
  TYPED(braid_bubble_scheduler_destroy);
  TYPED(braid_bubble_scheduler_run);
  TYPED(braid_bubble_scheduler_report);
  TYPED(braid_bubble_scheduler_program);
  /* braid/groups.h */
  TYPED(braid_groups_create);
  TYPED(braid_groups_destroy);
  TYPED(braid_groups_world_size);
  TYPED(braid_groups_count);
  TYPED(braid_groups_group);
  TYPED(braid_groups_rank);
  TYPED(braid_groups_holding);
  TYPED(braid_groups_link_count);
  TYPED(braid_groups_link);
  TYPED(braid_groups_link_pair);
  TYPED(braid_groups_batch_sync_count);
  TYPED(braid_groups_batch_sync);
  TYPED(braid_groups_batch_sync_member);
  /* braid/tensor.h */
  TYPED(braid_contrastive_forward);
  TYPED(braid_contrastive_backward);
  /* braid/vocabulary.h */
  TYPED(braid_vocabulary_size);
  TYPED(braid_vocabulary_name);
  printf("braid_<name>_fn typedefs match their functions (ABI %u)\n", (unsigned)braid_abi_version());
  return 0;
}
