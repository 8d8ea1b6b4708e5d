/* braid/tensor.h from C: dlopen libbraid.so and check the tiled contrastive loss against a
 * naive N x N formulation written here in double:
 *  - one process (local and gathered rows are the same memory, n == N) and one rank of
 *    several (n < N at the first, a middle and the last offset, local rows in their own
 *    memory), with tiles that do not divide N (N = 37, tile 8), one column per tile, one
 *    tile for everything, and row-strided views: the loss, both rows of stats and every
 *    gradient within 1e-5 relative (max |a - b| / max |b|);
 *  - d loss / d logit_scale agrees with a central finite difference of the loss, also at
 *    scale 0 (every logit 0) and at a negative scale;
 *  - gradients left NULL are not needed for the others, and grad_loss scales them;
 *  - braid_tensor has DLPack's DLTensor layout;
 *  - misuse (NULL pointers, wrong dtype, 3 dimensions, CPU and CUDA memory mixed, mismatched E, rows
 *    outside the gathered batch, bad options or shapes) returns the documented status and
 *    a message naming the argument.
 * Compiled as C99 with -Wall -Wextra -Wpedantic -Werror.
 * usage: test_tensor LIBBRAID_SO */
#include <math.h>
#include <stddef.h>

#include "capi_test.h"

static struct {
  const char* (*last_error)(void);
  braid_contrastive_forward_fn forward;
  braid_contrastive_backward_fn backward;
} api;

/* ---- 2-D float32 CPU views ------------------------------------------------------ */

/* A view and the arrays it points at; used through pointers only (it points into itself). */
typedef struct view2d {
  braid_tensor t;
  int64_t shape[2];
  int64_t strides[2];
} view2d;

/* rows x cols at data, row r at data + r * stride; stride 0: contiguous (strides NULL). */
static braid_tensor* make_view(view2d* v, float* data, int64_t rows, int64_t cols, int64_t stride) {
  memset(v, 0, sizeof *v);
  v->shape[0] = rows;
  v->shape[1] = cols;
  v->strides[0] = stride;
  v->strides[1] = 1;
  v->t.data = data;
  v->t.device.type = BRAID_DEVICE_CPU;
  v->t.device.index = 0;
  v->t.ndim = 2;
  v->t.dtype.code = BRAID_DTYPE_FLOAT;
  v->t.dtype.bits = 32;
  v->t.dtype.lanes = 1;
  v->t.shape = v->shape;
  v->t.strides = stride ? v->strides : NULL;
  v->t.byte_offset = 0;
  return &v->t;
}

/* Uniform in [-1, 1) from a 64-bit LCG, rows L2-normalised; row r at m + r * stride. */
static void fill_normalized(float* m, int64_t rows, int64_t cols, int64_t stride, unsigned long long* state) {
  for (int64_t r = 0; r < rows; ++r) {
    double norm = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
      m[r * stride + c] = (float)((double)(*state >> 40) / 8388608.0 - 1.0);
      norm += (double)m[r * stride + c] * m[r * stride + c];
    }
    for (int64_t c = 0; c < cols; ++c) m[r * stride + c] = (float)(m[r * stride + c] / sqrt(norm));
  }
}

/* max |a - b| / max |b| over rows x cols; a has row stride sa, b is contiguous. */
static double relative(const float* a, int64_t sa, const double* b, int64_t rows, int64_t cols) {
  double diff = 0.0, scale = 0.0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const double d = fabs((double)a[r * sa + c] - b[r * cols + c]);
      if (d > diff || d != d) diff = d != d ? INFINITY : d;
      if (fabs(b[r * cols + c]) > scale) scale = fabs(b[r * cols + c]);
    }
  return diff / (scale > 1e-30 ? scale : 1e-30);
}

/* ---- the naive reference ----------------------------------------------------------- */

typedef struct reference {
  double loss, d_scale;
  double *lse, *d_local_image, *d_local_text, *d_all_image, *d_all_text; /* lse: (2, n) */
} reference;

/* open_clip's local loss of rows [offset, offset + n) of the gathered I, T (N x E,
 * contiguous), from the whole N x N logit matrix L = s I T^T: image -> text rows are rows
 * of L, text -> image rows are columns of L. */
