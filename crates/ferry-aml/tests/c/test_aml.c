/*
 * test_aml.c - libaml (ferry) through AML's API: every function of the Linux and multiplex
 * DMAs, layouts, areas, errors; the CUDA DMA where a CUDA driver and device are present
 * (-AML_ENOTSUP checked elsewhere). Written in the common subset of C and C++: CI builds it
 * with cc and with c++ against the installed headers (pkg-config aml) and runs both.
 * Prints one line per part and "test_aml: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/area/cuda.h>
#include <aml/area/linux.h>
#include <aml/dma/cuda.h>
#include <aml/dma/linux.h>
#include <aml/dma/multiplex.h>
#include <aml/layout/dense.h>
#include <aml/layout/native.h>

#include <time.h>

static int failures = 0;
#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__,    \
			        __LINE__, #c, ferry_last_error_message());                         \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

/* ------------------------------------------------------------ helpers */

/* A 3-D array of doubles d0 x d1 x d2 (row-major) filled with its index + base. */
static double *grid(size_t n, double base)
{
	double *p = (double *)malloc(n * sizeof(double));
	CHECK(p != NULL);
	for (size_t i = 0; i < n; i++)
		p[i] = base + (double)i;
	return p;
}

/* Operator: element-wise copy through aml_layout_deref_native (any dense layouts). */
static int deref_copy_op(struct aml_layout *dst, const struct aml_layout *src, void *arg)
{
	size_t n = aml_layout_ndims(src), c[8] = {0}, d[8];
	(void)arg;
	if (n > 8 || aml_layout_dims_native(src, d) != AML_SUCCESS)
		return -AML_EINVAL;
	for (;;) {
		memcpy(aml_layout_deref_native(dst, c), aml_layout_deref_native(src, c),
		       aml_layout_element_size(src));
		size_t i = 0;
		while (i < n && ++c[i] == d[i])
			c[i++] = 0;
		if (i == n)
			return AML_SUCCESS;
	}
}

static int failing_op(struct aml_layout *dst, const struct aml_layout *src, void *arg)
{
	(void)dst;
	(void)src;
	(void)arg;
	return -AML_EDOM;
}

static void sleep_ms(long ms)
{
	struct timespec t;
	t.tv_sec = ms / 1000;
	t.tv_nsec = (ms % 1000) * 1000000L;
	nanosleep(&t, NULL);
}

/* Operator: sleeps *(long *)arg ms, then memcpy of the 1-D layouts. */
static int slow_op(struct aml_layout *dst, const struct aml_layout *src, void *arg)
{
	sleep_ms(*(long *)arg);
	return aml_dma_linux_copy_1D(dst, src, NULL);
}

/* Operator: counts its calls in *(int *)arg (atomically), then the generic copy. */
static int counting_op(struct aml_layout *dst, const struct aml_layout *src, void *arg)
{
	__sync_fetch_and_add((int *)arg, 1);
	return aml_dma_linux_copy_generic(dst, src, NULL);
}

/* ------------------------------------------------------------ errors, library */

static void test_errors(void)
{
	CHECK(AML_SUCCESS == 0 && AML_FAILURE == 1 && AML_ENOMEM == 2 && AML_EINVAL == 3);
	CHECK(AML_EDOM == 4 && AML_ENOTSUP == 5 && AML_EBUSY == 6 && AML_EPERM == 7);
	CHECK(strcmp(aml_strerror(-AML_EINVAL), "Invalid argument") == 0);
	CHECK(strcmp(aml_strerror(AML_EINVAL), "Invalid argument") == 0);
	CHECK(strcmp(aml_strerror(99), "Unknown error") == 0);
	CHECK(aml_support_backends(0) == 1);
	CHECK(aml_support_backends(AML_BACKEND_LIBNUMA) == 1 && AML_HAVE_BACKEND_LIBNUMA == 1);
	CHECK(aml_support_backends(AML_BACKEND_HWLOC) == 0);
	CHECK(aml_layout_ndims(NULL) == 0 && aml_errno == AML_EINVAL); /* positive, as AML */
	aml_errno = 0;
	aml_perror("test_aml perror");
	printf("errors: OK\n");
}

/* ------------------------------------------------------------ layouts */

