/*
 * aml/dma/multiplex.h - several dmas behind one, by integer weight (libaml on ferry).
 * Does not own its dmas (destroy them after the multiplex); the same dma may appear twice; a
 * weight of 0 sends that dma nothing (not every weight may be 0); thread-safe.
 */
#ifndef AML_DMA_MULTIPLEX_H
#define AML_DMA_MULTIPLEX_H

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

/* weights NULL: all 1. -AML_EINVAL: NULL dma/dmas, num 0, a NULL dma, every weight 0. */
int aml_dma_multiplex_create(struct aml_dma **dma, const size_t num, const struct aml_dma **dmas,
                             const size_t *weights);
int aml_dma_multiplex_destroy(struct aml_dma **dma);

struct aml_dma_multiplex_data {
	size_t count;
	size_t index;
	size_t round;
	struct aml_dma **dmas;
	size_t *weights;
	/* (private fields follow) */
};

extern struct aml_dma_ops aml_dma_multiplex_ops;

struct aml_dma_multiplex_request {
	size_t count;
	struct aml_dma_request **reqs;
	struct aml_dma **dmas;
};

/* Per-dma operator and argument (arrays as long as the dma array; either may be NULL). Pass
 * a pointer to it as op_arg; NULL op_arg: each dma's defaults. */
struct aml_dma_multiplex_request_args {
	aml_dma_operator *ops;
	void **op_args;
};

int aml_dma_multiplex_request_create(struct aml_dma_data *data, struct aml_dma_request **req,
                                     struct aml_layout *dest, struct aml_layout *src,
                                     aml_dma_operator op, void *op_arg);
int aml_dma_multiplex_request_wait(struct aml_dma_data *dma, struct aml_dma_request **req);
int aml_dma_multiplex_barrier(struct aml_dma_data *dma);
int aml_dma_multiplex_request_destroy(struct aml_dma_data *dma, struct aml_dma_request **req);

struct aml_dma_multiplex_copy_args {
	struct aml_dma_multiplex_data *m_data;
	struct aml_dma_multiplex_request **m_req;
	struct aml_dma_multiplex_request_args *args;
};

/* The default operator: sends the copy to the next dma by weight. */
int aml_dma_multiplex_copy_single(struct aml_layout *dst, const struct aml_layout *src,
                                  void *arg);

#ifdef __cplusplus
}
#endif

#endif
