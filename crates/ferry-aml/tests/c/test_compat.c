/*
 * test_compat.c - where libaml once differed from AML and now behaves as AML: a dense layout
 * with strides and a NULL pitch, aml_area_munmap of NULL or 0 bytes, aml_area_mmap of 0 bytes,
 * aml_errno positive, the CUDA constructors without a GPU, the printers' format.
 * Common subset of C and C++; prints "test_compat: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/area/cuda.h>
#include <aml/area/linux.h>
#include <aml/dma/cuda.h>
#include <aml/dma/linux.h>
#include <aml/layout/dense.h>

#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__,    \
			        __LINE__, #c, ferry_last_error_message());                         \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

/* Everything `print` wrote, as one string (static buffer). */
static const char *printed(int (*print)(FILE *, const void *), const void *what)
{
	static char buf[4096];
	FILE *f = tmpfile();
	size_t n;
	CHECK(f != NULL);
	CHECK(print(f, what) == AML_SUCCESS);
	rewind(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

static int print_layout(FILE *f, const void *l)
{
	return aml_layout_fprintf(f, "p", (const struct aml_layout *)l);
}

static int print_dma(FILE *f, const void *d)
{
	return aml_dma_fprintf(f, "p", (const struct aml_dma *)d);
}

int main(void)
{
	int x[64];
	size_t dims[2] = {2, 3}, stride[2] = {2, 2}, coords[2] = {1, 2};
	struct aml_layout *l;
	struct aml_dma *d;
	struct aml_area *area;
	char expect[512];
	const char *s;

	/* 1. strides and a NULL pitch: AML's default pitch (the dims). */
	CHECK(aml_layout_dense_create(&l, x, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(int), 2, dims,
	                              stride, NULL) == AML_SUCCESS);
	/* element (1, 2) at 1 * 2 + 2 * (2 * 2) ints, as AML computes it */
	CHECK(aml_layout_deref(l, coords) == (void *)&x[1 * 2 + 2 * 2 * 2]);
	/* 5. AML's format: header, ptr, ndims, one line per dim (dim, stride, cpitch). */
	s = printed(print_layout, l);
	snprintf(expect, sizeof(expect),
	         "p: layout-dense: %p: column-major\np: ptr: %p\np: ndims: 2\n"
	         "p: %16zu: %16zu %16zu %16zu\np: %16zu: %16zu %16zu %16zu\n",
	         (void *)l->data, (void *)x, (size_t)0, (size_t)2, (size_t)2, sizeof(int),
	         (size_t)1, (size_t)3, (size_t)2, 2 * sizeof(int));
	CHECK(strcmp(s, expect) == 0);
	aml_layout_destroy(&l);

	/* 2. munmap of NULL or 0 bytes is a no-op; mmap of 0 bytes is NULL, aml_errno untouched */
	CHECK(aml_area_munmap(&aml_area_linux, NULL, 0) == AML_SUCCESS);
	CHECK(aml_area_munmap(&aml_area_linux, NULL, 8) == AML_SUCCESS);
	aml_errno = AML_SUCCESS;
	CHECK(aml_area_mmap(&aml_area_linux, 0, NULL) == NULL && aml_errno == AML_SUCCESS);
	/* 3. aml_errno holds a positive value */
	CHECK(aml_area_mmap(NULL, 8, NULL) == NULL && aml_errno == AML_EINVAL);
	CHECK(strcmp(aml_strerror(aml_errno), "Invalid argument") == 0);

	/* 4. without a GPU, the constructors fail as AML's; the ready DMA's barrier succeeds */
	if (!aml_support_backends(AML_BACKEND_CUDA)) {
		CHECK(aml_dma_cuda_create(&d, cudaMemcpyHostToDevice) == -AML_FAILURE);
		CHECK(aml_area_cuda_create(&area, 0, AML_AREA_CUDA_FLAG_DEFAULT) == -AML_FAILURE);
		CHECK(aml_dma_barrier(&aml_dma_cuda) == AML_SUCCESS);
	}

	/* 5. the Linux DMA prints as AML's printers do: "<prefix>: dma-linux: <data>" first */
	CHECK(aml_dma_linux_create(&d, 1) == AML_SUCCESS);
	s = printed(print_dma, d);
	snprintf(expect, sizeof(expect), "p: dma-linux: %p\n", (void *)d->data);
	CHECK(strncmp(s, expect, strlen(expect)) == 0);
	CHECK(aml_dma_linux_destroy(&d) == AML_SUCCESS);

	printf("test_compat: OK\n");
	return 0;
}
