/*
 * test_layouts.c - AML's reshape and pad layouts on libaml: element addresses in both
 * orders over a strided dense target, dims, printout, duplicate, ownership of the target
 * (destroy frees it, free() leaves it), errors, and a Linux DMA copy out of a pad;
 * aml_copy_layout_transform_generic between dense layouts (before and after aml_init) and out
 * of a pad, and its errors; the dense layouts' exported methods (rawptr, column dims, the
 * printers, duplicate). Common subset of C and C++; prints "test_layouts: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/dma/linux.h>
#include <aml/layout/dense.h>
#include <aml/layout/native.h>
#include <aml/layout/pad.h>
#include <aml/layout/reshape.h>
#include <string.h>

#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);      \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

/* A printout's text. */
static int prints(const struct aml_layout *l, const char *want)
{
	char buf[8192];
	size_t n;
	FILE *f = tmpfile();
	CHECK(f != NULL);
	CHECK(aml_layout_fprintf(f, "t", l) == AML_SUCCESS);
	rewind(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return strstr(buf, want) != NULL;
}

/* memory[6][5][4] inside [7][6][5] ints: a dense target with pitches, reshaped to 5 dims. */
static void test_reshape(void)
{
	static int memory[7][6][5];
	size_t dims_col[3] = {4, 5, 6}, dims_row[3] = {6, 5, 4};
	size_t pitch_col[3] = {5, 6, 7}, pitch_row[3] = {7, 6, 5};
	size_t new_col[5] = {2, 2, 5, 2, 3}, new_row[5] = {3, 2, 5, 2, 2};
	size_t bad[2] = {7, 7}, got[5], c[5];
	struct aml_layout *a, *r, *d;
	int i = 0, order;

	for (int j = 0; j < 6; j++)
		for (int k = 0; k < 5; k++)
			for (int l = 0; l < 4; l++, i++)
				memory[j][k][l] = i;
	for (order = 0; order < 2; order++) {
		int row = order == AML_LAYOUT_ORDER_ROW_MAJOR;
		CHECK(aml_layout_dense_create(&a, memory, order, sizeof(int), 3,
		                              row ? dims_row : dims_col, NULL,
		                              row ? pitch_row : pitch_col) == AML_SUCCESS);
		/* A wrong element count is refused, and the target stays the caller's. */
		CHECK(aml_layout_reshape_create(&r, a, order, 2, bad) == -AML_EINVAL);
		CHECK(aml_layout_reshape_create(&r, NULL, order, 5, new_col) == -AML_EINVAL);
		CHECK(aml_layout_reshape_create(&r, a, order, 0, new_col) == -AML_EINVAL);
		CHECK(aml_layout_reshape_create(&r, a, order, 5, NULL) == -AML_EINVAL);
		CHECK(aml_layout_reshape_create(&r, a, order, 5, row ? new_row : new_col) ==
		      AML_SUCCESS);
		CHECK(aml_layout_order(r) == order && aml_layout_ndims(r) == 5);
		CHECK(aml_layout_element_size(r) == sizeof(int));
		CHECK(aml_layout_rawptr(r) == (void *)memory);
		CHECK(aml_layout_dims(r, got) == AML_SUCCESS);
		CHECK(!memcmp(got, row ? new_row : new_col, sizeof(got)));
		CHECK(aml_layout_dims_native(r, got) == AML_SUCCESS && !memcmp(got, new_col, sizeof(got)));
		i = 0;
		for (size_t j = 0; j < 3; j++)
			for (size_t k = 0; k < 2; k++)
				for (size_t l = 0; l < 5; l++)
					for (size_t m = 0; m < 2; m++)
						for (size_t n = 0; n < 2; n++, i++) {
							size_t nat[5] = {n, m, l, k, j};
							for (int x = 0; x < 5; x++)
								c[x] = row ? nat[4 - x] : nat[x];
							CHECK(*(int *)aml_layout_deref_safe(r, c) == i);
							CHECK(*(int *)aml_layout_deref_native(r, nat) == i);
						}
		c[0] = 3;
		CHECK(aml_layout_deref_safe(r, c) == NULL && aml_errno == AML_EINVAL);
		CHECK(prints(r, row ? "t: layout-reshape: " : "t: ndims: 5"));
		CHECK(prints(r, "t: target: begin\nt: layout-dense: "));
		/* A duplicate over other memory: the same offsets from its pointer. */
		CHECK(aml_layout_duplicate(r, &d, &memory[1][0][0]) == AML_SUCCESS);
		for (int x = 0; x < 5; x++)
			c[x] = 0;
		CHECK(aml_layout_deref(d, c) == (void *)&memory[1][0][0]);
		CHECK(aml_layout_order(d) == order);
		aml_layout_destroy(&d);
		CHECK(d == NULL);
		/* The reshape owns its target: destroying it frees both (valgrind checks). */
		aml_layout_destroy(&r);
	}
	/* free() releases the reshape only; the target stays the caller's. */
	CHECK(aml_layout_dense_create(&a, memory, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(int), 3,
	                              dims_col, NULL, pitch_col) == AML_SUCCESS);
	CHECK(aml_layout_reshape_create(&r, a, AML_LAYOUT_ORDER_COLUMN_MAJOR, 5, new_col) ==
	      AML_SUCCESS);
	free(r);
	CHECK(aml_layout_ndims(a) == 3);
	aml_layout_destroy(&a);
	aml_layout_reshape_destroy(NULL);
	CHECK(aml_layout_reshape_ndims(NULL) == 0 && aml_errno == AML_EINVAL);
}

/* float memory[7][11] padded to 11 x 13 with 1.0; copied out by the Linux DMA. */
static void test_pad(void)
{
	static float memory[7][11], out[11][13];
	size_t dims[2] = {7, 11}, pdims[2] = {11, 13}, small[2] = {6, 13}, got[2], c[2];
	float one = 1.0f;
	struct aml_layout *a, *p, *d, *o;
	int order;

	for (int i = 0; i < 7; i++)
		for (int j = 0; j < 11; j++)
			memory[i][j] = (float)(100 * i + j + 2);
	for (order = 0; order < 2; order++) {
		int row = order == AML_LAYOUT_ORDER_ROW_MAJOR;
		CHECK(aml_layout_dense_create(&a, memory, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(float), 2,
		                              dims, NULL, NULL) == AML_SUCCESS);
		CHECK(aml_layout_pad_create(&p, AML_LAYOUT_ORDER_ROW_MAJOR, a, small, &one) ==
		      -AML_EINVAL);
		CHECK(aml_layout_pad_create(&p, order, a, pdims, NULL) == -AML_EINVAL);
		CHECK(aml_layout_pad_create(&p, order, NULL, pdims, &one) == -AML_EINVAL);
		/* Column order: the dims are given innermost first. */
		if (!row) {
			size_t t = pdims[0];
			pdims[0] = pdims[1];
			pdims[1] = t;
		}
		CHECK(aml_layout_pad_create(&p, order, a, pdims, &one) == AML_SUCCESS);
		CHECK(aml_layout_order(p) == order && aml_layout_ndims(p) == 2);
		CHECK(aml_layout_element_size(p) == sizeof(float));
		CHECK(aml_layout_rawptr(p) == (void *)memory);
		CHECK(aml_layout_dims(p, got) == AML_SUCCESS && !memcmp(got, pdims, sizeof(got)));
		for (size_t i = 0; i < 11; i++)
			for (size_t j = 0; j < 13; j++) {
				float want = i < 7 && j < 11 ? memory[i][j] : one;
				c[0] = row ? i : j;
				c[1] = row ? j : i;
				CHECK(*(float *)aml_layout_deref_safe(p, c) == want);
			}
		if (!row) {
			size_t t = pdims[0];
			pdims[0] = pdims[1];
			pdims[1] = t;
		}
		CHECK(prints(p, "t: element size: 4\n"));
		CHECK(prints(p, "t: target: end\n"));
		CHECK(aml_layout_duplicate(p, &d, NULL) == AML_SUCCESS);
		c[0] = c[1] = 10;
		CHECK(*(float *)aml_layout_deref(d, c) == one);
		c[0] = c[1] = 0;
		CHECK(aml_layout_deref(d, c) == (void *)memory);
		aml_layout_destroy(&d);
		/* The Linux DMA copies a pad out element by element (AML's generic copy). */
		CHECK(aml_layout_dense_create(&o, out, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(float), 2,
		                              pdims, NULL, NULL) == AML_SUCCESS);
		memset(out, 0, sizeof(out));
		CHECK(aml_dma_copy(aml_dma_linux, o, p) == AML_SUCCESS);
		for (int i = 0; i < 11; i++)
			for (int j = 0; j < 13; j++)
				CHECK(out[i][j] == (i < 7 && j < 11 ? memory[i][j] : one));
		aml_layout_destroy(&o);
		aml_layout_destroy(&p);
	}
	aml_layout_pad_destroy(NULL);
}

/* An array of structs (4 fields x 5 x 3, column-major) to a struct of arrays (5 x 3 x 4). */
static void test_transform(void)
{
	static long aos[3][5][4], soa[4][3][5], big[4][3][6];
	size_t d_aos[3] = {4, 5, 3}, d_soa[3] = {5, 3, 4}, d_big[3] = {6, 3, 4};
	size_t perm[3] = {1, 2, 0}, dup[3] = {1, 1, 0}, out_of_range[3] = {1, 2, 3};
	size_t pdims[3] = {6, 3, 4}, c[3];
	long zero = -1;
	struct aml_layout *a, *s, *b, *p;

	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 5; j++)
			for (int k = 0; k < 4; k++)
				aos[i][j][k] = 1000 * k + 10 * j + i;
	CHECK(aml_layout_dense_create(&a, aos, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(long), 3,
	                              d_aos, NULL, NULL) == AML_SUCCESS);
	CHECK(aml_layout_dense_create(&s, soa, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(long), 3,
	                              d_soa, NULL, NULL) == AML_SUCCESS);
	memset(soa, 0, sizeof(soa));
	CHECK(aml_copy_layout_transform_generic(s, a, perm) == AML_SUCCESS);
	for (int k = 0; k < 4; k++)
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 5; j++)
				CHECK(soa[k][i][j] == 1000 * k + 10 * j + i);
	/* Errors: not a permutation, dims that do not match, NULLs. */
	CHECK(aml_copy_layout_transform_generic(s, a, dup) == -AML_EINVAL);
	CHECK(aml_copy_layout_transform_generic(s, a, out_of_range) == -AML_EINVAL);
	CHECK(aml_copy_layout_transform_generic(a, a, perm) == -AML_EINVAL);
	CHECK(aml_copy_layout_transform_generic(s, a, NULL) == -AML_EINVAL);
	CHECK(aml_copy_layout_transform_generic(NULL, a, perm) == -AML_EINVAL);
	/* Out of a pad (element by element): the pad's neutral element past the target. */
	CHECK(aml_layout_dense_create(&b, big, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(long), 3,
	                              d_big, NULL, NULL) == AML_SUCCESS);
	CHECK(aml_layout_pad_create(&p, AML_LAYOUT_ORDER_COLUMN_MAJOR, s, pdims, &zero) ==
	      AML_SUCCESS);
	CHECK(aml_copy_layout_transform_generic(b, p, perm) == -AML_EINVAL);
	c[0] = 0;
	c[1] = 1;
	c[2] = 2;
	CHECK(aml_copy_layout_transform_generic(b, p, c) == AML_SUCCESS);
	for (int k = 0; k < 4; k++)
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 6; j++)
				CHECK(big[k][i][j] == (j < 5 ? 1000 * k + 10 * j + i : -1));
	aml_layout_destroy(&p); /* and s, its target */
	aml_layout_destroy(&b);
	aml_layout_destroy(&a);
}

