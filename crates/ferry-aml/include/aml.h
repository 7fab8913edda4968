/*
 * aml.h - AML's DMA API on ferry (libaml from crates/ferry-aml).
 *
 * A program written for AML's DMA, layout and area API builds against this header set
 * unchanged: change the include and link flags only (pkg-config --cflags --libs aml).
 * Names, signatures, the public structs and the constant values are AML's. What differs:
 *  - every bad argument is an error value (-AML_EINVAL ...), never an assert or a crash;
 *    functions returning a pointer return NULL and set aml_errno;
 *  - waiting for a request waits for that request only; aml_dma_barrier returns the first
 *    failure it saw (an AML error value);
 *  - dense layouts have no limit on the number of dims; layouts are copied when a request with
 *    the NULL operator is created (they may be destroyed at once); with a custom operator
 *    they are passed to it as given and must live until the request is done (as in AML);
 *  - ferry_last_error_message() (declared here) gives the reason of the last failure on the
 *    calling thread; aml_perror prints it;
 *  - aml_strerror accepts a value as returned (negated) or positive.
 * Every CUDA symbol exists in every build and returns -AML_ENOTSUP without a CUDA driver.
 */
#ifndef AML_H
#define AML_H 1

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

/* libnuma's headers where installed, as AML's aml.h includes them (libaml needs neither). */
#if defined(__has_include)
#if __has_include(<numa.h>) && __has_include(<numaif.h>)
#include <numa.h>
#include <numaif.h>
#endif
#endif

/* libaml's own excit.h (ranges and products), as AML's aml.h includes excit's. */
#include <excit.h>

#include "aml/utils/async.h"
#include "aml/utils/bitmap.h"
#include "aml/utils/features.h"
#include "aml/utils/inner-malloc.h"
#include "aml/utils/macros.h"
#include "aml/utils/queue.h"
#include "aml/utils/vector.h"
#include "aml/utils/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ errors */

#define AML_SUCCESS 0
#define AML_FAILURE 1 /* generic error */
#define AML_ENOMEM 2  /* not enough memory */
#define AML_EINVAL 3  /* invalid argument */
#define AML_EDOM 4    /* value out of bound */
#define AML_ENOTSUP 5 /* operation not supported (e.g. CUDA without a driver) */
#define AML_EBUSY 6   /* underlying resource not available */
#define AML_EPERM 7   /* insufficient permissions */
#define AML_ERROR_MAX 8

/* Error (a positive AML_E* value, as AML) of the last failed call that returns a pointer
 * (or nothing). */
extern int aml_errno;
/* Description of an error value, negated or not. Static; never NULL. */
const char *aml_strerror(const int err);
/* Prints "msg:" and the description of aml_errno (and the last failure's reason) on stderr. */
void aml_perror(const char *msg);
/* The reason of the last failure on this thread ("" if none); valid until the next call. */
const char *ferry_last_error_message(void);

/* ------------------------------------------------------------------ library */

/* AML_HAVE_BACKEND_* and AML_BACKEND_*: aml/utils/features.h */

/* Creates the ready aml_dma_linux. argc/argv unused (may be NULL). */
int aml_init(int *argc, char **argv[]);
/* Releases the ready dmas (after waiting for their work). */
int aml_finalize(void);

/* ------------------------------------------------------------------ areas */

struct aml_area_data;
struct aml_area_mmap_options;

struct aml_area_ops {
	void *(*mmap)(const struct aml_area_data *data, size_t size,
	              struct aml_area_mmap_options *opts);
	int (*munmap)(const struct aml_area_data *data, void *ptr, size_t size);
	int (*fprintf)(const struct aml_area_data *data, FILE *stream, const char *prefix);
};

struct aml_area {
	struct aml_area_ops *ops;
	struct aml_area_data *data;
};

/* NULL with aml_errno on failure (AML_EINVAL: NULL area); size 0: NULL, aml_errno untouched. */
void *aml_area_mmap(const struct aml_area *area, size_t size,
                    struct aml_area_mmap_options *opts);
/* NULL ptr or size 0: a no-op (AML_SUCCESS), as AML. */
int aml_area_munmap(const struct aml_area *area, void *ptr, size_t size);
int aml_area_fprintf(FILE *stream, const char *prefix, const struct aml_area *area);

/* ------------------------------------------------------------------ layouts */

struct aml_layout_ops;
struct aml_layout_data;

struct aml_layout {
	struct aml_layout_ops *ops;
	struct aml_layout_data *data;
};

