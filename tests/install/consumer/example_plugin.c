/* A device plugin built against an installed braid's plugin interface: a backend with no
 * devices. It shows the frozen header is installed and self-contained. */
#include <stdio.h>

#include "braid_device_v1.h"

static int init(char* error, size_t error_size) {
  (void)error;
  (void)error_size;
  return 0;
}
static int device_count(int32_t* count, char* error, size_t error_size) {
  (void)error;
  (void)error_size;
  *count = 0;
  return 0;
}
static int device_properties(int32_t index, braid_device_properties_v1* properties, char* error, size_t error_size) {
  (void)properties;
  snprintf(error, error_size, "example plugin: no device %d", (int)index);
  return 1;
}
static int self_test(int32_t index, char* error, size_t error_size) {
  snprintf(error, error_size, "example plugin: no device %d", (int)index);
  return 1;
}
static void finalize(void) {}

__attribute__((visibility("default"))) const braid_device_plugin_v1 braidDevicePlugin_v1 = {
    1, "example", init, device_count, device_properties, self_test, finalize};
