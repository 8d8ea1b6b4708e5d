/* Uses an installed braid as any C project would: includes <braid/braid.h>, links
 * libbraid, checks the library's ABI against the header's, and plans a run file.
 * Usage: consumer RUN.yaml    Prints one line; exit 0 on success. */
#include <stdio.h>
#include <string.h>

#include "braid/braid.h"

#ifndef PACKAGE_ABI_VERSION
#define PACKAGE_ABI_VERSION BRAID_ABI_VERSION /* built through pkg-config */
#endif

#define CHECK(call)                                                                                  \
  do {                                                                                               \
    braid_status s_ = (call);                                                                        \
    if (s_ != BRAID_OK) {                                                                            \
      fprintf(stderr, "consumer: %s: %s: %s\n", #call, braid_status_string(s_), braid_last_error()); \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: consumer RUN.yaml\n");
    return 2;
  }
  if (braid_abi_version() != BRAID_ABI_VERSION || PACKAGE_ABI_VERSION != BRAID_ABI_VERSION) {
    fprintf(stderr, "consumer: library ABI %u, header ABI %d, package ABI %d\n", braid_abi_version(), BRAID_ABI_VERSION,
            PACKAGE_ABI_VERSION);
    return 1;
  }
  char header_version[32];
  snprintf(header_version, sizeof header_version, "%d.%d.%d", BRAID_VERSION_MAJOR, BRAID_VERSION_MINOR,
           BRAID_VERSION_PATCH);
  if (strcmp(braid_version_string(), header_version) != 0) {
    fprintf(stderr, "consumer: library %s, header %s\n", braid_version_string(), header_version);
    return 1;
  }
  braid_config* config = NULL;
  braid_plan* plan = NULL;
  CHECK(braid_config_load_file(argv[1], &config));
  CHECK(braid_plan_create(config, NULL, &plan));
  braid_estimate estimate = BRAID_ESTIMATE_INIT;
  CHECK(braid_plan_estimate(plan, &estimate));
  printf("consumer: braid %s (ABI %u) planned %s: %d devices, %.6f s per step\n", braid_version_string(),
         braid_abi_version(), argv[1], estimate.devices, estimate.iteration_time_s);
  braid_plan_destroy(plan);
  braid_config_destroy(config);
  return estimate.iteration_time_s > 0 ? 0 : 1;
}
