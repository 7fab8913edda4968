/*
 * aml/higher/allocator.h - allocators over AML areas (libaml on ferry): a struct aml_allocator
 * is its data and its methods; aml_alloc / aml_free and the chunk calls go through them.
 * The allocators keep their bookkeeping outside the memory they hand out.
 */
#ifndef AML_HIGHER_ALLOCATOR_H
#define AML_HIGHER_ALLOCATOR_H 1

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct aml_allocator_data;
struct aml_allocator_ops;

struct aml_allocator {
	struct aml_allocator_data *data;
	struct aml_allocator_ops *ops;
};

/* An allocation with its actual size (at least the size asked for). */
struct aml_allocator_chunk {
	void *ptr;       /* read-only */
	size_t size;     /* read-only */
	void *user_data; /* the user's */
};

/* alloc and free are required; the chunk methods optional. */
struct aml_allocator_ops {
	/* NULL with aml_errno set on failure. */
	void *(*alloc)(struct aml_allocator_data *data, size_t size);
	int (*free)(struct aml_allocator_data *data, void *ptr);
	struct aml_allocator_chunk *(*alloc_chunk)(struct aml_allocator_data *data, size_t size);
	int (*free_chunk)(struct aml_allocator_data *data, struct aml_allocator_chunk *chunk);
};

/* NULL with aml_errno set on failure (AML_EINVAL: NULL allocator, data, ops or alloc). */
void *aml_alloc(struct aml_allocator *allocator, size_t size);
/* NULL ptr: AML_SUCCESS; -AML_EINVAL: NULL allocator, data, ops or free. */
int aml_free(struct aml_allocator *allocator, void *ptr);
/* NULL with aml_errno AML_ENOTSUP if the allocator has no chunk methods. */
struct aml_allocator_chunk *aml_allocator_alloc_chunk(struct aml_allocator *allocator,
                                                      size_t size);
/* NULL chunk: AML_SUCCESS; -AML_ENOTSUP: no chunk methods. */
int aml_allocator_free_chunk(struct aml_allocator *allocator, struct aml_allocator_chunk *chunk);

#ifdef __cplusplus
}
#endif

#endif /* AML_HIGHER_ALLOCATOR_H */
