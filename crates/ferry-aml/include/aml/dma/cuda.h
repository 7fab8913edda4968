/*
 * aml/dma/cuda.h - the CUDA DMA on ferry's CUDA engine (libaml on ferry).
 * Builds without CUDA headers; without a CUDA driver aml_dma_cuda_create returns -AML_FAILURE
 * (as AML) and the other functions -AML_ENOTSUP.
 * Unlike AML: waiting for one request waits for that request only; device to device works
 * through aml_dma_cuda_memcpy_op; the NULL operator is ferry's planned layout copy (host or
 * device told from the pointers).
 */
#ifndef AML_DMA_CUDA_H
#define AML_DMA_CUDA_H

#include <aml.h>

#if defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda.h>
#include <cuda_runtime.h>
#define AML_FERRY_HAVE_CUDA_RUNTIME_H 1
#endif
#endif

#ifndef AML_FERRY_HAVE_CUDA_RUNTIME_H
/* The two runtime types this header needs, with the runtime's values. */
typedef struct CUstream_st *cudaStream_t;
enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4
};
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define AML_DMA_CUDA_REQUEST_STATUS_NONE 0
#define AML_DMA_CUDA_REQUEST_STATUS_PENDING 1
#define AML_DMA_CUDA_REQUEST_STATUS_DONE 2

struct aml_dma_cuda_request {
	int status;
	pthread_mutex_t lock;
};

/* -AML_EINVAL: NULL data, dest or src; the operator's error; -AML_ENOTSUP without CUDA. */
int aml_dma_cuda_request_create(struct aml_dma_data *data, struct aml_dma_request **req,
                                struct aml_layout *dest, struct aml_layout *src,
                                aml_dma_operator op, void *op_arg);
/* Waits for that request only. -AML_EINVAL: NULL or foreign request. */
int aml_dma_cuda_request_wait(struct aml_dma_data *dma, struct aml_dma_request **req);
int aml_dma_cuda_barrier(struct aml_dma_data *data);
int aml_dma_cuda_request_destroy(struct aml_dma_data *dma, struct aml_dma_request **req);

/* The stream operators enqueue on and the copy kind (private fields follow). */
struct aml_dma_cuda_data {
	cudaStream_t stream;
	enum cudaMemcpyKind kind;
};

extern struct aml_dma_ops aml_dma_cuda_ops;
/* Stream 0, cudaMemcpyDefault; its engine is made on first use on the current device. */
extern struct aml_dma aml_dma_cuda;

/* A DMA on the current device. -AML_EINVAL: NULL dma, unknown kind; -AML_FAILURE: no CUDA
 * (as AML) or a driver call failed. */
int aml_dma_cuda_create(struct aml_dma **dma, const enum cudaMemcpyKind kind);
int aml_dma_cuda_destroy(struct aml_dma **dma);

#define AML_DMA_CUDA_DEVICE_PAIR(src, dst) (void *)(((intptr_t)(dst) << 32) | ((intptr_t)(src)))
#define AML_DMA_CUDA_DEVICE_FROM_PAIR(pair, src, dst)                                      \
	src = dst = 0;                                                                       \
	src = ((intptr_t)(pair)&0xffffffff);                                                 \
	dst = ((intptr_t)(pair) >> 32);

/* What an operator gets as arg on a CUDA DMA; valid during the call only. */
struct aml_dma_cuda_op_arg {
	struct aml_dma_cuda_data *data;
	void *op_arg;
};

/* Flat copy of element_size * dims[0] bytes of 1-D dense layouts; on a
 * cudaMemcpyDeviceToDevice DMA op_arg is AML_DMA_CUDA_DEVICE_PAIR(src, dst) (a peer copy). */
int aml_dma_cuda_copy_1D(struct aml_layout *dst, const struct aml_layout *src, void *arg);
/* dst, src: raw pointers cast to layouts; op_arg: the byte count cast to void *. Any
 * direction, device to device included. */
int aml_dma_cuda_memcpy_op(struct aml_layout *dst, const struct aml_layout *src, void *arg);

#ifdef __cplusplus
}
#endif

#endif
