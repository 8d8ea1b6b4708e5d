#include "toy_abi.h"

int braid_toy_info_get(braid_toy_info* info) { return info->count + (int)info->value; }
int braid_toy_kind_of(braid_toy_kind kind) { return (int)kind; }
#ifndef TOY_REMOVED_FUNCTION
int braid_toy_old(void) { return 1; }
#endif
#ifdef TOY_ADDED_FUNCTION
int braid_toy_new(void) { return 2; }
#endif
#ifdef TOY_CHANGED_SIGNATURE
int braid_toy_scale(double factor, int times) { return (int)(factor * times); }
#else
int braid_toy_scale(double factor) { return (int)factor; }
#endif