static reference naive(const float* image, const float* text, int64_t total, int64_t e, int64_t offset, int64_t n,
                       double s, double grad_loss) {
  reference r;
  r.loss = 0.0;
  r.d_scale = 0.0;
  r.lse = calloc((size_t)(2 * n), sizeof(double));
  r.d_local_image = calloc((size_t)(n * e), sizeof(double));
  r.d_local_text = calloc((size_t)(n * e), sizeof(double));
  r.d_all_image = calloc((size_t)(total * e), sizeof(double));
  r.d_all_text = calloc((size_t)(total * e), sizeof(double));
  double* l = malloc((size_t)(total * total) * sizeof(double)); /* the dot products; logits s * l */
  double* d = malloc((size_t)total * sizeof(double));
  for (int64_t i = 0; i < total; ++i)
    for (int64_t j = 0; j < total; ++j) {
      double dot = 0.0;
      for (int64_t c = 0; c < e; ++c) dot += (double)image[i * e + c] * text[j * e + c];
      l[i * total + j] = dot;
    }
  const double weight = grad_loss / (2.0 * (double)n);
  for (int direction = 0; direction < 2; ++direction)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = offset + i;
      /* direction 0: L[row, j]; direction 1: L[j, row] */
      double top = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < total; ++j) {
        const double x = s * (direction == 0 ? l[row * total + j] : l[j * total + row]);
        if (x > top) top = x;
      }
      for (int64_t j = 0; j < total; ++j)
        sum += exp(s * (direction == 0 ? l[row * total + j] : l[j * total + row]) - top);
      const double lse = top + log(sum);
      r.lse[direction * n + i] = lse;
      r.loss += lse - s * l[row * total + row];
      for (int64_t j = 0; j < total; ++j) {
        const double dot = direction == 0 ? l[row * total + j] : l[j * total + row];
        d[j] = (exp(s * dot - lse) - (j == row ? 1.0 : 0.0)) * weight;
        r.d_scale += d[j] * dot; /* d logits / d s = dot */
      }
      /* direction 0: logits s I_local T_all^T; direction 1: s T_local I_all^T */
      const float* local = direction == 0 ? image : text;
      const float* other = direction == 0 ? text : image;
      double* d_local = direction == 0 ? r.d_local_image : r.d_local_text;
      double* d_other = direction == 0 ? r.d_all_text : r.d_all_image;
      for (int64_t j = 0; j < total; ++j)
        for (int64_t c = 0; c < e; ++c) {
          d_local[i * e + c] += s * d[j] * other[j * e + c];
          d_other[j * e + c] += s * d[j] * local[row * e + c];
        }
    }
  r.loss /= 2.0 * (double)n;
  free(l);
  free(d);
  return r;
}

static void free_reference(reference* r) {
  free(r->lse);
  free(r->d_local_image);
  free(r->d_local_text);
  free(r->d_all_image);
  free(r->d_all_text);
}

/* ---- the cases ------------------------------------------------------------------------ */

enum { kE = 16 };
static const double kTolerance = 1e-5;
static const float kScale = (float)(1.0 / 0.07); /* CLIP's initial logit scale */

typedef struct run_result {
  float loss, d_scale;
  int ok;
} run_result;

/* Embeddings I, T (N x E) in one buffer each with row stride `stride` (>= E; 0: E, contiguous
 * views). shared: local views are the gathered ones (n == N); else the local rows are copied
 * into their own buffers. Runs forward and backward and compares everything with naive(). */
