/* aml/area/cuda.h - CUDA memory areas (libaml on ferry); without CUDA aml_area_cuda_create
 * returns -AML_FAILURE (as AML), mmap -AML_ENOTSUP. */
#ifndef AML_AREA_CUDA_H
#define AML_AREA_CUDA_H

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AML_AREA_CUDA_FLAG_DEFAULT 0              /* device memory */
#define AML_AREA_CUDA_FLAG_ALLOC_HOST (1 << 0)    /* page-locked (pinned) host memory */
#define AML_AREA_CUDA_FLAG_ALLOC_UNIFIED (1 << 1) /* managed memory (HOST, MAPPED ignored) */
#define AML_AREA_CUDA_FLAG_ALLOC_MAPPED (1 << 2)  /* pinned host memory mapped in the device;
                                                     without ALLOC_HOST: registers opts->ptr */
#define AML_AREA_CUDA_FLAG_ALLOC_GLOBAL (1 << 3)  /* portable / attached to every stream */

struct aml_area_cuda_mmap_options {
	int device; /* > 0: this device, else the area's */
	void *ptr;  /* memory to register (ALLOC_MAPPED without ALLOC_HOST) */
};

extern struct aml_area_ops aml_area_cuda_ops;
extern struct aml_area aml_area_cuda;         /* device memory, current device */
extern struct aml_area aml_area_cuda_unified; /* managed memory */

struct aml_area_cuda_data {
	int flags;
	int device;
};

/* device -1: the current one. -AML_EINVAL: NULL area, no such device; -AML_FAILURE: no CUDA. */
int aml_area_cuda_create(struct aml_area **area, const int device, const int flags);
void aml_area_cuda_destroy(struct aml_area **area);
void *aml_area_cuda_mmap(const struct aml_area_data *area_data, size_t size,
                         struct aml_area_mmap_options *options);
int aml_area_cuda_munmap(const struct aml_area_data *area_data, void *ptr, const size_t size);

/* Prints the area as AML does ("<prefix>: area-cuda: <data>", device, flags, mapped, global). */
int aml_area_cuda_fprintf(const struct aml_area_data *data, FILE *stream, const char *prefix);
#ifdef __cplusplus
}
#endif

#endif
