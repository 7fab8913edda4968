/*
 * libaml's excit.h: the part of excit's iterator API that AML's tiling programs use (ranges,
 * products of iterators), written for libaml and built into it, so that `pkg-config aml` is
 * all an AML program needs (AML's install bundles libexcit). Do not link excit's libexcit too.
 * Values as excit's: the type tags, EXCIT_SUCCESS 0, EXCIT_STOPIT 1, errors negated.
 */
#ifndef EXCIT_H
#define EXCIT_H 1

#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Iterator types (excit's values); libaml's excit_alloc makes EXCIT_RANGE and EXCIT_PRODUCT. */
enum excit_type_e {
	EXCIT_INVALID,
	EXCIT_INDEX,
	EXCIT_RANGE,
	EXCIT_CONS,
	EXCIT_REPEAT,
	EXCIT_HILBERT2D,
	EXCIT_PRODUCT,
	EXCIT_COMPOSITION,
	EXCIT_TLEAF,
	EXCIT_USER,
	EXCIT_LOOP,
	EXCIT_TYPE_MAX
};

/* Results: EXCIT_SUCCESS, EXCIT_STOPIT (iteration over), or an error negated. */
enum excit_error_e {
	EXCIT_SUCCESS,
	EXCIT_STOPIT,
	EXCIT_ENOMEM,
	EXCIT_EINVAL,
	EXCIT_EDOM,
	EXCIT_ENOTSUP,
	EXCIT_ERROR_MAX
};

typedef struct excit_s *excit_t;
typedef const struct excit_s *const_excit_t;

/* A new iterator of that type (NULL for the types libaml does not make). */
excit_t excit_alloc(enum excit_type_e type);
/* Frees an iterator and, for a product, the iterators added to it. NULL: no-op. */
void excit_free(excit_t it);
/* The number of indexes an element has (a range: 1; a product: the sum of its parts'). */
int excit_dimension(const_excit_t it, ssize_t *dimension);
/* The current element in indexes (NULL: not written), then the next one is current. */
int excit_next(excit_t it, ssize_t *indexes);
/* The current element in indexes (NULL: not written). */
int excit_peek(const_excit_t it, ssize_t *indexes);
/* Back to the first element. */
int excit_rewind(excit_t it);
/* first, first + step, ... up to last included (step < 0: down to last); step 0 is invalid. */
int excit_range_init(excit_t it, ssize_t first, ssize_t last, ssize_t step);
/* Adds added_it as the product's last (fastest) part; the product owns it on success. */
int excit_product_add(excit_t it, excit_t added_it);

#ifdef __cplusplus
}
#endif

#endif /* EXCIT_H */