struct aml_layout_ops {
	void *(*deref)(const struct aml_layout_data *data, const size_t *coords);
	void *(*deref_native)(const struct aml_layout_data *data, const size_t *coords);
	void *(*rawptr)(const struct aml_layout_data *data);
	int (*order)(const struct aml_layout_data *data);
	int (*dims)(const struct aml_layout_data *data, size_t *dims);
	int (*dims_native)(const struct aml_layout_data *data, size_t *dims);
	size_t (*ndims)(const struct aml_layout_data *data);
	size_t (*element_size)(const struct aml_layout_data *data);
	int (*reshape)(const struct aml_layout_data *data, struct aml_layout **output,
	               const size_t ndims, const size_t *dims);
	int (*slice)(const struct aml_layout_data *data, struct aml_layout **output,
	             const size_t *offsets, const size_t *dims, const size_t *strides);
	int (*slice_native)(const struct aml_layout_data *data, struct aml_layout **output,
	                    const size_t *offsets, const size_t *dims, const size_t *strides);
	int (*fprintf)(const struct aml_layout_data *data, FILE *stream, const char *prefix);
	int (*duplicate)(const struct aml_layout *layout, struct aml_layout **out, void *ptr);
	void (*destroy)(struct aml_layout *);
};

/* AML's values (ferry.h's FERRY_ORDER_* are different). */
#define AML_LAYOUT_ORDER_FORTRAN (0 << 0)
#define AML_LAYOUT_ORDER_C (1 << 0)
#define AML_LAYOUT_ORDER_COLUMN_MAJOR (0 << 0)
#define AML_LAYOUT_ORDER_ROW_MAJOR (1 << 0)
#define AML_LAYOUT_ORDER(x) ((x) & (1 << 0))

/* Element address at coords (layout order); not bounds-checked. NULL + aml_errno on NULL. */
void *aml_layout_deref(const struct aml_layout *layout, const size_t *coords);
/* As aml_layout_deref; NULL and aml_errno = AML_EINVAL when a coordinate is out of bounds. */
void *aml_layout_deref_safe(const struct aml_layout *layout, const size_t *coords);
void *aml_layout_rawptr(const struct aml_layout *layout);
int aml_layout_order(const struct aml_layout *layout);
int aml_layout_dims(const struct aml_layout *layout, size_t *dims);
size_t aml_layout_ndims(const struct aml_layout *layout);
size_t aml_layout_element_size(const struct aml_layout *layout);
/* -AML_EINVAL: other element count, or new dims that would need a copy. */
int aml_layout_reshape(const struct aml_layout *layout, struct aml_layout **reshaped_layout,
                       const size_t ndims, const size_t *dims);
/* offsets NULL: 0; strides NULL: 1. -AML_EINVAL if the slice does not fit. */
int aml_layout_slice(const struct aml_layout *layout, struct aml_layout **reshaped_layout,
                     const size_t *offsets, const size_t *dims, const size_t *strides);
int aml_layout_fprintf(FILE *stream, const char *prefix, const struct aml_layout *layout);
int aml_layout_duplicate(const struct aml_layout *src, struct aml_layout **out, void *ptr);
/* Frees *layout (its destroy op, else free()) and sets it NULL. */
void aml_layout_destroy(struct aml_layout **layout);

/* ------------------------------------------------------------------ tiling */

/* A layout cut into tiles; each tile is a new layout the caller destroys. */
#define AML_TILING_ORDER_FORTRAN (0 << 0)
#define AML_TILING_ORDER_C (1 << 0)
#define AML_TILING_ORDER_COLUMN_MAJOR (0 << 0)
#define AML_TILING_ORDER_ROW_MAJOR (1 << 0)
#define AML_TILING_ORDER(x) ((x) & (1 << 0))

struct aml_tiling_data;

struct aml_tiling_ops {
	struct aml_layout *(*index)(const struct aml_tiling_data *t, const size_t *coords);
	struct aml_layout *(*index_native)(const struct aml_tiling_data *t,
	                                   const size_t *coords);
	void *(*rawptr)(const struct aml_tiling_data *t, const size_t *coords);
	int (*order)(const struct aml_tiling_data *t);
	int (*dims)(const struct aml_tiling_data *t, size_t *dims);
	int (*dims_native)(const struct aml_tiling_data *t, size_t *dims);
	size_t (*ndims)(const struct aml_tiling_data *t);
	size_t (*ntiles)(const struct aml_tiling_data *t);
	int (*fprintf)(const struct aml_tiling_data *data, FILE *stream, const char *prefix);
};

