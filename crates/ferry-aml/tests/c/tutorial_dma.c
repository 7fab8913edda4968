/*
 * tutorial_dma.c - a program written the way AML's DMA tutorials and DMA tests are written
 * (only AML's headers and calls, AML's error handling style, asserts), nothing of ferry.
 * It builds unchanged against AML or against libaml (ferry): only the include and link flags
 * differ. It moves a small array with the default operator, 1 MiB through an area with the
 * memcpy operator, then 128 fire-and-forget copies completed by one barrier, and a
 * tile of a matrix through the ready Linux DMA.
 */
#include <aml.h>

#include <aml/area/linux.h>
#include <aml/dma/linux.h>
#include <aml/layout/dense.h>

#define OFFSET(p, off) ((void *)((intptr_t)(p) + (intptr_t)(off)))

static void check_or_die(int err, const char *what)
{
	if (err != AML_SUCCESS) {
		fprintf(stderr, "%s: %s\n", what, aml_strerror(err));
		exit(1);
	}
}

/* Step 1: one request with the default operator, waited explicitly. */
static void move_array(void)
{
	struct aml_dma *dma;
	struct aml_layout *from, *to;
	struct aml_dma_request *request;
	float in[16], out[16];
	size_t dims[1] = {16};
	int i;

	for (i = 0; i < 16; i++) {
		in[i] = (float)i * 0.25f;
		out[i] = -1.0f;
	}
	check_or_die(aml_dma_linux_create(&dma, 0), "aml_dma_linux_create");
	check_or_die(aml_layout_dense_create(&from, in, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(float),
	                                     1, dims, NULL, NULL),
	             "aml_layout_dense_create");
	check_or_die(aml_layout_dense_create(&to, out, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(float), 1,
	                                     dims, NULL, NULL),
	             "aml_layout_dense_create");
	check_or_die(aml_dma_async_copy_custom(dma, &request, to, from, NULL, NULL),
	             "aml_dma_async_copy_custom");
	check_or_die(aml_dma_wait(dma, &request), "aml_dma_wait");
	assert(memcmp(in, out, sizeof(in)) == 0);
	aml_layout_destroy(&from);
	aml_layout_destroy(&to);
	aml_dma_linux_destroy(&dma);
	printf("array moved\n");
}

/* Step 2: memory from an area, raw pointers and the memcpy operator, synchronous copies. */
static void through_area(struct aml_area *area, struct aml_dma *dma)
{
	const size_t size = 1UL << 20;
	void *host = malloc(size), *check = malloc(size);
	void *buf = aml_area_mmap(area, size, NULL);

	assert(host != NULL && check != NULL && buf != NULL);
	memset(host, 0x5a, size);
	memset(check, 0, size);
	assert(aml_dma_copy_custom(dma, (struct aml_layout *)buf, (struct aml_layout *)host,
	                           aml_dma_linux_memcpy_op, (void *)size) == AML_SUCCESS);
	assert(aml_dma_copy_custom(dma, (struct aml_layout *)check, (struct aml_layout *)buf,
	                           aml_dma_linux_memcpy_op, (void *)size) == AML_SUCCESS);
	assert(memcmp(host, check, size) == 0);
	aml_area_munmap(area, buf, size);
	free(host);
	free(check);
	printf("area round trip done\n");
}

/* Step 3: many requests nobody waits for, then one barrier. */
static void many_then_barrier(struct aml_area *area, struct aml_dma *dma)
{
	enum { N = 128 };
	const size_t chunk = 1024;
	char *host = (char *)malloc(N * chunk), *back = (char *)malloc(N * chunk);
	void *bufs[N];
	size_t i;

	assert(host != NULL && back != NULL);
	memset(back, 0, N * chunk);
	for (i = 0; i < N; i++) {
		memset(host + i * chunk, (int)(i + 1), chunk);
		bufs[i] = aml_area_mmap(area, chunk, NULL);
		assert(bufs[i] != NULL);
	}
	for (i = 0; i < N; i++)
		assert(aml_dma_async_copy_custom(dma, NULL, (struct aml_layout *)bufs[i],
		                                 (struct aml_layout *)OFFSET(host, i * chunk),
		                                 aml_dma_linux_memcpy_op,
		                                 (void *)chunk) == AML_SUCCESS);
	assert(aml_dma_barrier(dma) == AML_SUCCESS);
	for (i = 0; i < N; i++)
		assert(aml_dma_async_copy_custom(dma, NULL, (struct aml_layout *)OFFSET(back, i * chunk),
		                                 (struct aml_layout *)bufs[i], aml_dma_linux_memcpy_op,
		                                 (void *)chunk) == AML_SUCCESS);
	assert(aml_dma_barrier(dma) == AML_SUCCESS);
	assert(memcmp(host, back, N * chunk) == 0);
	for (i = 0; i < N; i++)
		aml_area_munmap(area, bufs[i], chunk);
	free(host);
	free(back);
	printf("%d requests completed by one barrier\n", N);
}

/* Step 4: a tile of a row-major matrix, through a slice, into a dense tile. */
static void tile(struct aml_dma *dma)
{
	enum { ROWS = 64, COLS = 48 };
	double *m = (double *)malloc(ROWS * COLS * sizeof(double)), t[10 * 12];
	size_t mdims[2] = {ROWS, COLS}, tdims[2] = {10, 12}, offsets[2] = {20, 30};
	struct aml_layout *whole, *part, *dense;
	size_t r, c;

	assert(m != NULL);
	for (r = 0; r < ROWS * COLS; r++)
		m[r] = (double)r;
	check_or_die(aml_layout_dense_create(&whole, m, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 2,
	                                     mdims, NULL, NULL),
	             "aml_layout_dense_create");
	check_or_die(aml_layout_slice(whole, &part, offsets, tdims, NULL), "aml_layout_slice");
	check_or_die(aml_layout_dense_create(&dense, t, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 2,
	                                     tdims, NULL, NULL),
	             "aml_layout_dense_create");
	check_or_die(aml_dma_copy(dma, dense, part), "aml_dma_copy");
	for (r = 0; r < 10; r++)
		for (c = 0; c < 12; c++)
			assert(t[r * 12 + c] == m[(20 + r) * COLS + 30 + c]);
	aml_layout_destroy(&whole);
	aml_layout_destroy(&part);
	aml_layout_destroy(&dense);
	free(m);
	printf("tile copied\n");
}

int main(int argc, char **argv)
{
	assert(aml_init(&argc, &argv) == AML_SUCCESS);
	move_array();
	through_area(&aml_area_linux, aml_dma_linux);
	many_then_barrier(&aml_area_linux, aml_dma_linux);
	tile(aml_dma_linux);
	aml_finalize();
	printf("tutorial_dma: OK\n");
	return 0;
}