static void check_case(int64_t total, int64_t n, int64_t offset, int32_t tile, int shared, int64_t stride,
                       float grad_loss, float s) {
  const int64_t ld = stride ? stride : kE;
  char what[160];
  snprintf(what, sizeof what, "N=%lld n=%lld offset=%lld tile=%d %s stride=%lld s=%g", (long long)total, (long long)n,
           (long long)offset, tile, shared ? "shared" : "copied", (long long)ld, s);
  unsigned long long state = 20241017ULL + (unsigned long long)(total * 131 + n * 7 + offset);
  float* image = calloc((size_t)(total * ld), sizeof(float));
  float* text = calloc((size_t)(total * ld), sizeof(float));
  fill_normalized(image, total, kE, ld, &state);
  fill_normalized(text, total, kE, ld, &state);
  /* The reference reads contiguous copies. */
  float* image_c = malloc((size_t)(total * kE) * sizeof(float));
  float* text_c = malloc((size_t)(total * kE) * sizeof(float));
  for (int64_t r = 0; r < total; ++r)
    for (int64_t c = 0; c < kE; ++c) {
      image_c[r * kE + c] = image[r * ld + c];
      text_c[r * kE + c] = text[r * ld + c];
    }
  float* local_image = image + offset * ld;
  float* local_text = text + offset * ld;
  if (!shared) {
    local_image = malloc((size_t)(n * ld) * sizeof(float));
    local_text = malloc((size_t)(n * ld) * sizeof(float));
    memcpy(local_image, image + offset * ld, (size_t)(n * ld) * sizeof(float));
    memcpy(local_text, text + offset * ld, (size_t)(n * ld) * sizeof(float));
  }
  view2d vli, vlt, vai, vat, vstats, vgli, vglt, vgai, vgat;
  braid_tensor* li = make_view(&vli, local_image, n, kE, stride);
  braid_tensor* lt = make_view(&vlt, local_text, n, kE, stride);
  braid_tensor* ai = make_view(&vai, image, total, kE, stride);
  braid_tensor* at = make_view(&vat, text, total, kE, stride);
  float* stats = malloc((size_t)(2 * n + 1) * sizeof(float));
  braid_tensor* st = make_view(&vstats, stats, 2, n, 0);
  /* Gradients with the same row stride, pre-filled with NaN: every element must be written. */
  float* gli = malloc((size_t)(n * ld + 1) * sizeof(float));
  float* glt = malloc((size_t)(n * ld + 1) * sizeof(float));
  float* gai = malloc((size_t)(total * ld) * sizeof(float));
  float* gat = malloc((size_t)(total * ld) * sizeof(float));
  for (int64_t k = 0; k < n * ld; ++k) gli[k] = glt[k] = NAN;
  for (int64_t k = 0; k < total * ld; ++k) gai[k] = gat[k] = NAN;

  braid_contrastive_options options = BRAID_CONTRASTIVE_OPTIONS_INIT;
  options.row_offset = offset;
  options.tile = tile;
  float loss = 0.0f, d_scale = 0.0f;
  braid_status status = api.forward(li, lt, ai, at, s, &options, st, &loss, NULL);
  if (status == BRAID_OK)
    status = api.backward(li, lt, ai, at, s, &options, st, grad_loss, make_view(&vgli, gli, n, kE, stride),
                          make_view(&vglt, glt, n, kE, stride), make_view(&vgai, gai, total, kE, stride),
                          make_view(&vgat, gat, total, kE, stride), &d_scale, NULL);
  CHECK(status == BRAID_OK);
  if (status != BRAID_OK) fprintf(stderr, "%s: %s\n", what, api.last_error());

  reference ref = naive(image_c, text_c, total, kE, offset, n, s, grad_loss);
  const double e_loss = fabs(loss - ref.loss) / fabs(ref.loss);
  const double e_stats = relative(stats, n, ref.lse, 2, n);
  const double e_scale = fabs(d_scale - ref.d_scale) / fabs(ref.d_scale);
  if (s == 0.0f) { /* the logits do not depend on the embeddings */
    int zero = 1;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < kE; ++c) zero = zero && gli[r * ld + c] == 0.0f && glt[r * ld + c] == 0.0f;
    CHECK(zero && fabs(ref.loss - log((double)total)) < 1e-12);
  }
  double e_grads;
  if (shared) {
    /* Only local + gathered is defined for one process: compare the sums. */
    double* want_image = calloc((size_t)(n * kE), sizeof(double));
    double* want_text = calloc((size_t)(n * kE), sizeof(double));
    float* got_image = malloc((size_t)(n * kE) * sizeof(float));
    float* got_text = malloc((size_t)(n * kE) * sizeof(float));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < kE; ++c) {
        want_image[r * kE + c] = ref.d_local_image[r * kE + c] + ref.d_all_image[r * kE + c];
        want_text[r * kE + c] = ref.d_local_text[r * kE + c] + ref.d_all_text[r * kE + c];
        got_image[r * kE + c] = gli[r * ld + c] + gai[r * ld + c];
        got_text[r * kE + c] = glt[r * ld + c] + gat[r * ld + c];
      }
    const double a = relative(got_image, kE, want_image, n, kE), b = relative(got_text, kE, want_text, n, kE);
    e_grads = a > b ? a : b;
    free(want_image);
    free(want_text);
    free(got_image);
    free(got_text);
  } else {
    const double errors[4] = {relative(gli, ld, ref.d_local_image, n, kE), relative(glt, ld, ref.d_local_text, n, kE),
                              relative(gai, ld, ref.d_all_image, total, kE),
                              relative(gat, ld, ref.d_all_text, total, kE)};
    e_grads = 0.0;
    for (int k = 0; k < 4; ++k) e_grads = errors[k] > e_grads || errors[k] != errors[k] ? errors[k] : e_grads;
  }
  const int ok = e_loss <= kTolerance && e_stats <= kTolerance && e_scale <= kTolerance && e_grads <= kTolerance;
  printf("  %-62s loss %.1e  stats %.1e  grads %.1e  d/ds %.1e  %s\n", what, e_loss, e_stats, e_grads, e_scale,
         ok ? "ok" : "MISMATCH");
  CHECK(ok);

  /* d loss / d s against a central difference of the loss (float loss: h large enough). */
  if (grad_loss == 1.0f) {
    const float h = 0.05f;
    float up = 0.0f, down = 0.0f;
    CHECK(api.forward(li, lt, ai, at, s + h, &options, st, &up, NULL) == BRAID_OK);
    CHECK(api.forward(li, lt, ai, at, s - h, &options, st, &down, NULL) == BRAID_OK);
    const double fd = ((double)up - down) / (2.0 * h);
    CHECK(fabs(fd - d_scale) <= 2e-3 * fabs(d_scale) + 1e-5);
    if (!(fabs(fd - d_scale) <= 2e-3 * fabs(d_scale) + 1e-5))
      fprintf(stderr, "%s: d/ds %.8g, finite difference %.8g\n", what, d_scale, fd);
  }

  /* No gradient tensors: d/ds alone is the same (stats of s again, after the differences). Only the gathered ones: for
   * one process they then hold the whole gradient (the sum above). */
  float d_scale_only = 0.0f;
  CHECK(api.forward(li, lt, ai, at, s, &options, st, &loss, NULL) == BRAID_OK);
  CHECK(api.backward(li, lt, ai, at, s, &options, st, grad_loss, NULL, NULL, NULL, NULL, &d_scale_only, NULL) ==
        BRAID_OK);
  CHECK(d_scale_only == d_scale);
  if (shared) {
    float* whole = malloc((size_t)(total * ld) * sizeof(float));
    CHECK(api.backward(li, lt, ai, at, s, &options, st, grad_loss, NULL, NULL,
                       make_view(&vgai, whole, total, kE, stride), NULL, NULL, NULL) == BRAID_OK);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < kE; ++c) CHECK(fabsf(whole[r * ld + c] - (gli[r * ld + c] + gai[r * ld + c])) <= 1e-7f);
    free(whole);
  }

  free_reference(&ref);
  if (!shared) {
    free(local_image);
    free(local_text);
  }
  free(image);
  free(text);
  free(image_c);
  free(text_c);
  free(stats);
  free(gli);
  free(glt);
  free(gai);
  free(gat);
}

