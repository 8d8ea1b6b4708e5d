/* What the C ABI tests of this directory share: the failure count and CHECK, resolving
 * entry points of a dlopen'ed libbraid.so into a file's `api` struct, CHECK_ERROR on
 * braid_last_error, and main()'s frame (usage, dlopen, the closing summary).
 * C99 and header-only: each test includes it once, after any feature-test macros, and
 * defines `static struct {...} api` (with a last_error member where it uses CHECK_ERROR)
 * and, in main(), `void* lib = capi_open(...)` before the RESOLVE lines. */
#ifndef BRAID_TESTS_CAPI_TEST_H
#define BRAID_TESTS_CAPI_TEST_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid/braid.h"

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* The symbol `name` of `lib`; a missing one ends the test. */
static inline void* capi_resolve(void* lib, const char* name) {
  void* sym = dlsym(lib, name);
  if (!sym) {
    fprintf(stderr, "missing symbol %s\n", name);
    exit(1);
  }
  return sym;
}

/* api.field = the symbol `name` of `lib` (RESOLVE: braid_<field>).
 * dlsym returns void*; POSIX guarantees the round trip to a function pointer. */
#define RESOLVE_AS(field, name) memcpy(&api.field, &(void*){capi_resolve(lib, name)}, sizeof api.field)
#define RESOLVE(field) RESOLVE_AS(field, "braid_" #field)

static inline int contains(const char* text, const char* part) { return text && strstr(text, part) != NULL; }

/* CHECK(contains(last_error, part)), printing the message when it lacks the part. */
#define CHECK_ERROR(part)                                                                                  \
  do {                                                                                                     \
    if (!contains(api.last_error(), part)) {                                                               \
      fprintf(stderr, "%s:%d: last error lacks \"%s\": %s\n", __FILE__, __LINE__, part, api.last_error()); \
      ++failures;                                                                                          \
    }                                                                                                      \
  } while (0)

/* The library named by argv[1], loaded; `nargs` arguments are expected, described by
 * `usage`. A wrong count exits with 2, a library that does not load with 1. */
static inline void* capi_open(int argc, char** argv, int nargs, const char* usage) {
  if (argc != nargs + 1) {
    fprintf(stderr, "usage: %s %s\n", argv[0], usage);
    exit(2);
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    exit(1);
  }
  return lib;
}

/* Closes `lib` and reports: main()'s exit status, 1 after any failed check, else 0 with
 * "<what>: all checks passed<detail>". */
static inline int capi_finish(void* lib, const char* what, const char* detail) {
  dlclose(lib);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("%s: all checks passed%s\n", what, detail);
  return 0;
}

#endif /* BRAID_TESTS_CAPI_TEST_H */
