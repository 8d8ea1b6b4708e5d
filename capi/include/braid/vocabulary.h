/*
 * braid/vocabulary.h: the names of the C ABI's enums and of the schedules, as the
 * library spells them. Included by braid.h; the conventions of braid.h hold here too.
 *
 * Bindings ask the library for these names instead of repeating them: value v of a
 * vocabulary is the enum value v (BRAID_VOCABULARY_STRATEGY: v is a braid_strategy),
 * or the v-th entry of a list (BRAID_VOCABULARY_SCHEDULE, _BUBBLE_SCHEDULE).
 *
 *   size_t n = 0;
 *   braid_vocabulary_size(BRAID_VOCABULARY_OPCODE, &n);
 *   for (size_t v = 0; v < n; ++v) {
 *     const char* name = NULL;
 *     braid_vocabulary_name(BRAID_VOCABULARY_OPCODE, v, &name); // "LoadMicrobatch", ...
 *   }
 */
/* braid.h first, before this header's guard: it includes every header, in an order where
 * each finds what it needs, whichever header a program includes first. */
#include "braid/braid.h"

#ifndef BRAID_VOCABULARY_H
#define BRAID_VOCABULARY_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum braid_vocabulary {
  BRAID_VOCABULARY_STRATEGY = 0,        /* name of each braid_strategy value ("auto", "megatron", ...) */
  BRAID_VOCABULARY_SCHEDULE = 1,        /* every schedule name braid_program_create knows */
  BRAID_VOCABULARY_OPCODE = 2,          /* name of each braid_opcode value ("LoadMicrobatch", ...) */
  BRAID_VOCABULARY_BUBBLE_CAUSE = 3,    /* name of each braid_bubble_cause value ("dp_start", ...) */
  BRAID_VOCABULARY_REORDERING = 4,      /* name of each braid_reordering value ("none", ...) */
  BRAID_VOCABULARY_AXIS = 5,            /* name of each braid_axis value ("tp", "dp", "pp") */
  BRAID_VOCABULARY_BUBBLE_SCHEDULE = 6, /* the bubble scheduler's programs, the default first */
  BRAID_VOCABULARY_PRECISION = 7,       /* name of each braid_precision value ("bf16", "fp16", "fp32") */
  BRAID_VOCABULARY_RECOMPUTE = 8,       /* name of each braid_recompute value ("none", "selective", "full") */
  BRAID_VOCABULARY_ATTENTION = 9        /* name of each braid_attention value ("flash", "standard") */
} braid_vocabulary;

/* How many names `vocabulary` has. BRAID_ERR_INVALID_ARGUMENT for a value that is not
 * a braid_vocabulary. */
BRAID_API braid_status braid_vocabulary_size(braid_vocabulary vocabulary, size_t* size);
typedef braid_status (*braid_vocabulary_size_fn)(braid_vocabulary, size_t*);
/* The name of `value` (< braid_vocabulary_size) in `vocabulary`; static storage.
 * BRAID_ERR_INVALID_ARGUMENT for an unknown vocabulary or a value out of range (the
 * message names the value and the size). */
BRAID_API braid_status braid_vocabulary_name(braid_vocabulary vocabulary, size_t value, const char** name);
typedef braid_status (*braid_vocabulary_name_fn)(braid_vocabulary, size_t, const char**);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_VOCABULARY_H */
