/* Communication plugins the loader must refuse, built twice: FAKE_VERSION 2 (a future
 * interface this braid does not read) and 1 with no functions (an incomplete plugin).
 * Compiled as C99 with -Wpedantic: braid_comm_v1.h must be valid C. */
#include "braid_comm_v1.h"

__attribute__((visibility("default"))) const braid_comm_plugin_v1 braidCommPlugin_v1 = {
    .interface_version = FAKE_VERSION,
    .name = "fake",
};
