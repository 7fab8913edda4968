/*
 * aml/higher/mapper/deepcopy.h - the deep copy of a tree-shaped structure (libaml on ferry):
 * creators run to the end, a buffer per split field; the buffers kept in an aml_mapped_ptrs
 * (opaque) for aml_mapper_deepfree.
 */
#ifndef AML_HIGHER_MAPPER_DEEPCOPY_H
#define AML_HIGHER_MAPPER_DEEPCOPY_H 1

#include "aml.h"
#include "aml/higher/mapper.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void *aml_mapped_ptrs;

/* One buffer of a deep copy; area NULL: host memory from malloc. */
struct aml_mapped_ptr {
	void *ptr;
	size_t size;
	struct aml_area *area;
};

/* Frees one buffer (a struct aml_mapped_ptr *). */
void aml_mapped_ptr_destroy(void *ptr);
/* The copy, or NULL with aml_errno set (nothing left allocated). See
 * aml_mapper_creator_create for the arguments. */
void *aml_mapper_deepcopy(aml_mapped_ptrs *out, void *ptr, struct aml_mapper *mapper,
                          struct aml_area *area, struct aml_area_mmap_options *area_opts,
                          struct aml_dma *dma_src_host, struct aml_dma *dma_host_dst,
                          aml_dma_operator memcpy_src_host, aml_dma_operator memcpy_host_dst);
/* -AML_EINVAL: NULL. */
int aml_mapper_deepfree(aml_mapped_ptrs data);

#ifdef __cplusplus
}
#endif

#endif /* AML_HIGHER_MAPPER_DEEPCOPY_H */