static void test_dense_methods(void)
{
	int memory[24];
	size_t dims[3] = {2, 3, 4}, got[3];
	struct aml_layout *col, *row, *dup, *pad;
	CHECK(aml_layout_dense_create(&col, memory, AML_LAYOUT_ORDER_COLUMN_MAJOR, sizeof(int), 3,
	                              dims, NULL, NULL) == AML_SUCCESS);
	CHECK(aml_layout_dense_create(&row, memory, AML_LAYOUT_ORDER_ROW_MAJOR, sizeof(int), 3, dims,
	                              NULL, NULL) == AML_SUCCESS);
	CHECK(aml_layout_dense_rawptr(col->data) == memory);
	CHECK(aml_layout_column_dims(col->data, got) == AML_SUCCESS && got[0] == 2 && got[2] == 4);
	CHECK(aml_layout_column_fprintf(col->data, stdout, "col") == AML_SUCCESS);
	CHECK(aml_layout_row_fprintf(row->data, stdout, "row") == AML_SUCCESS);
	CHECK(aml_layout_dense_duplicate(row, &dup, memory + 1) == AML_SUCCESS);
	CHECK(aml_layout_rawptr(dup) == memory + 1 && aml_layout_order(dup) == AML_LAYOUT_ORDER_ROW_MAJOR);
	CHECK(aml_layout_dense_duplicate(NULL, &dup, NULL) == -AML_EINVAL);
	int neutral = 0;
	size_t pdims[3] = {3, 3, 4};
	CHECK(aml_layout_pad_create(&pad, AML_LAYOUT_ORDER_COLUMN_MAJOR, col, pdims, &neutral) ==
	      AML_SUCCESS);
	struct aml_layout *none = NULL;
	CHECK(aml_layout_dense_duplicate(pad, &none, NULL) == -AML_EINVAL && none == NULL);
	aml_layout_destroy(&pad); /* owns col */
	aml_layout_destroy(&dup);
	aml_layout_destroy(&row);
	printf("dense methods: OK\n");
}

int main(int argc, char **argv)
{
	test_dense_methods();
	test_transform(); /* on the calling thread */
	CHECK(aml_init(&argc, &argv) == AML_SUCCESS);
	test_transform(); /* on aml_dma_linux's workers */
	test_reshape();
	test_pad();
	CHECK(aml_finalize() == AML_SUCCESS);
	printf("test_layouts: OK\n");
	return 0;
}
