/*
 * aml/utils/inner-malloc.h - one calloc for a struct and what it points to (libaml on ferry,
 * AML's macros): AML_INNER_MALLOC(t1, t2, ...) allocates, zeroed, room for a t1, a t2, ...
 * laid out as a struct of them; AML_INNER_MALLOC_GET_FIELD(ptr, i, t1, ...) is the address of
 * the i-th (from 1). The _ARRAY forms add n elements of `type` after the fields, the _EXTRA
 * forms `size` more bytes after the array. free() releases the whole block. C only.
 */
#ifndef AML_INNER_MALLOC_H
#define AML_INNER_MALLOC_H 1

#include <stdint.h>
#include <stdlib.h>

#include "aml/utils/macros.h"

#define AML_INNER_MALLOC(...) calloc(1, AML_SIZEOF_ALIGNED(__VA_ARGS__))
#define AML_INNER_MALLOC_ARRAY(n, type, ...) \
	calloc(1, AML_SIZEOF_ALIGNED_ARRAY(n, type, __VA_ARGS__))
#define AML_INNER_MALLOC_EXTRA(n, type, size, ...) \
	calloc(1, AML_SIZEOF_ALIGNED_ARRAY(n, type, __VA_ARGS__) + (size))
#define AML_INNER_MALLOC_GET_FIELD(ptr, N, ...) \
	(void *)(((intptr_t)(ptr)) + AML_OFFSETOF_ALIGNED(N, __VA_ARGS__))
#define AML_INNER_MALLOC_GET_ARRAY(ptr, type, ...) \
	AML_INNER_MALLOC_GET_FIELD(ptr, PLUS_1(VA_NARG(__VA_ARGS__)), __VA_ARGS__, type)
#define AML_INNER_MALLOC_GET_EXTRA(ptr, n, type, ...) \
	(void *)(((intptr_t)(ptr)) + AML_SIZEOF_ALIGNED_ARRAY(n, type, __VA_ARGS__))

#endif /* AML_INNER_MALLOC_H */