static void test_layouts(void)
{
	double a[4 * 6 * 5];
	size_t dims[3] = {4, 6, 5}, got[3], c[3];
	struct aml_layout *row, *col, *s, *r;

	CHECK(AML_LAYOUT_ORDER_ROW_MAJOR == 1 && AML_LAYOUT_ORDER_C == 1);
	CHECK(AML_LAYOUT_ORDER_COLUMN_MAJOR == 0 && AML_LAYOUT_ORDER_FORTRAN == 0);
	CHECK(aml_layout_dense_create(&row, a, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 3,
	                              dims, NULL, NULL) == AML_SUCCESS);
	CHECK(aml_layout_rawptr(row) == (void *)a);
	CHECK(aml_layout_ndims(row) == 3 && aml_layout_element_size(row) == sizeof(double));
	CHECK(AML_LAYOUT_ORDER(aml_layout_order(row)) == AML_LAYOUT_ORDER_ROW_MAJOR);
	CHECK(aml_layout_dims(row, got) == AML_SUCCESS && got[0] == 4 && got[2] == 5);
	CHECK(aml_layout_dims_native(row, got) == AML_SUCCESS && got[0] == 5 && got[2] == 4);
	c[0] = 1;
	c[1] = 2;
	c[2] = 3;
	CHECK(aml_layout_deref(row, c) == (void *)&a[1 * 30 + 2 * 5 + 3]);
	CHECK(aml_layout_deref_safe(row, c) == (void *)&a[43]);
	c[2] = 5;
	CHECK(aml_layout_deref_safe(row, c) == NULL && aml_errno == AML_EINVAL);

	CHECK(aml_layout_dense_create(&col, a, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(double), 3,
	                              dims, NULL, NULL) == AML_SUCCESS);
	CHECK(aml_layout_order(col) == AML_LAYOUT_ORDER_COLUMN_MAJOR);
	c[0] = 1;
	c[1] = 2;
	c[2] = 3;
	CHECK(aml_layout_deref(col, c) == (void *)&a[1 + 2 * 4 + 3 * 24]);

	/* slice rows 1..2, cols every other from 1, all of the last dim */
	{
		size_t off[3] = {1, 1, 0}, sd[3] = {2, 3, 5}, st[3] = {1, 2, 1};
		CHECK(aml_layout_slice(row, &s, off, sd, st) == AML_SUCCESS);
		c[0] = 1;
		c[1] = 2;
		c[2] = 4;
		CHECK(aml_layout_deref(s, c) == (void *)&a[2 * 30 + 5 * 5 + 4]);
		sd[1] = 4; /* 1 + 3 * 2 = 7 > 5 */
		CHECK(aml_layout_slice(row, &r, off, sd, st) == -AML_EINVAL);
		aml_layout_destroy(&s);
		CHECK(s == NULL);
	}
	/* reshape 4x6x5 -> 24x5 -> 120, and a reshape that needs a copy */
	{
		size_t d2[2] = {24, 5}, d1[1] = {120}, bad[2] = {7, 3};
		CHECK(aml_layout_reshape(row, &r, 2, d2) == AML_SUCCESS);
		c[0] = 23;
		c[1] = 4;
		CHECK(aml_layout_deref(r, c) == (void *)&a[119]);
		aml_layout_destroy(&r);
		CHECK(aml_layout_reshape(col, &r, 1, d1) == AML_SUCCESS);
		c[0] = 77;
		CHECK(aml_layout_deref(r, c) == (void *)&a[77]);
		aml_layout_destroy(&r);
		CHECK(aml_layout_reshape(row, &r, 2, bad) == -AML_EINVAL);
	}
	/* element strides and pitch: every 2nd double of rows of pitch 16 */
	{
		double big[8 * 16];
		size_t d[2] = {8, 5}, st[2] = {1, 2}, pitch[2] = {8, 16};
		CHECK(aml_layout_dense_create(&s, big, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 2,
		                              d, st, pitch) == AML_SUCCESS);
		c[0] = 3;
		c[1] = 4;
		CHECK(aml_layout_deref(s, c) == (void *)&big[3 * 16 + 8]);
		CHECK(aml_layout_duplicate(s, &r, a) == AML_SUCCESS && aml_layout_rawptr(r) == a);
		aml_layout_destroy(&r);
		aml_layout_destroy(&s);
	}
	/* bad arguments */
	CHECK(aml_layout_dense_create(NULL, a, 0, 8, 3, dims, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_layout_dense_create(&s, NULL, 0, 8, 3, dims, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_layout_dense_create(&s, a, 0, 0, 3, dims, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_layout_dense_create(&s, a, 0, 8, 0, dims, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_layout_dense_create(&s, a, 0, 8, 3, NULL, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_layout_dense_create(&s, a, 2, 8, 3, dims, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_layout_dims(NULL, got) == -AML_EINVAL && aml_layout_dims(row, NULL) == -AML_EINVAL);
	CHECK(aml_layout_rawptr(NULL) == NULL && aml_errno == AML_EINVAL);
	CHECK(aml_layout_order(NULL) == -AML_EINVAL);
	CHECK(aml_layout_reshape(NULL, &r, 1, dims) == -AML_EINVAL);
	CHECK(aml_layout_slice(NULL, &r, NULL, dims, NULL) == -AML_EINVAL);
	aml_layout_destroy(NULL);
	aml_layout_fprintf(stdout, "layout", row);
	aml_layout_destroy(&row);
	free(col); /* one malloc block, as AML */
	printf("layouts: OK\n");
}

/* ------------------------------------------------------------ Linux DMA */

/* A strided 3-D copy in `order`: a 3 x 4 x 5 box at (1, 2, 3) of a 6 x 9 x 11 array into a
 * dense 3 x 4 x 5 array, through dma (sync or async with a request, or with NULL). */
static void strided_copy(struct aml_dma *dma, int order, int mode)
{
	size_t big[3] = {6, 9, 11}, box[3] = {3, 4, 5}, off[3] = {1, 2, 3};
	double *src = grid(6 * 9 * 11, 0.5), dst[60];
	struct aml_layout *whole, *sub, *dense;
	struct aml_dma_request *req = NULL;
	size_t i, j, k;

	memset(dst, 0, sizeof dst);
	CHECK(aml_layout_dense_create(&whole, src, order, sizeof(double), 3, big, NULL, NULL) ==
	      AML_SUCCESS);
	CHECK(aml_layout_slice(whole, &sub, off, box, NULL) == AML_SUCCESS);
	CHECK(aml_layout_dense_create(&dense, dst, order, sizeof(double), 3, box, NULL, NULL) ==
	      AML_SUCCESS);
	if (mode == 0) {
		CHECK(aml_dma_copy(dma, dense, sub) == AML_SUCCESS);
	} else if (mode == 1) {
		CHECK(aml_dma_async_copy(dma, &req, dense, sub) == AML_SUCCESS && req != NULL);
		aml_layout_destroy(&sub); /* the NULL operator read the layouts at creation */
		CHECK(aml_dma_wait(dma, &req) == AML_SUCCESS && req == NULL);
	} else {
		CHECK(aml_dma_async_copy(dma, NULL, dense, sub) == AML_SUCCESS);
		CHECK(aml_dma_barrier(dma) == AML_SUCCESS);
	}
	for (i = 0; i < 3; i++)
		for (j = 0; j < 4; j++)
			for (k = 0; k < 5; k++) {
				/* row-major: index (i,j,k) of dims (a,b,c) is i*b*c + j*c + k;
				 * column-major: i + j*a + k*a*b */
				double want, got;
				if (order == AML_LAYOUT_ORDER_ROW_MAJOR) {
					want = 0.5 + (double)((1 + i) * 99 + (2 + j) * 11 + (3 + k));
					got = dst[i * 20 + j * 5 + k];
				} else {
					want = 0.5 + (double)((1 + i) + (2 + j) * 6 + (3 + k) * 54);
					got = dst[i + j * 3 + k * 12];
				}
				CHECK(got == want);
			}
	aml_layout_destroy(&whole);
	aml_layout_destroy(&sub);
	aml_layout_destroy(&dense);
	free(src);
}

struct barrier_job {
	struct aml_dma *dma;
	double *src, *dst;
	size_t n;
	int rc;
};

static void *barrier_thread(void *p)
{
	struct barrier_job *j = (struct barrier_job *)p;
	size_t d = j->n;
	struct aml_layout *a, *b;
	aml_layout_dense_create(&a, j->dst, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 1, &d, NULL,
	                        NULL);
	aml_layout_dense_create(&b, j->src, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 1, &d, NULL,
	                        NULL);
	j->rc = aml_dma_async_copy_custom(j->dma, NULL, a, b, NULL, NULL);
	aml_layout_destroy(&a);
	aml_layout_destroy(&b);
	if (j->rc == AML_SUCCESS)
		j->rc = aml_dma_barrier(j->dma);
	return NULL;
}

static void test_linux(size_t threads)
{
	struct aml_dma *dma, *other;
	struct aml_dma_request *req, *req2;
	struct aml_layout *a, *b, *c;
	size_t n = 1000, big = 1 << 20;
	double *x = grid(n, 1), *y = grid(n, 0);
	long ms = 50;
	int order, mode;

	CHECK(aml_dma_linux_create(&dma, threads) == AML_SUCCESS);
	CHECK(aml_dma_linux_create(&other, 1) == AML_SUCCESS);
	for (order = 0; order < 2; order++)
		for (mode = 0; mode < 3; mode++)
			strided_copy(dma, order, mode);

	CHECK(aml_layout_dense_create(&a, y, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(double), 1, &n,
	                              NULL, NULL) == AML_SUCCESS);
	CHECK(aml_layout_dense_create(&b, x, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(double), 1, &n,
	                              NULL, NULL) == AML_SUCCESS);
	/* a custom operator on a worker, sync */
	CHECK(aml_dma_copy_custom(dma, a, b, deref_copy_op, NULL) == AML_SUCCESS);
	CHECK(memcmp(x, y, n * sizeof(double)) == 0);
	/* AML's operators */
	memset(y, 0, n * sizeof(double));
	CHECK(aml_dma_copy_custom(dma, a, b, aml_dma_linux_copy_1D, NULL) == AML_SUCCESS);
	CHECK(memcmp(x, y, n * sizeof(double)) == 0);
	memset(y, 0, n * sizeof(double));
	CHECK(aml_dma_copy_custom(dma, (struct aml_layout *)y, (struct aml_layout *)x,
	                          aml_dma_linux_memcpy_op, (void *)(n * sizeof(double))) ==
	      AML_SUCCESS);
	CHECK(memcmp(x, y, n * sizeof(double)) == 0);
	memset(y, 0, n * sizeof(double));
	CHECK(aml_dma_copy_custom(dma, a, b, aml_dma_linux_copy_generic, NULL) == AML_SUCCESS);
	CHECK(memcmp(x, y, n * sizeof(double)) == 0);
	/* a failing operator: its value is the request's result, by wait and by barrier */
	CHECK(aml_dma_async_copy_custom(dma, &req, a, b, failing_op, NULL) == AML_SUCCESS);
	CHECK(aml_dma_wait(dma, &req) == -AML_EDOM && req == NULL);
	CHECK(aml_dma_async_copy_custom(dma, NULL, a, b, failing_op, NULL) == AML_SUCCESS);
	CHECK(aml_dma_barrier(dma) == -AML_EDOM);
	CHECK(aml_dma_barrier(dma) == AML_SUCCESS);
	/* a slow operator: wait waits for it; waiting for a quick one does not */
	memset(y, 0, n * sizeof(double));
	CHECK(aml_dma_async_copy_custom(dma, &req, a, b, slow_op, &ms) == AML_SUCCESS);
	CHECK(aml_dma_wait(dma, &req) == AML_SUCCESS);
	CHECK(memcmp(x, y, n * sizeof(double)) == 0);
	/* cancel: releases without the result */
	CHECK(aml_dma_async_copy_custom(dma, &req, a, b, failing_op, NULL) == AML_SUCCESS);
	CHECK(aml_dma_cancel(dma, &req) == AML_SUCCESS && req == NULL);
	CHECK(aml_dma_barrier(dma) == -AML_EDOM); /* the cancelled failure goes to the barrier */
	/* the per-dma entry points */
	CHECK(aml_dma_linux_request_create(dma->data, &req, a, b, NULL, NULL) == AML_SUCCESS);
	CHECK(aml_dma_linux_request_wait(dma->data, &req) == AML_SUCCESS);
	CHECK(aml_dma_linux_request_create(dma->data, &req, a, b, NULL, NULL) == AML_SUCCESS);
	CHECK(aml_dma_linux_request_destroy(dma->data, &req) == AML_SUCCESS);
	CHECK(aml_dma_linux_barrier(dma->data) == AML_SUCCESS);
	CHECK(dma->ops == &aml_dma_linux_ops);
	aml_dma_fprintf(stdout, "dma: ", dma);

	/* bad arguments */
	CHECK(aml_dma_copy(NULL, a, b) == -AML_EINVAL);
	CHECK(aml_dma_copy(dma, NULL, b) == -AML_EINVAL);
	CHECK(aml_dma_copy(dma, a, NULL) == -AML_EINVAL);
	CHECK(aml_dma_async_copy(NULL, &req, a, b) == -AML_EINVAL);
	CHECK(aml_dma_wait(NULL, &req) == -AML_EINVAL);
	CHECK(aml_dma_wait(dma, NULL) == -AML_EINVAL);
	req = NULL;
	CHECK(aml_dma_wait(dma, &req) == -AML_EINVAL);
	CHECK(aml_dma_cancel(dma, NULL) == -AML_EINVAL);
	CHECK(aml_dma_barrier(NULL) == -AML_EINVAL);
	CHECK(aml_dma_linux_create(NULL, 1) == -AML_EINVAL);
	CHECK(aml_dma_linux_barrier(NULL) == -AML_EINVAL);
	CHECK(aml_dma_async_copy(other, &req2, a, b) == AML_SUCCESS);
	CHECK(aml_dma_wait(dma, &req2) == -AML_EINVAL); /* a request of another dma */
	CHECK(aml_dma_wait(other, &req2) == AML_SUCCESS);
	{
		size_t m = n - 1;
		float f[4];
		size_t four = 4;
		CHECK(aml_layout_dense_create(&c, y, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(double), 1,
		                              &m, NULL, NULL) == AML_SUCCESS);
		CHECK(aml_dma_copy(dma, c, b) == -AML_EINVAL); /* shapes differ */
		aml_layout_destroy(&c);
		CHECK(aml_layout_dense_create(&c, f, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(float), 1,
		                              &four, NULL, NULL) == AML_SUCCESS);
		CHECK(aml_dma_copy(dma, c, b) == -AML_EINVAL); /* element sizes differ */
		aml_layout_destroy(&c);
	}
	/* even columns into odd columns of the same matrix: the layouts' spans overlap (ferry's
	 * planner refuses in-place copies; the generic copy does it, as AML) */
	{
		double mtx[8 * 10];
		size_t md[2] = {8, 10}, half[2] = {8, 5}, st[2] = {1, 2}, o0[2] = {0, 0}, o1[2] = {0, 1};
		struct aml_layout *whole, *even, *odd;
		size_t k;
		for (k = 0; k < 80; k++)
			mtx[k] = (double)k;
		CHECK(aml_layout_dense_create(&whole, mtx, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 2,
		                              md, NULL, NULL) == AML_SUCCESS);
		CHECK(aml_layout_slice(whole, &even, o0, half, st) == AML_SUCCESS);
		CHECK(aml_layout_slice(whole, &odd, o1, half, st) == AML_SUCCESS);
		CHECK(aml_dma_copy(dma, odd, even) == AML_SUCCESS);
		for (k = 0; k < 80; k++)
			CHECK(mtx[k] == (double)(k - k % 2));
		aml_layout_destroy(&whole);
		aml_layout_destroy(&even);
		aml_layout_destroy(&odd);
	}
	/* barriers from several threads at once */
	{
		pthread_t t[4];
		struct barrier_job j[4];
		int i;
		for (i = 0; i < 4; i++) {
			j[i].dma = dma;
			j[i].n = big / 4;
			j[i].src = grid(j[i].n, (double)i * 1000);
			j[i].dst = grid(j[i].n, -1);
			CHECK(pthread_create(&t[i], NULL, barrier_thread, &j[i]) == 0);
		}
		for (i = 0; i < 4; i++) {
			CHECK(pthread_join(t[i], NULL) == 0);
			CHECK(j[i].rc == AML_SUCCESS);
			CHECK(memcmp(j[i].src, j[i].dst, j[i].n * sizeof(double)) == 0);
			free(j[i].src);
			free(j[i].dst);
		}
	}
	aml_layout_destroy(&a);
	aml_layout_destroy(&b);
	CHECK(aml_dma_linux_destroy(&dma) == AML_SUCCESS && dma == NULL);
	CHECK(aml_dma_linux_destroy(&other) == AML_SUCCESS);
	free(x);
	free(y);
	printf("linux dma (%zu threads): OK\n", threads);
}

/* More dims than ferry's layouts hold (16): 20 dims of 2, every other element of the source
 * (AML has no limit; the planner merges them into one strided run). */
static void test_many_dims(void)
{
	size_t dims[20], st[20], i, n = 1 << 20;
	double *src = grid(2 * n, 0), *dst = grid(n, -1);
	struct aml_layout *s, *d;
	for (i = 0; i < 20; i++) {
		dims[i] = 2;
		st[i] = 1;
	}
	st[19] = 2; /* row-major: the last dim is innermost; pitch NULL: its dim, so pitch 2*2 */
	{
		size_t pitch[20];
		for (i = 0; i < 20; i++)
			pitch[i] = 2;
		pitch[19] = 4;
		CHECK(aml_layout_dense_create(&s, src, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 20,
		                              dims, st, pitch) == AML_SUCCESS);
	}
	CHECK(aml_layout_dense_create(&d, dst, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 20, dims,
	                              NULL, NULL) == AML_SUCCESS);
	CHECK(aml_layout_ndims(s) == 20);
	CHECK(aml_dma_copy(aml_dma_linux, d, s) == AML_SUCCESS);
	for (i = 0; i < n; i++)
		CHECK(dst[i] == (double)(2 * i));
	aml_layout_destroy(&s);
	aml_layout_destroy(&d);
	free(src);
	free(dst);
	printf("20-dim layouts: OK\n");
}

/* ------------------------------------------------------------ multiplex */

static void test_multiplex(void)
{
	struct aml_dma *a, *b, *m;
	const struct aml_dma *list[3];
	size_t w[3] = {2, 0, 1}, zero[2] = {0, 0}, n = 4096, i;
	int count[3] = {0, 0, 0};
	aml_dma_operator ops[3];
	void *args[3];
	struct aml_dma_multiplex_request_args rargs;
	struct aml_dma_request *req;
	double *x = grid(n, 3), *y = grid(n, 0);
	struct aml_layout *lx, *ly;

	CHECK(aml_dma_linux_create(&a, 2) == AML_SUCCESS);
	CHECK(aml_dma_linux_create(&b, 0) == AML_SUCCESS);
	list[0] = a;
	list[1] = b;
	list[2] = a; /* the same dma twice */
	CHECK(aml_dma_multiplex_create(&m, 3, list, w) == AML_SUCCESS);
	CHECK(aml_layout_dense_create(&lx, x, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 1, &n,
	                              NULL, NULL) == AML_SUCCESS);
	CHECK(aml_layout_dense_create(&ly, y, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(double), 1, &n,
	                              NULL, NULL) == AML_SUCCESS);
	/* NULL request args: each dma's default (the planned copy) */
	CHECK(aml_dma_copy(m, ly, lx) == AML_SUCCESS);
	CHECK(memcmp(x, y, n * sizeof(double)) == 0);
	/* a different operator per dma, counted: weights 2, 0, 1 */
	for (i = 0; i < 3; i++) {
		ops[i] = counting_op;
		args[i] = &count[i];
	}
	rargs.ops = ops;
	rargs.op_args = args;
	for (i = 0; i < 30; i++) {
		memset(y, 0, n * sizeof(double));
		if (i % 3 == 0) {
			CHECK(aml_dma_copy_custom(m, ly, lx, NULL, &rargs) == AML_SUCCESS);
		} else if (i % 3 == 1) {
			CHECK(aml_dma_async_copy_custom(m, &req, ly, lx, NULL, &rargs) == AML_SUCCESS);
			CHECK(aml_dma_wait(m, &req) == AML_SUCCESS && req == NULL);
		} else {
			CHECK(aml_dma_async_copy_custom(m, NULL, ly, lx, aml_dma_multiplex_copy_single,
			                                &rargs) == AML_SUCCESS);
			CHECK(aml_dma_barrier(m) == AML_SUCCESS);
		}
		CHECK(memcmp(x, y, n * sizeof(double)) == 0);
	}
	CHECK(count[0] == 20 && count[1] == 0 && count[2] == 10);
	/* a failing operator on one dma */
	ops[0] = failing_op;
	ops[2] = failing_op;
	CHECK(aml_dma_async_copy_custom(m, &req, ly, lx, NULL, &rargs) == AML_SUCCESS);
	CHECK(aml_dma_wait(m, &req) == -AML_EDOM);
	CHECK(aml_dma_async_copy_custom(m, NULL, ly, lx, NULL, &rargs) == AML_SUCCESS);
	CHECK(aml_dma_barrier(m) == -AML_EDOM);
	CHECK(aml_dma_async_copy_custom(m, &req, ly, lx, NULL, &rargs) == AML_SUCCESS);
	CHECK(aml_dma_cancel(m, &req) == AML_SUCCESS && req == NULL);
	CHECK(aml_dma_barrier(m) == -AML_EDOM); /* the cancelled failure */
	CHECK(aml_dma_multiplex_barrier(m->data) == AML_SUCCESS);
	/* another dma's request, or one already released: refused, not read (it crashed) */
	CHECK(aml_dma_async_copy(a, &req, ly, lx) == AML_SUCCESS);
	{
		struct aml_dma_request *other = req;
		CHECK(aml_dma_wait(m, &req) == -AML_EINVAL && req == other);
		CHECK(aml_dma_cancel(m, &req) == -AML_EINVAL && req == other);
		CHECK(aml_dma_wait(a, &req) == AML_SUCCESS);
	}
	CHECK(aml_dma_async_copy(m, &req, ly, lx) == AML_SUCCESS);
	{
		struct aml_dma_request *stale = req;
		CHECK(aml_dma_wait(m, &req) == AML_SUCCESS && req == NULL);
		req = stale;
		CHECK(aml_dma_wait(m, &req) == -AML_EINVAL);
	}
	aml_dma_fprintf(stdout, "dma: ", m);
	/* bad arguments */
	CHECK(aml_dma_multiplex_create(NULL, 3, list, w) == -AML_EINVAL);
	{
		struct aml_dma *z;
		CHECK(aml_dma_multiplex_create(&z, 0, list, w) == -AML_EINVAL);
		CHECK(aml_dma_multiplex_create(&z, 2, list, zero) == -AML_EINVAL);
		CHECK(aml_dma_multiplex_create(&z, 2, NULL, w) == -AML_EINVAL);
		CHECK(aml_dma_multiplex_barrier(NULL) == -AML_EINVAL);
	}
	/* no ownership: the multiplex goes, its dmas stay usable */
	CHECK(aml_dma_multiplex_destroy(&m) == AML_SUCCESS && m == NULL);
	CHECK(aml_dma_copy(a, ly, lx) == AML_SUCCESS);
	CHECK(aml_dma_copy(b, ly, lx) == AML_SUCCESS);
	aml_layout_destroy(&lx);
	aml_layout_destroy(&ly);
	CHECK(aml_dma_linux_destroy(&a) == AML_SUCCESS);
	CHECK(aml_dma_linux_destroy(&b) == AML_SUCCESS);
	free(x);
	free(y);
	printf("multiplex dma: OK\n");
}

/* ------------------------------------------------------------ areas */

static void test_areas(int cuda)
{
	void *p = aml_area_mmap(&aml_area_linux, 1 << 20, NULL);
	struct aml_area *area;
	CHECK(p != NULL);
	memset(p, 7, 1 << 20);
	CHECK(aml_area_munmap(&aml_area_linux, p, 1 << 20) == AML_SUCCESS);
	/* As AML: size 0 is NULL without touching aml_errno; munmap of NULL or 0 bytes is a no-op. */
	aml_errno = 0;
	CHECK(aml_area_mmap(&aml_area_linux, 0, NULL) == NULL && aml_errno == 0);
	CHECK(aml_area_mmap(NULL, 8, NULL) == NULL && aml_errno == AML_EINVAL);
	CHECK(aml_area_munmap(NULL, p, 8) == -AML_EINVAL);
	CHECK(aml_area_munmap(&aml_area_linux, NULL, 0) == AML_SUCCESS);
	CHECK(aml_area_munmap(&aml_area_linux, p, 0) == AML_SUCCESS);
	if (!cuda) {
		CHECK(aml_area_cuda_create(&area, 0, AML_AREA_CUDA_FLAG_ALLOC_HOST) == -AML_FAILURE);
		CHECK(aml_area_mmap(&aml_area_cuda, 64, NULL) == NULL && aml_errno == AML_ENOTSUP);
		CHECK(aml_area_mmap(&aml_area_cuda_unified, 64, NULL) == NULL);
	}
	printf("areas: OK\n");
}

/* ------------------------------------------------------------ CUDA DMA */

static void test_cuda_absent(void)
{
	struct aml_dma *d;
	struct aml_layout *a, *b;
	double x[4] = {1, 2, 3, 4}, y[4];
	size_t n = 4;
	CHECK(aml_dma_cuda_barrier(aml_dma_cuda.data) == AML_SUCCESS); /* nothing pending, as AML */
	CHECK(aml_dma_cuda_create(&d, cudaMemcpyHostToDevice) == -AML_FAILURE); /* as AML */
	CHECK(aml_dma_cuda_create(NULL, cudaMemcpyHostToDevice) == -AML_EINVAL);
	aml_layout_dense_create(&a, y, 0, 8, 1, &n, NULL, NULL);
	aml_layout_dense_create(&b, x, 0, 8, 1, &n, NULL, NULL);
	CHECK(aml_dma_copy(&aml_dma_cuda, a, b) == -AML_ENOTSUP);
	CHECK(aml_dma_cuda_barrier(aml_dma_cuda.data) == AML_SUCCESS);
	aml_layout_destroy(&a);
	aml_layout_destroy(&b);
	printf("cuda: -AML_ENOTSUP without a driver: OK\n");
}

static void test_cuda(void)
{
	struct aml_dma *up, *down, *d2d;
	struct aml_area *pinned;
	struct aml_dma_request *req;
	size_t n = 1 << 20, bytes = n * sizeof(double), i;
	double *h = grid(n, 2), *back = grid(n, 0), *pin;
	void *dev = aml_area_mmap(&aml_area_cuda, bytes, NULL);
	void *dev2 = aml_area_mmap(&aml_area_cuda, bytes, NULL);
	intptr_t s = 0, t = 0;
	void *pair = AML_DMA_CUDA_DEVICE_PAIR(3, 5);

	AML_DMA_CUDA_DEVICE_FROM_PAIR(pair, s, t);
	CHECK(s == 3 && t == 5);
	CHECK(AML_DMA_CUDA_REQUEST_STATUS_NONE == 0 && AML_DMA_CUDA_REQUEST_STATUS_PENDING == 1 &&
	      AML_DMA_CUDA_REQUEST_STATUS_DONE == 2);
	CHECK(dev != NULL && dev2 != NULL);
	CHECK(aml_dma_cuda_create(&up, cudaMemcpyHostToDevice) == AML_SUCCESS);
	CHECK(aml_dma_cuda_create(&down, cudaMemcpyDeviceToHost) == AML_SUCCESS);
	CHECK(aml_dma_cuda_create(&d2d, cudaMemcpyDeviceToDevice) == AML_SUCCESS);
	/* memcpy_op up, device to device, down */
	CHECK(aml_dma_copy_custom(up, (struct aml_layout *)dev, (struct aml_layout *)h,
	                          aml_dma_cuda_memcpy_op, (void *)bytes) == AML_SUCCESS);
	CHECK(aml_dma_async_copy_custom(d2d, &req, (struct aml_layout *)dev2,
	                                (struct aml_layout *)dev, aml_dma_cuda_memcpy_op,
	                                (void *)bytes) == AML_SUCCESS);
	CHECK(aml_dma_wait(d2d, &req) == AML_SUCCESS);
	CHECK(aml_dma_copy_custom(down, (struct aml_layout *)back, (struct aml_layout *)dev2,
	                          aml_dma_cuda_memcpy_op, (void *)bytes) == AML_SUCCESS);
	for (i = 0; i < n; i++)
		CHECK(back[i] == h[i]);
	/* copy_1D with layouts, NULL request + barrier */
	{
		struct aml_layout *lh, *ld, *lb;
		memset(back, 0, bytes);
		aml_layout_dense_create(&lh, h, 0, sizeof(double), 1, &n, NULL, NULL);
		aml_layout_dense_create(&ld, dev, 0, sizeof(double), 1, &n, NULL, NULL);
		aml_layout_dense_create(&lb, back, 0, sizeof(double), 1, &n, NULL, NULL);
		CHECK(aml_dma_async_copy_custom(up, NULL, ld, lh, aml_dma_cuda_copy_1D, NULL) ==
		      AML_SUCCESS);
		CHECK(aml_dma_barrier(up) == AML_SUCCESS);
		CHECK(aml_dma_copy_custom(down, lb, ld, aml_dma_cuda_copy_1D, NULL) == AML_SUCCESS);
		for (i = 0; i < n; i++)
			CHECK(back[i] == h[i]);
		/* the NULL operator (ferry's planned copy) on the ready dma, both ways */
		memset(back, 0, bytes);
		CHECK(aml_dma_copy(&aml_dma_cuda, ld, lh) == AML_SUCCESS);
		CHECK(aml_dma_copy(&aml_dma_cuda, lb, ld) == AML_SUCCESS);
		for (i = 0; i < n; i++)
			CHECK(back[i] == h[i]);
		aml_layout_destroy(&lh);
		aml_layout_destroy(&ld);
		aml_layout_destroy(&lb);
	}
	/* the ready dma (stream 0) with AML's memcpy operator, as AML's own CUDA test uses it:
	 * 64 copies nobody waits for, each way, each completed by one barrier */
	{
		enum { K = 64 };
		const size_t chunk = 1 << 16;
		char *hb = (char *)malloc(K * chunk), *bb = (char *)malloc(K * chunk);
		void *db[K];
		CHECK(hb != NULL && bb != NULL);
		memset(bb, 0, K * chunk);
		for (i = 0; i < K; i++) {
			memset(hb + i * chunk, (int)i + 1, chunk);
			db[i] = aml_area_mmap(&aml_area_cuda, chunk, NULL);
			CHECK(db[i] != NULL);
		}
		for (i = 0; i < K; i++)
			CHECK(aml_dma_async_copy_custom(&aml_dma_cuda, NULL, (struct aml_layout *)db[i],
			                                (struct aml_layout *)(hb + i * chunk),
			                                aml_dma_cuda_memcpy_op, (void *)chunk) == AML_SUCCESS);
		CHECK(aml_dma_barrier(&aml_dma_cuda) == AML_SUCCESS);
		for (i = 0; i < K; i++)
			CHECK(aml_dma_async_copy_custom(&aml_dma_cuda, NULL, (struct aml_layout *)(bb + i * chunk),
			                                (struct aml_layout *)db[i], aml_dma_cuda_memcpy_op,
			                                (void *)chunk) == AML_SUCCESS);
		CHECK(aml_dma_barrier(&aml_dma_cuda) == AML_SUCCESS);
		CHECK(memcmp(hb, bb, K * chunk) == 0);
		for (i = 0; i < K; i++)
			CHECK(aml_area_munmap(&aml_area_cuda, db[i], chunk) == AML_SUCCESS);
		free(hb);
		free(bb);
	}
	/* a strided 3-D box to the device and back (planned copy), pinned host memory */
	CHECK(aml_area_cuda_create(&pinned, -1, AML_AREA_CUDA_FLAG_ALLOC_HOST) == AML_SUCCESS);
	pin = (double *)aml_area_mmap(pinned, bytes, NULL);
	CHECK(pin != NULL);
	memcpy(pin, h, bytes);
	{
		size_t big[3] = {64, 128, 128}, box[3] = {32, 64, 100}, off[3] = {5, 7, 9};
		struct aml_layout *whole, *sub, *ld, *lb;
		size_t j, k;
		aml_layout_dense_create(&whole, pin, 1, sizeof(double), 3, big, NULL, NULL);
		aml_layout_slice(whole, &sub, off, box, NULL);
		aml_layout_dense_create(&ld, dev, 1, sizeof(double), 3, box, NULL, NULL);
		aml_layout_dense_create(&lb, back, 1, sizeof(double), 3, box, NULL, NULL);
		CHECK(aml_dma_copy(up, ld, sub) == AML_SUCCESS);
		CHECK(aml_dma_copy(down, lb, ld) == AML_SUCCESS);
		for (i = 0; i < 32; i++)
			for (j = 0; j < 64; j++)
				for (k = 0; k < 100; k++)
					CHECK(back[(i * 64 + j) * 100 + k] ==
					      h[((5 + i) * 128 + 7 + j) * 128 + 9 + k]);
		aml_layout_destroy(&whole);
		aml_layout_destroy(&sub);
		aml_layout_destroy(&ld);
		aml_layout_destroy(&lb);
	}
	CHECK(aml_area_munmap(pinned, pin, bytes) == AML_SUCCESS);
	aml_area_cuda_destroy(&pinned);
	CHECK(aml_dma_cuda_destroy(&up) == AML_SUCCESS && up == NULL);
	CHECK(aml_dma_cuda_destroy(&down) == AML_SUCCESS);
	CHECK(aml_dma_cuda_destroy(&d2d) == AML_SUCCESS);
	CHECK(aml_area_munmap(&aml_area_cuda, dev, bytes) == AML_SUCCESS);
	CHECK(aml_area_munmap(&aml_area_cuda, dev2, bytes) == AML_SUCCESS);
	free(h);
	free(back);
	printf("cuda dma: OK\n");
}

int main(int argc, char **argv)
{
	int cuda;
	CHECK(aml_init(&argc, &argv) == AML_SUCCESS);
	CHECK(aml_dma_linux != NULL);
	cuda = aml_support_backends(AML_BACKEND_CUDA);
	test_errors();
	test_layouts();
	test_linux(0);
	test_linux(4);
	test_many_dims();
	test_multiplex();
	test_areas(cuda);
	if (cuda)
		test_cuda();
	else
		test_cuda_absent();
	CHECK(aml_finalize() == AML_SUCCESS);
	CHECK(aml_dma_linux == NULL);
	(void)failures;
	printf("test_aml: OK\n");
	return 0;
}