static void test_against_naive(void) {
  printf("tiled contrastive loss against the naive N x N formulation (tolerance %.0e):\n", kTolerance);
  const int32_t tiles[] = {8, 1, 0, 37, 100};
  for (size_t k = 0; k < sizeof tiles / sizeof tiles[0]; ++k) {
    check_case(37, 37, 0, tiles[k], 1, 0, 1.0f, kScale); /* one process: local and all the same memory */
    check_case(37, 37, 0, tiles[k], 0, 0, 1.0f, kScale); /* n == N in separate memory */
  }
  const int64_t offsets[] = {0, 16, 32};
  for (size_t k = 0; k < 3; ++k) {
    check_case(37, 5, offsets[k], 8, 0, 0, 1.0f, kScale);
    check_case(37, 5, offsets[k], 0, 0, 0, 1.0f, kScale);
  }
  /* Row-strided views (row stride 21 > E = 16), and grad_loss scaling the gradients. */
  check_case(37, 37, 0, 8, 1, 21, 1.0f, kScale);
  check_case(37, 5, 16, 8, 0, 21, 1.0f, kScale);
  check_case(37, 5, 16, 8, 0, 0, 0.25f, kScale);
  check_case(37, 37, 0, 8, 1, 0, 3.0f, kScale);
  /* Scale 0: every logit is 0, d/ds comes without dividing by s. A negative scale. */
  check_case(37, 37, 0, 8, 1, 0, 1.0f, 0.0f);
  check_case(37, 5, 16, 8, 0, 0, 1.0f, 0.0f);
  check_case(37, 5, 16, 0, 0, 0, 1.0f, 0.0f);
  check_case(37, 37, 0, 8, 1, 0, 1.0f, -3.0f);
  /* Several groups of rows in the one-process statistics (N > 256), ragged last tile. */
  check_case(300, 300, 0, 64, 1, 0, 1.0f, kScale);
  check_case(300, 60, 120, 64, 0, 0, 1.0f, kScale);
}

