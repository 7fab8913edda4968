/*
 * aml/dma/linux.h - the Linux DMA on ferry's CPU engine (libaml on ferry).
 * num_threads workers; 0 means no workers: the copies run on the caller's thread in wait and
 * barrier (AML's meaning). A large planned copy (NULL operator) is split across workers.
 */
#ifndef AML_DMA_LINUX_H
#define AML_DMA_LINUX_H

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

/* -AML_EINVAL: NULL dma; -AML_FAILURE: a worker thread could not start. */
int aml_dma_linux_create(struct aml_dma **dma, const size_t num_threads);
/* Waits for the dma's work, frees it, *dma = NULL. */
int aml_dma_linux_destroy(struct aml_dma **dma);
/* The ready Linux DMA (one worker per core): set by aml_init, NULL after aml_finalize. */
extern struct aml_dma *aml_dma_linux;
extern struct aml_dma_ops aml_dma_linux_ops;

int aml_dma_linux_request_create(struct aml_dma_data *data, struct aml_dma_request **req,
                                 struct aml_layout *dest, struct aml_layout *src,
                                 aml_dma_operator op, void *op_arg);
int aml_dma_linux_request_wait(struct aml_dma_data *dma, struct aml_dma_request **req);
int aml_dma_linux_barrier(struct aml_dma_data *dma);
int aml_dma_linux_request_destroy(struct aml_dma_data *dma, struct aml_dma_request **req);

/* Flat copy of element_size * dims[0] bytes between two 1-D dense layouts' pointers. */
int aml_dma_linux_copy_1D(struct aml_layout *dst, const struct aml_layout *src, void *arg);
/* dst, src: raw pointers cast to layouts; arg: the byte count cast to void *. */
int aml_dma_linux_memcpy_op(struct aml_layout *dst, const struct aml_layout *src, void *arg);
/* Element-wise copy through deref_native (any layout types); -AML_EINVAL on a shape mismatch. */
int aml_dma_linux_copy_generic(struct aml_layout *dst, const struct aml_layout *src, void *arg);

/*
 * AML's task form of a Linux DMA request, for programs that run dma operators through a task
 * scheduler of aml/utils/async.h themselves (libaml's own Linux DMA requests are ferry's and do
 * not use these structs). aml_dma_linux_exec_request is such a task's work: with req->lock
 * held, it calls op(dst, src, op_arg), stores its result in the int *output points to, and sets
 * AML_DMA_LINUX_REQUEST_FLAGS_DONE in req->flags (a NULL input, operator or request: the int
 * gets -AML_EINVAL).
 */
#define AML_DMA_LINUX_REQUEST_FLAGS_OWNED 0x1
#define AML_DMA_LINUX_REQUEST_FLAGS_DONE 0x2

struct aml_dma_linux_request;

struct aml_dma_linux_task_in {
	aml_dma_operator op;
	struct aml_layout *dst;
	struct aml_layout *src;
	void *op_arg;
	struct aml_dma_linux_request *req;
};

struct aml_dma_linux_request {
	struct aml_task task;
	struct aml_dma_linux_task_in task_in;
	int task_out;
	int flags;
	pthread_mutex_t lock;
};

void aml_dma_linux_exec_request(struct aml_task_in *input, struct aml_task_out *output);

#ifdef __cplusplus
}
#endif

#endif
