/*
 * test_tiling.c - AML's tilings and libaml's excit.h on libaml: range and product iterators
 * (order, steps, rewind, peek, empty and bad ones); resize and pad tilings in both orders over
 * dense layouts of both orders with border tiles: dims, ntiles, tile dims, every tile's
 * elements (the pad's neutral element beyond the border), copies tile by tile with the Linux
 * DMA, rawptr, index by iterator, the printout, the ops tables and exported ops; errors.
 * Common subset of C and C++; prints "test_tiling: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/dma/linux.h>
#include <aml/layout/dense.h>
#include <aml/tiling/native.h>
#include <aml/tiling/pad.h>
#include <aml/tiling/resize.h>
#include <excit.h>
#include <string.h>

#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);      \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

static excit_t range(ssize_t first, ssize_t last, ssize_t step)
{
	excit_t r = excit_alloc(EXCIT_RANGE);
	CHECK(r != NULL);
	CHECK(excit_range_init(r, first, last, step) == EXCIT_SUCCESS);
	return r;
}

static void test_excit(void)
{
	ssize_t v[3], d;
	excit_t r = range(5, 1, -2), p, e;
	int n;

	CHECK(excit_dimension(r, &d) == EXCIT_SUCCESS && d == 1);
	CHECK(excit_peek(r, v) == EXCIT_SUCCESS && v[0] == 5);
	CHECK(excit_next(r, v) == EXCIT_SUCCESS && v[0] == 5);
	CHECK(excit_next(r, NULL) == EXCIT_SUCCESS);
	CHECK(excit_next(r, v) == EXCIT_SUCCESS && v[0] == 1);
	CHECK(excit_next(r, v) == EXCIT_STOPIT && excit_peek(r, v) == EXCIT_STOPIT);
	CHECK(excit_rewind(r) == EXCIT_SUCCESS && excit_next(r, v) == EXCIT_SUCCESS && v[0] == 5);
	excit_free(r);

	/* {0,1} x {10} x {0,2,4}: the last part fastest. */
	p = excit_alloc(EXCIT_PRODUCT);
	CHECK(p != NULL);
	CHECK(excit_peek(p, v) == -EXCIT_EINVAL); /* empty product */
	CHECK(excit_product_add(p, range(0, 1, 1)) == EXCIT_SUCCESS);
	CHECK(excit_product_add(p, range(10, 10, 1)) == EXCIT_SUCCESS);
	CHECK(excit_product_add(p, range(0, 5, 2)) == EXCIT_SUCCESS);
	CHECK(excit_dimension(p, &d) == EXCIT_SUCCESS && d == 3);
	for (int pass = 0; pass < 2; pass++) {
		n = 0;
		while (excit_next(p, v) == EXCIT_SUCCESS) {
			CHECK(v[0] == n / 3 && v[1] == 10 && v[2] == 2 * (n % 3));
			n++;
		}
		CHECK(n == 6);
		CHECK(excit_peek(p, NULL) == EXCIT_STOPIT);
		CHECK(excit_rewind(p) == EXCIT_SUCCESS);
	}
	CHECK(excit_product_add(p, p) == -EXCIT_EINVAL);
	CHECK(excit_product_add(p, NULL) == -EXCIT_EINVAL);
	excit_free(p);

	/* An empty part empties the product. */
	p = excit_alloc(EXCIT_PRODUCT);
	CHECK(excit_product_add(p, range(0, 3, 1)) == EXCIT_SUCCESS);
	CHECK(excit_product_add(p, range(1, 0, 1)) == EXCIT_SUCCESS);
	CHECK(excit_next(p, v) == EXCIT_STOPIT);
	excit_free(p);

	/* Bad ones. */
	e = excit_alloc(EXCIT_RANGE);
	CHECK(excit_next(e, v) == -EXCIT_EINVAL); /* not initialised */
	CHECK(excit_range_init(e, 0, 3, 0) == EXCIT_SUCCESS && excit_peek(e, v) == -EXCIT_EINVAL);
	r = range(0, 1, 1);
	CHECK(excit_product_add(e, r) == -EXCIT_EINVAL); /* not a product: r stays the caller's */
	excit_free(r);
	excit_free(e);
	CHECK(excit_alloc(EXCIT_HILBERT2D) == NULL);
	CHECK(excit_range_init(NULL, 0, 1, 1) == -EXCIT_EINVAL);
	CHECK(excit_next(NULL, v) == -EXCIT_EINVAL && excit_dimension(NULL, &d) == -EXCIT_EINVAL);
	excit_free(NULL);
	printf("excit: OK\n");
}

