/*
 * aml/higher/allocator/buddy.h - a buddy allocator (libaml on ferry): blocks of powers of two,
 * 64 bytes at least, split on allocation and merged with their buddy when freed, over pools
 * mapped from an area that double in size. Chunks report the block's size. Also the
 * low-level buddy allocator over memory the caller gives it (struct buddy_allocator). The
 * area and options are kept, not owned. Its data (struct aml_allocator_buddy) is opaque in
 * libaml.
 */
#ifndef AML_HIGHER_ALLOCATOR_BUDDY_H
#define AML_HIGHER_ALLOCATOR_BUDDY_H 1

#include "aml/higher/allocator.h"

#ifdef __cplusplus
extern "C" {
#endif

struct aml_area;
struct aml_area_mmap_options;
struct buddy_allocator;
struct aml_allocator_buddy;

int buddy_allocator_create(struct buddy_allocator **out);
/* size: a power of two, 64 or more; -AML_EINVAL also for a region overlapping one given. */
int buddy_allocator_extend(struct buddy_allocator *b, void *ptr, size_t size);
/* Does not unmap the memory. -AML_EBUSY while blocks are allocated. */
int buddy_allocator_destroy(struct buddy_allocator **buddy);
/* -AML_EINVAL: not a block of this allocator (or freed). */
int buddy_allocator_free(struct buddy_allocator *b, void *ptr);
/* -AML_ENOMEM: no free block large enough; -AML_EINVAL: size 0. */
int buddy_allocator_alloc(struct buddy_allocator *b, void **out, size_t size);

extern struct aml_allocator_ops aml_allocator_buddy_ops;

/* -AML_EINVAL: NULL allocator or area. The first pool is mapped at the first allocation. */
int aml_allocator_buddy_create(struct aml_allocator **allocator, struct aml_area *area,
                               struct aml_area_mmap_options *opts);
/* Unmaps the pools (allocations still out included); *allocator set NULL. */
int aml_allocator_buddy_destroy(struct aml_allocator **allocator);
void *aml_allocator_buddy_alloc(struct aml_allocator_data *data, size_t size);
int aml_allocator_buddy_free(struct aml_allocator_data *data, void *ptr);
/* The chunk methods (AML exports them without declaring them). */
struct aml_allocator_chunk *aml_allocator_buddy_alloc_chunk(struct aml_allocator_data *data,
                                                            size_t size);
int aml_allocator_buddy_free_chunk(struct aml_allocator_data *data,
                                   struct aml_allocator_chunk *chunk);

#ifdef __cplusplus
}
#endif

#endif /* AML_HIGHER_ALLOCATOR_BUDDY_H */