/* braid_tensor is DLPack's DLTensor (v0.8), field for field. */
static void test_layout(void) {
  CHECK(sizeof(braid_device) == 8 && sizeof(braid_dtype) == 4);
  CHECK(offsetof(braid_tensor, data) == 0 && offsetof(braid_tensor, device) == 8 &&
        offsetof(braid_tensor, ndim) == 16 && offsetof(braid_tensor, dtype) == 20 &&
        offsetof(braid_tensor, shape) == 24 && offsetof(braid_tensor, strides) == 32 &&
        offsetof(braid_tensor, byte_offset) == 40 && sizeof(braid_tensor) == 48);
  CHECK(BRAID_DEVICE_CPU == 1 && BRAID_DEVICE_CUDA == 2);
  CHECK(BRAID_DTYPE_INT == 0 && BRAID_DTYPE_UINT == 1 && BRAID_DTYPE_FLOAT == 2 && BRAID_DTYPE_BFLOAT == 4);
  braid_contrastive_options o = BRAID_CONTRASTIVE_OPTIONS_INIT;
  CHECK(o.struct_size == sizeof o && o.version == BRAID_CONTRASTIVE_OPTIONS_VERSION && o.row_offset == 0 &&
        o.tile == 0);
}

/* Each misuse: the status, and every part in the message. */
#define EXPECT_FAILS(call, status, part1, part2)                                                      \
  do {                                                                                                \
    const braid_status got_ = (call);                                                                 \
    CHECK(got_ == (status));                                                                          \
    CHECK(contains(api.last_error(), part1) && contains(api.last_error(), part2));                    \
    if (got_ != (status) || !contains(api.last_error(), part1) || !contains(api.last_error(), part2)) \
      fprintf(stderr, "  %s -> %d: %s\n", #call, (int)got_, api.last_error());                        \
  } while (0)

static void test_misuse(void) {
  enum { N = 6, n = 2, E = 4 };
  float image[N * E], text[N * E], stats[2 * n], grads[N * E], wide[N * E * 2];
  unsigned long long state = 7;
  fill_normalized(image, N, E, E, &state);
  fill_normalized(text, N, E, E, &state);
  view2d vli, vlt, vai, vat, vst, vbad, vg;
  braid_tensor* li = make_view(&vli, image + 2 * E, n, E, 0);
  braid_tensor* lt = make_view(&vlt, text + 2 * E, n, E, 0);
  braid_tensor* ai = make_view(&vai, image, N, E, 0);
  braid_tensor* at = make_view(&vat, text, N, E, 0);
  braid_tensor* st = make_view(&vst, stats, 2, n, 0);
  braid_contrastive_options o = BRAID_CONTRASTIVE_OPTIONS_INIT;
  o.row_offset = 2;
  float loss = 0.0f, ds = 0.0f;
  CHECK(api.forward(li, lt, ai, at, 10.0f, &o, st, &loss, NULL) == BRAID_OK && loss > 0.0f);

  /* NULL pointers */
  EXPECT_FAILS(api.forward(NULL, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "local_image",
               "NULL");
  EXPECT_FAILS(api.forward(li, lt, ai, NULL, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "all_text",
               "NULL");
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, NULL, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "stats", "NULL");
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, st, NULL, NULL), BRAID_ERR_INVALID_ARGUMENT, "loss", "NULL");
  EXPECT_FAILS(api.backward(li, lt, ai, at, 10.0f, &o, NULL, 1.0f, NULL, NULL, NULL, NULL, &ds, NULL),
               BRAID_ERR_INVALID_ARGUMENT, "stats", "NULL");
  make_view(&vbad, NULL, N, E, 0);
  EXPECT_FAILS(api.forward(li, lt, &vbad.t, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "all_image",
               "data is NULL");

  /* What this build does not handle: BRAID_ERR_UNSUPPORTED, saying what it does. */
  make_view(&vbad, image, N, E, 0);
  vbad.t.dtype.bits = 64; /* float64 */
  EXPECT_FAILS(api.forward(li, lt, ai, &vbad.t, 10.0f, &o, st, &loss, NULL), BRAID_ERR_UNSUPPORTED, "all_text",
               "float32");
  make_view(&vbad, image, N, E, 0);
  vbad.t.dtype.code = BRAID_DTYPE_BFLOAT;
  vbad.t.dtype.bits = 16;
  EXPECT_FAILS(api.forward(&vbad.t, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_UNSUPPORTED, "local_image",
               "float32");
  {
    const int64_t shape3[3] = {1, n, E};
    make_view(&vbad, text + 2 * E, n, E, 0);
    vbad.t.ndim = 3;
    vbad.t.shape = shape3;
    EXPECT_FAILS(api.forward(li, &vbad.t, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_UNSUPPORTED, "local_text",
                 "2-D");
    CHECK(contains(api.last_error(), "(1, 2, 4)"));
  }
  make_view(&vbad, image, N, E, 0);
  vbad.t.device.type = BRAID_DEVICE_CUDA; /* refused before any device work: safe with or without a GPU */
  EXPECT_FAILS(api.forward(li, lt, &vbad.t, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "all_image",
               "is in CUDA device 0 but local_image is in CPU memory");
  make_view(&vbad, image, N, E, 0);
  vbad.t.device.type = 13; /* kDLCUDAManaged */
  EXPECT_FAILS(api.forward(li, lt, &vbad.t, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_UNSUPPORTED, "all_image",
               "BRAID_DEVICE_CPU");
  make_view(&vbad, wide, N, E, 2 * E);
  vbad.strides[1] = 2; /* every other float: columns not contiguous */
  EXPECT_FAILS(api.forward(li, lt, &vbad.t, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_UNSUPPORTED, "all_image",
               "strides[1] == 1");
  make_view(&vbad, image, N, E, 0);
  vbad.t.byte_offset = 2;
  EXPECT_FAILS(api.forward(li, lt, &vbad.t, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "all_image",
               "aligned");

  /* Shapes that do not fit together: BRAID_ERR_INVALID_ARGUMENT naming the argument and shapes. */
  make_view(&vbad, image, N, E - 1, 0); /* E = 3 against 4 */
  EXPECT_FAILS(api.forward(li, lt, &vbad.t, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "all_image",
               "(6, 3)");
  CHECK(contains(api.last_error(), "(2, 4)"));
  make_view(&vbad, text + 2 * E, n, E - 1, 0);
  EXPECT_FAILS(api.forward(li, &vbad.t, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "local_text",
               "(2, 3)");
  o.row_offset = 5; /* rows [5, 7) of 6 */
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "row_offset",
               "6 gathered rows");
  o.row_offset = -1;
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "row_offset",
               "[-1, 1)");
  /* The end of the local rows, one past INT64_MAX, is named without overflowing. */
  o.row_offset = INT64_MAX;
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "row_offset",
               "[9223372036854775807, 9223372036854775809)");
  o.row_offset = INT64_MIN;
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "row_offset",
               "[-9223372036854775808, -9223372036854775806)");
  o.row_offset = 0;
  EXPECT_FAILS(api.forward(ai, at, li, lt, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "local_image",
               "more than the 2 gathered rows");
  o.row_offset = 2;
  make_view(&vbad, stats, 2, n + 1, 0);
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, &vbad.t, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "stats",
               "expected (2, 2)");
  make_view(&vg, grads, N - 1, E, 0);
  EXPECT_FAILS(api.backward(li, lt, ai, at, 10.0f, &o, st, 1.0f, NULL, NULL, NULL, &vg.t, &ds, NULL),
               BRAID_ERR_INVALID_ARGUMENT, "grad_all_text", "(5, 4)");
  /* A gradient given without elements is of the wrong shape too, not "not wanted" (only NULL is). */
  make_view(&vg, NULL, 0, E, 0);
  EXPECT_FAILS(api.backward(li, lt, ai, at, 10.0f, &o, st, 1.0f, &vg.t, NULL, NULL, NULL, &ds, NULL),
               BRAID_ERR_INVALID_ARGUMENT, "grad_local_image", "(0, 4); expected (2, 4) as local_image");
  make_view(&vg, grads, N, E, 0);
  vg.t.dtype.code = BRAID_DTYPE_INT;
  EXPECT_FAILS(api.backward(li, lt, ai, at, 10.0f, &o, st, 1.0f, NULL, NULL, &vg.t, NULL, &ds, NULL),
               BRAID_ERR_UNSUPPORTED, "grad_all_image", "float32");
  EXPECT_FAILS(api.forward(li, lt, ai, at, NAN, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "logit_scale",
               "finite");

  /* Options. */
  o.tile = -3;
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "tile", "-3");
  o.tile = 0;
  o.struct_size = sizeof(size_t);
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT,
               "options->struct_size", "BRAID_CONTRASTIVE_OPTIONS_INIT");
  /* Its fields' end but not its sizeof (the size of its one version): refused. */
  o.struct_size = offsetof(braid_contrastive_options, tile) + sizeof o.tile;
  CHECK(o.struct_size < sizeof o);
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT,
               "options->struct_size is 28", "below the first version of braid_contrastive_options (32 bytes)");
  o.struct_size = sizeof o;
  o.version = 0;
  EXPECT_FAILS(api.forward(li, lt, ai, at, 10.0f, &o, st, &loss, NULL), BRAID_ERR_INVALID_ARGUMENT, "options->version",
               "BRAID_CONTRASTIVE_OPTIONS_INIT");
  o.version = BRAID_CONTRASTIVE_OPTIONS_VERSION;

  /* A newer caller's larger options struct is read up to what this library knows. */
  struct {
    braid_contrastive_options v1;
    double future_field;
  } bigger;
  memset(&bigger, 0, sizeof bigger);
  bigger.v1.struct_size = sizeof bigger;
  bigger.v1.version = BRAID_CONTRASTIVE_OPTIONS_VERSION;
  bigger.v1.row_offset = 2;
  float again = 0.0f;
  CHECK(api.forward(li, lt, ai, at, 10.0f, &bigger.v1, st, &again, NULL) == BRAID_OK && again == loss);
  /* NULL options: row_offset 0, the default tile. */
  float at_zero = 0.0f;
  braid_contrastive_options zero = BRAID_CONTRASTIVE_OPTIONS_INIT;
  CHECK(api.forward(li, lt, ai, at, 10.0f, NULL, st, &loss, NULL) == BRAID_OK);
  CHECK(api.forward(li, lt, ai, at, 10.0f, &zero, st, &at_zero, NULL) == BRAID_OK && at_zero == loss);

  /* No local rows: loss 0, gathered gradients zero. */
  view2d ve, vse;
  braid_tensor* empty = make_view(&ve, image, 0, E, 0);
  braid_tensor* empty_stats = make_view(&vse, stats, 2, 0, 0);
  for (int k = 0; k < N * E; ++k) grads[k] = 1.0f;
  CHECK(api.forward(empty, empty, ai, at, 10.0f, NULL, empty_stats, &loss, NULL) == BRAID_OK && loss == 0.0f);
  CHECK(api.backward(empty, empty, ai, at, 10.0f, NULL, empty_stats, 1.0f, NULL, NULL, make_view(&vg, grads, N, E, 0),
                     NULL, &ds, NULL) == BRAID_OK &&
        ds == 0.0f);
  int zeros = 1;
  for (int k = 0; k < N * E; ++k) zeros = zeros && grads[k] == 0.0f;
  CHECK(zeros);
}

int main(int argc, char** argv) {
  void* lib = capi_open(argc, argv, 1, "LIBBRAID_SO");
  RESOLVE(last_error);
  RESOLVE_AS(forward, "braid_contrastive_forward");
  RESOLVE_AS(backward, "braid_contrastive_backward");

  test_layout();
  test_against_naive();
  test_misuse();
  return capi_finish(lib, "braid/tensor.h", "");
}