struct aml_tiling {
	struct aml_tiling_ops *ops;
	struct aml_tiling_data *data;
};

int aml_tiling_order(const struct aml_tiling *tiling);
/* Tiles per dim, the tiling's order. */
int aml_tiling_dims(const struct aml_tiling *tiling, size_t *dims);
/* 0 for NULL (AML asserts). */
size_t aml_tiling_ndims(const struct aml_tiling *tiling);
/* The dims of the tile at coords (NULL: the first tile). */
int aml_tiling_tile_dims(const struct aml_tiling *tiling, const size_t *coords, size_t *dims);
/* 0 for NULL (AML asserts). */
size_t aml_tiling_ntiles(const struct aml_tiling *tiling);
/* NULL + aml_errno for NULL or coords out of the tiling (AML asserts on the latter). */
struct aml_layout *aml_tiling_index(const struct aml_tiling *tiling, const size_t *coords);
void *aml_tiling_rawptr(const struct aml_tiling *tiling, const size_t *coords);
/* The tile at the iterator's current element (native order), the iterator not moved. */
struct aml_layout *aml_tiling_index_byiter(const struct aml_tiling *tiling,
                                           const_excit_t iterator);
int aml_tiling_fprintf(FILE *stream, const char *prefix, const struct aml_tiling *tiling);

/* ------------------------------------------------------------------ dma */

#define AML_DMA_REQUEST_TYPE_INVALID -1
#define AML_DMA_REQUEST_TYPE_LAYOUT 0

struct aml_dma_request;
struct aml_dma_data;

/* An operator: a C function that performs the copy; its return value is the request's
 * result. The Linux DMA runs it on a worker thread, the CUDA DMA on the calling thread with
 * the engine's stream (struct aml_dma_cuda_op_arg). */
typedef int (*aml_dma_operator)(struct aml_layout *dst, const struct aml_layout *src,
                                void *arg);

struct aml_dma_ops {
	int (*create_request)(struct aml_dma_data *dma, struct aml_dma_request **req,
	                      struct aml_layout *dest, struct aml_layout *src,
	                      aml_dma_operator op, void *op_arg);
	int (*destroy_request)(struct aml_dma_data *dma, struct aml_dma_request **req);
	int (*wait_request)(struct aml_dma_data *dma, struct aml_dma_request **req);
	int (*barrier)(struct aml_dma_data *dma);
	int (*fprintf)(const struct aml_dma_data *data, FILE *stream, const char *prefix);
};

struct aml_dma {
	struct aml_dma_ops *ops;
	struct aml_dma_data *data;
};

/* Copies and waits. op NULL: the dma's default (Linux, CUDA: ferry's planned layout copy). */
int aml_dma_copy_custom(struct aml_dma *dma, struct aml_layout *dest, struct aml_layout *src,
                        aml_dma_operator op, void *op_arg);
/* Starts a copy. req NULL: fire and forget, reclaimed (and reported) by aml_dma_barrier. */
int aml_dma_async_copy_custom(struct aml_dma *dma, struct aml_dma_request **req,
                              struct aml_layout *dest, struct aml_layout *src,
                              aml_dma_operator op, void *op_arg);
#define aml_dma_copy(dma, d, s) aml_dma_copy_custom(dma, d, s, NULL, NULL)
#define aml_dma_async_copy(dma, r, d, s) aml_dma_async_copy_custom(dma, r, d, s, NULL, NULL)
/* Waits for that request only, releases it, *req = NULL: its result. */
int aml_dma_wait(struct aml_dma *dma, struct aml_dma_request **req);
/* Waits for everything submitted so far: AML_SUCCESS or the first failure not yet returned. */
int aml_dma_barrier(struct aml_dma *dma);
/* Releases a request without its result (waits until its memory is free). */
int aml_dma_cancel(struct aml_dma *dma, struct aml_dma_request **req);
int aml_dma_fprintf(FILE *stream, const char *prefix, const struct aml_dma *dma);

/* Copies src into dst, native dim i of dst being native dim target_dims[i] of src (a
 * transpose): ferry's planned copy between dense layouts (on aml_dma_linux's workers after
 * aml_init, else on the calling thread), AML's element-wise copy otherwise. -AML_EINVAL: NULL
 * arguments, different ndims or element sizes, target_dims not a permutation of 0..ndims,
 * dims that do not match through it (AML asserts these). */
int aml_copy_layout_transform_generic(struct aml_layout *dst, const struct aml_layout *src,
                                      const size_t *target_dims);

#ifdef __cplusplus
}
#endif

#endif /* AML_H */
