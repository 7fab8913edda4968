/*
 * aml/higher/mapper/visitor.h - the walk of a structure described by a mapper (libaml on
 * ferry): a stack of states, the head the element visited (AML's public structs). Where the
 * structure is not readable by the host, each element descended is copied to the host with
 * the visitor's dma and memcpy operator (AML's convention: the layouts are the raw pointers,
 * the argument the size); NULL dma: the host reads it. Cycles are not detected.
 */
#ifndef AML_HIGHER_MAPPER_VISITOR_H
#define AML_HIGHER_MAPPER_VISITOR_H 1

#include "aml.h"
#include "aml/higher/mapper.h"

#ifdef __cplusplus
extern "C" {
#endif

struct aml_mapper_visitor_state {
	void *device_ptr;          /* the element visited, where it lives */
	void *host_copy;           /* its bytes for the host (made when its first field is descended) */
	struct aml_mapper *mapper; /* its mapper */
	size_t field_num;          /* its field number in the parent's mapper */
	size_t array_size;         /* the elements of its array (1: not an array) */
	size_t array_num;          /* its index there */
	struct aml_mapper_visitor_state *next; /* the parent's state */
};

struct aml_mapper_visitor {
	struct aml_mapper_visitor_state *stack; /* the head: the element visited */
	struct aml_dma *dma;
	aml_dma_operator memcpy_op;
};

/* -AML_EINVAL: NULL out, ptr or mapper. */
int aml_mapper_visitor_create(struct aml_mapper_visitor **out, void *ptr,
                              struct aml_mapper *mapper, struct aml_dma *dma,
                              aml_dma_operator memcpy_op);
/* -AML_EINVAL: NULL. */
int aml_mapper_visitor_destroy(struct aml_mapper_visitor *it);
/* A visitor of the element visited and its descendants. */
int aml_mapper_visitor_subtree(const struct aml_mapper_visitor *it,
                               struct aml_mapper_visitor **subtree_visitor);
/* -AML_EDOM: no next / previous element; -AML_EINVAL: the element is NULL. */
int aml_mapper_visitor_next_array_element(struct aml_mapper_visitor *it);
int aml_mapper_visitor_prev_array_element(struct aml_mapper_visitor *it);
/* -AML_EDOM: no next / previous field (or at the root). */
int aml_mapper_visitor_next_field(struct aml_mapper_visitor *it);
int aml_mapper_visitor_prev_field(struct aml_mapper_visitor *it);
/* -AML_EDOM: no field, or an empty array; -AML_EINVAL: the element is NULL. */
int aml_mapper_visitor_first_field(struct aml_mapper_visitor *it);
/* -AML_EDOM at the root, which stays (AML pops it, leaving an unusable visitor). */
int aml_mapper_visitor_parent(struct aml_mapper_visitor *it);
/* NULL for a NULL visitor. */
void *aml_mapper_visitor_ptr(struct aml_mapper_visitor *it);
/* array_size > 1. */
int aml_mapper_visitor_is_array(struct aml_mapper_visitor *it);
size_t aml_mapper_visitor_array_len(struct aml_mapper_visitor *it);
/* The bytes of the element(s) and descendants, AML_MAPPER_FLAG_SPLIT ones aside. */
int aml_mapper_visitor_size(const struct aml_mapper_visitor *visitor, size_t *size);
/* 1: same bytes (pointer values aside) and shape; 0: not; < 0: an error. */
int aml_mapper_visitor_match(const struct aml_mapper_visitor *lhs,
                             const struct aml_mapper_visitor *rhs);

#ifdef __cplusplus
}
#endif

#endif /* AML_HIGHER_MAPPER_VISITOR_H */
