/*
 * aml/higher/mapper/creator.h - the step-by-step deep copy of a tree-shaped structure into
 * one packed buffer (libaml on ferry; AML's public struct): each element is copied to a host
 * buffer, its parent's pointer rewritten to its place in the destination, which receives the
 * host buffer in one copy at finish. Split fields (AML_MAPPER_FLAG_SPLIT) are branched out to
 * a creator of their own or connected to a copy made already. With AML_MAPPER_FLAG_HOST the
 * copy is the host buffer itself. Self references and shared elements are not supported.
 */
#ifndef AML_HIGHER_MAPPER_CREATOR_H
#define AML_HIGHER_MAPPER_CREATOR_H 1

#include "aml.h"
#include "aml/higher/mapper.h"
#include "aml/higher/mapper/visitor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct aml_mapper_creator {
	struct aml_mapper_visitor_state *stack; /* device_ptr: the source element */
	void *device_memory;                    /* the destination buffer */
	void *host_memory;                      /* the host buffer the copy is built in */
	size_t size;                            /* the buffers' size */
	size_t offset;                          /* the bytes used so far */
	struct aml_area *device_area;           /* NULL: a host copy */
	struct aml_dma *dma_src_host;           /* NULL: the host reads the source */
	struct aml_dma *dma_host_dst;
	aml_dma_operator memcpy_src_host;
	aml_dma_operator memcpy_host_dst;
};

/* size 0: measured. -AML_EINVAL: NULL out, src_ptr or mapper, or no area / dma_host_dst for a
 * copy off the host. */
int aml_mapper_creator_create(struct aml_mapper_creator **out, void *src_ptr, size_t size,
                              struct aml_mapper *mapper, struct aml_area *area,
                              struct aml_area_mmap_options *area_opts,
                              struct aml_dma *dma_src_host, struct aml_dma *dma_host_dst,
                              aml_dma_operator memcpy_src_host,
                              aml_dma_operator memcpy_host_dst);
/* After next returned -AML_EDOM; frees the creator. *size: the size to unmap the copy with.
 * -AML_EINVAL: not done (use abort). */
int aml_mapper_creator_finish(struct aml_mapper_creator *c, void **ptr, size_t *size);
/* Frees the creator and its destination buffer (not its branches). */
int aml_mapper_creator_abort(struct aml_mapper_creator *crtr);
/* -AML_EDOM: done (finish); -AML_EINVAL: a split field (branch or connect), a NULL creator, or
 * a NULL pointer field with elements; -AML_ENOMEM: the structure outgrew its measure. */
int aml_mapper_creator_next(struct aml_mapper_creator *c);
/* Points the split field at ptr and moves on; -AML_EDOM: nothing left. */
int aml_mapper_creator_connect(struct aml_mapper_creator *c, void *ptr);
/* A creator for the split field, connected to it (an empty field: *out NULL, the field NULL);
 * -AML_EDOM: nothing left in c. */
int aml_mapper_creator_branch(struct aml_mapper_creator **out, struct aml_mapper_creator *c,
                              struct aml_area *area, struct aml_area_mmap_options *area_opts,
                              struct aml_dma *dma_host_dst, aml_dma_operator memcpy_host_dst);

#ifdef __cplusplus
}
#endif

#endif /* AML_HIGHER_MAPPER_CREATOR_H */
