/* A toy C ABI for testing tests/abi/check_abi.sh: each TOY_* macro makes one kind of
 * change to the baseline build (none defined). */
#ifndef TOY_ABI_H
#define TOY_ABI_H
#include <stddef.h>

#define TOY_API __attribute__((visibility("default")))

typedef enum braid_toy_kind {
  TOY_KIND_A = 0,
#ifdef TOY_CHANGED_ENUM_VALUE
  TOY_KIND_B = 5,
#else
  TOY_KIND_B = 1,
#endif
#ifdef TOY_ADDED_ENUMERATOR
  TOY_KIND_C = 2,
#endif
} braid_toy_kind;

typedef struct braid_toy_info {
  size_t struct_size;
  int count;
#ifdef TOY_MIDDLE_FIELD
  double inserted;
#endif
  double value;
#ifdef TOY_END_FIELD
  double appended;
#endif
} braid_toy_info;

TOY_API int braid_toy_info_get(braid_toy_info* info);
TOY_API int braid_toy_kind_of(braid_toy_kind kind);
#ifndef TOY_REMOVED_FUNCTION
TOY_API int braid_toy_old(void);
#endif
#ifdef TOY_ADDED_FUNCTION
TOY_API int braid_toy_new(void);
#endif
#ifdef TOY_CHANGED_SIGNATURE
TOY_API int braid_toy_scale(double factor, int times);
#else
TOY_API int braid_toy_scale(double factor);
#endif

#endif