/* A printout's text. */
static int prints(const struct aml_tiling *t, const char *want)
{
	char buf[16384];
	size_t n;
	FILE *f = tmpfile();
	CHECK(f != NULL);
	CHECK(aml_tiling_fprintf(f, "t", t) == AML_SUCCESS);
	rewind(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return strstr(buf, want) != NULL;
}

#define D0 7 /* fastest dim of the memory */
#define D1 5

/* mem[D1][D0] as a 2-d layout of the given order; tiles of 3 x 2 along (D0, D1). */
static void test_kind(int layout_order, int tiling_order, int pad)
{
	static int mem[D1][D0], res[D1][D0];
	int neutral = -1;
	int row = tiling_order == AML_TILING_ORDER_ROW_MAJOR;
	size_t ldims[2], tdims[2], dims[2], c[2], native_tdims[2] = {3, 2};
	struct aml_layout *l, *lr;
	struct aml_tiling *t, *tr;

	for (int i = 0; i < D1; i++)
		for (int j = 0; j < D0; j++) {
			mem[i][j] = i * D0 + j;
			res[i][j] = 0;
		}
	/* The layout's own order for its dims; the tiling's for tile dims and coords. */
	if (layout_order == AML_LAYOUT_ORDER_ROW_MAJOR) {
		ldims[0] = D1;
		ldims[1] = D0;
	} else {
		ldims[0] = D0;
		ldims[1] = D1;
	}
	tdims[0] = native_tdims[row ? 1 : 0];
	tdims[1] = native_tdims[row ? 0 : 1];
	CHECK(aml_layout_dense_create(&l, mem, layout_order, sizeof(int), 2, ldims, NULL, NULL) ==
	      AML_SUCCESS);
	CHECK(aml_layout_dense_create(&lr, res, layout_order, sizeof(int), 2, ldims, NULL, NULL) ==
	      AML_SUCCESS);
	if (pad) {
		CHECK(aml_tiling_pad_create(&t, tiling_order, l, 2, tdims, &neutral) == AML_SUCCESS);
		CHECK(aml_tiling_pad_create(&tr, tiling_order, lr, 2, tdims, &neutral) ==
		      AML_SUCCESS);
	} else {
		CHECK(aml_tiling_resize_create(&t, tiling_order, l, 2, tdims) == AML_SUCCESS);
		CHECK(aml_tiling_resize_create(&tr, tiling_order, lr, 2, tdims) == AML_SUCCESS);
	}
	CHECK(aml_tiling_order(t) == tiling_order);
	/* AML's ops tables and the ops it exports. */
	if (pad) {
		CHECK(t->ops == (row ? &aml_tiling_pad_row_ops : &aml_tiling_pad_column_ops));
		CHECK(aml_tiling_pad_column_ntiles(t->data) == 9);
		CHECK(aml_tiling_pad_row_ndims(t->data) == 2 && aml_tiling_pad_row_order(t->data) == 1);
	} else {
		CHECK(t->ops == (row ? &aml_tiling_resize_row_ops : &aml_tiling_resize_column_ops));
		CHECK(aml_tiling_resize_column_ntiles(t->data) == 9);
		CHECK(aml_tiling_resize_column_order(t->data) == AML_TILING_ORDER_COLUMN_MAJOR);
	}
	CHECK(aml_tiling_ndims(t) == 2 && aml_tiling_ntiles(t) == 9);
	CHECK(aml_tiling_dims(t, dims) == AML_SUCCESS && dims[0] == 3 && dims[1] == 3);
	CHECK(aml_tiling_dims_native(t, dims) == AML_SUCCESS && dims[0] == 3 && dims[1] == 3);
	CHECK(aml_tiling_tile_dims(t, NULL, dims) == AML_SUCCESS);
	/* In the layout's order. */
	if (layout_order == AML_LAYOUT_ORDER_ROW_MAJOR)
		CHECK(dims[0] == 2 && dims[1] == 3);
	else
		CHECK(dims[0] == 3 && dims[1] == 2);

	/* Every tile (native coords c: c[0] along D0): its elements, then a copy. */
	for (c[1] = 0; c[1] < 3; c[1]++)
		for (c[0] = 0; c[0] < 3; c[0]++) {
			size_t uc[2], td[2], e[2];
			size_t want0 = c[0] == 2 ? 1 : 3, want1 = c[1] == 2 ? 1 : 2;
			struct aml_layout *b, *br, *bn;
			uc[0] = c[row ? 1 : 0];
			uc[1] = c[row ? 0 : 1];
			b = aml_tiling_index(t, uc);
			br = aml_tiling_index(tr, uc);
			bn = aml_tiling_index_native(t, c);
			CHECK(b != NULL && br != NULL && bn != NULL);
			CHECK(aml_tiling_tile_dims(t, uc, td) == AML_SUCCESS);
			if (pad) {
				want0 = 3;
				want1 = 2;
			}
			if (layout_order == AML_LAYOUT_ORDER_ROW_MAJOR)
				CHECK(td[0] == want1 && td[1] == want0);
			else
				CHECK(td[0] == want0 && td[1] == want1);
			for (e[1] = 0; e[1] < want1; e[1]++)
				for (e[0] = 0; e[0] < want0; e[0]++) {
					size_t x = c[0] * 3 + e[0], y = c[1] * 2 + e[1], le[2];
					int *p;
					le[0] = e[layout_order == AML_LAYOUT_ORDER_ROW_MAJOR ? 1 : 0];
					le[1] = e[layout_order == AML_LAYOUT_ORDER_ROW_MAJOR ? 0 : 1];
					p = (int *)aml_layout_deref(b, le);
					CHECK(*p == *(int *)aml_layout_deref(bn, le));
					if (x < D0 && y < D1)
						CHECK(p == &mem[y][x]);
					else
						CHECK(*p == -1);
				}
			CHECK(aml_tiling_rawptr(t, uc) == (void *)&mem[c[1] * 2][c[0] * 3]);
			CHECK(aml_dma_linux_copy_generic(br, b, NULL) == AML_SUCCESS);
			aml_layout_destroy(&b);
			aml_layout_destroy(&br);
			aml_layout_destroy(&bn);
		}
	CHECK(memcmp(mem, res, sizeof(mem)) == 0);

	/* By iterator (native coords). */
	{
		excit_t it = excit_alloc(EXCIT_PRODUCT), one = excit_alloc(EXCIT_PRODUCT);
		int n = 0;
		memset(res, 0, sizeof(res));
		CHECK(excit_product_add(it, range(0, 2, 1)) == EXCIT_SUCCESS);
		CHECK(excit_product_add(it, range(0, 2, 1)) == EXCIT_SUCCESS);
		for (; excit_peek(it, NULL) == EXCIT_SUCCESS; excit_next(it, NULL), n++) {
			struct aml_layout *b = aml_tiling_index_byiter(t, it);
			struct aml_layout *br = aml_tiling_index_byiter(tr, it);
			CHECK(b != NULL && br != NULL);
			CHECK(aml_dma_linux_copy_generic(br, b, NULL) == AML_SUCCESS);
			aml_layout_destroy(&b);
			aml_layout_destroy(&br);
		}
		CHECK(n == 9 && memcmp(mem, res, sizeof(mem)) == 0);
		/* Over: NULL. Another dimension: NULL. */
		CHECK(aml_tiling_index_byiter(t, it) == NULL && aml_errno == AML_EINVAL);
		CHECK(excit_product_add(one, range(0, 0, 1)) == EXCIT_SUCCESS);
		CHECK(aml_tiling_index_byiter(t, one) == NULL && aml_errno == AML_EINVAL);
		excit_free(it);
		excit_free(one);
	}

	/* Out of the tiling; NULL arguments. */
	c[0] = 3;
	c[1] = 0;
	CHECK(aml_tiling_index(t, c) == NULL && aml_errno == AML_EINVAL);
	CHECK(aml_tiling_rawptr(t, c) == NULL && aml_errno == AML_EINVAL);
	CHECK(aml_tiling_tile_dims(t, c, dims) == -AML_EINVAL);
	CHECK(aml_tiling_index(t, NULL) == NULL && aml_tiling_index(NULL, c) == NULL);
	CHECK(aml_tiling_dims(t, NULL) == -AML_EINVAL && aml_tiling_order(NULL) == -AML_EINVAL);

	CHECK(prints(t, pad ? "t: tiling-pad: " : "t: tiling-resize: "));
	CHECK(prints(t, row ? ": row-major\nt: tags: 1\nt: ndims: 2\n" :
	                      ": column-major\nt: tags: 0\nt: ndims: 2\n"));
	CHECK(prints(t, "t: layout: begin\nt: layout-dense: "));
	CHECK(prints(t, "t: layout: end\n"));
	if (pad)
		CHECK(prints(t, "t: neutral: "));

	if (pad) {
		aml_tiling_pad_destroy(&t);
		aml_tiling_pad_destroy(&tr);
	} else {
		aml_tiling_resize_destroy(&t);
		aml_tiling_resize_destroy(&tr);
	}
	CHECK(t == NULL && tr == NULL);
	aml_layout_destroy(&l);
	aml_layout_destroy(&lr);
}

static void test_errors(void)
{
	int m[6], neutral = 0;
	size_t d[2] = {2, 3}, z[2] = {0, 1};
	struct aml_layout *l;
	struct aml_tiling *t = NULL;

	CHECK(aml_layout_dense_create(&l, m, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(int), 2, d, NULL,
	                              NULL) == AML_SUCCESS);
	CHECK(aml_tiling_resize_create(NULL, 0, l, 2, d) == -AML_EINVAL);
	CHECK(aml_tiling_resize_create(&t, 0, NULL, 2, d) == -AML_EINVAL);
	CHECK(aml_tiling_resize_create(&t, 0, l, 0, d) == -AML_EINVAL);
	CHECK(aml_tiling_resize_create(&t, 0, l, 3, d) == -AML_EINVAL); /* not the layout's */
	CHECK(aml_tiling_resize_create(&t, 0, l, 2, z) == -AML_EINVAL); /* a tile dim 0 */
	CHECK(aml_tiling_pad_create(&t, 0, l, 2, d, NULL) == -AML_EINVAL);
	CHECK(t == NULL);
	/* A single tile: the whole layout, no padding. */
	CHECK(aml_tiling_pad_create(&t, 0, l, 2, d, &neutral) == AML_SUCCESS);
	CHECK(aml_tiling_ntiles(t) == 1);
	aml_tiling_pad_destroy(&t);
	aml_tiling_pad_destroy(&t);
	aml_tiling_resize_destroy(NULL);
	CHECK(aml_tiling_ndims(NULL) == 0 && aml_tiling_ntiles(NULL) == 0);
	CHECK(aml_tiling_fprintf(stderr, "t", NULL) == -AML_EINVAL);
	aml_layout_destroy(&l);
	printf("errors: OK\n");
}

int main(void)
{
	test_excit();
	for (int pad = 0; pad < 2; pad++)
		for (int lo = 0; lo < 2; lo++)
			for (int to = 0; to < 2; to++)
				test_kind(lo ? AML_LAYOUT_ORDER_ROW_MAJOR : AML_LAYOUT_ORDER_COLUMN_MAJOR,
				          to ? AML_TILING_ORDER_ROW_MAJOR : AML_TILING_ORDER_COLUMN_MAJOR, pad);
	printf("tilings: OK\n");
	test_errors();
	printf("test_tiling: OK\n");
	return 0;
}
