/*
 * aml/higher/allocator/area.h - an allocator mapping each allocation from an area (libaml on
 * ferry). The area and options are kept, not owned: they must outlive the allocator. Its data
 * (struct aml_allocator_area_data) is opaque in libaml.
 */
#ifndef AML_HIGHER_ALLOCATOR_AREA_H
#define AML_HIGHER_ALLOCATOR_AREA_H 1

#include "aml/higher/allocator.h"

#ifdef __cplusplus
extern "C" {
#endif

struct aml_area;
struct aml_area_mmap_options;
struct aml_allocator_area_data;

extern struct aml_allocator_ops aml_allocator_area_ops;

/* -AML_EINVAL: NULL out or area. */
int aml_allocator_area_create(struct aml_allocator **out, struct aml_area *area,
                              struct aml_area_mmap_options *opts);
/* Unmaps what is still allocated; *allocator set NULL. */
int aml_allocator_area_destroy(struct aml_allocator **allocator);
/* Size 0: NULL with aml_errno AML_EINVAL. */
void *aml_allocator_area_alloc(struct aml_allocator_data *data, size_t size);
/* -AML_EINVAL: not a pointer of this allocator. */
int aml_allocator_area_free(struct aml_allocator_data *data, void *ptr);

#ifdef __cplusplus
}
#endif

#endif /* AML_HIGHER_ALLOCATOR_AREA_H */
