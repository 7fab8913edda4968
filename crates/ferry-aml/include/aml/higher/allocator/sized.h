/*
 * aml/higher/allocator/sized.h - an allocator of one size (libaml on ferry), over pools mapped
 * from an area (as many chunks as are mapped already, up to 1 MiB a pool; AML maps one chunk
 * per pool). The area and options are kept, not owned. Its data (struct aml_allocator_sized)
 * is opaque in libaml.
 */
#ifndef AML_HIGHER_ALLOCATOR_SIZED_H
#define AML_HIGHER_ALLOCATOR_SIZED_H 1

#include "aml/higher/allocator.h"

#ifdef __cplusplus
extern "C" {
#endif

struct aml_area;
struct aml_area_mmap_options;

/* The methods (AML's name, without _ops). */
extern struct aml_allocator_ops aml_allocator_sized;

/* Maps the first pool. -AML_EINVAL: NULL allocator or area, or size 0. */
int aml_allocator_sized_create(struct aml_allocator **allocator, size_t size,
                               struct aml_area *area, struct aml_area_mmap_options *opts);
/* Unmaps the pools (allocations still out included); *allocator set NULL. */
int aml_allocator_sized_destroy(struct aml_allocator **allocator);
/* Another size: NULL with aml_errno AML_EINVAL. */
void *aml_allocator_sized_alloc(struct aml_allocator_data *data, size_t size);
int aml_allocator_sized_free(struct aml_allocator_data *data, void *ptr);

#ifdef __cplusplus
}
#endif

#endif /* AML_HIGHER_ALLOCATOR_SIZED_H */
