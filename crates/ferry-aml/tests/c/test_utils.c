/*
 * test_utils.c - AML's utilities on libaml: bitmap, vector, queue, version, the Linux backend's
 * setup (aml/utils/backend/linux.h), and (C only: C++
 * forbids the unnamed structs they declare) the AML_INNER_MALLOC macros. Common subset of C
 * and C++; prints "test_utils: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/dma/linux.h>
#include <aml/utils/backend/linux.h>

#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);      \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

static int same_ptr(const void *a, const void *b)
{
	return a != b;
}

static void test_bitmap(void)
{
	struct aml_bitmap *b, *c;
	unsigned long words[2] = {0x5UL, 0};
	char *s;
	CHECK(AML_BITMAP_MAX == 2048 && AML_BITMAP_NBITS == 8 * (int)sizeof(unsigned long));
	CHECK(aml_bitmap_create(NULL) == -AML_EINVAL);
	CHECK(aml_bitmap_create(&b) == AML_SUCCESS && aml_bitmap_iszero(b) == 1);
	CHECK(aml_bitmap_set(b, AML_BITMAP_MAX) == -AML_EINVAL);
	CHECK(aml_bitmap_isset(b, AML_BITMAP_MAX) == -AML_EINVAL);
	CHECK(aml_bitmap_set(b, 3) == AML_SUCCESS && b->mask[0] == 8UL);
	CHECK(aml_bitmap_set_range(b, 100, 199) == AML_SUCCESS && aml_bitmap_nset(b) == 101);
	CHECK(aml_bitmap_set_range(b, 5, 4) == -AML_EINVAL);
	CHECK(aml_bitmap_first(b) == 3 && aml_bitmap_last(b) == 199);
	CHECK(aml_bitmap_clear_range(b, 100, 199) == AML_SUCCESS && aml_bitmap_nset(b) == 1);
	CHECK(aml_bitmap_dup(&c, b) == AML_SUCCESS && aml_bitmap_isequal(b, c) == 1);
	s = aml_bitmap_to_string(b);
	CHECK(s != NULL && s[0] == '[' && s[4] == '1' && s[AML_BITMAP_MAX + 1] == ']');
	CHECK(aml_bitmap_zero(c) == AML_SUCCESS && aml_bitmap_from_string(c, s) == 0);
	CHECK(aml_bitmap_isequal(b, c) == 1);
	free(s);
	CHECK(aml_bitmap_from_string(c, "1,7,2047") == 0 && aml_bitmap_nset(c) == 3);
	CHECK(aml_bitmap_isset(c, 2047) == 1);
	CHECK(aml_bitmap_from_string(c, "bogus") == -1 && aml_bitmap_nset(c) == 3);
	CHECK(aml_bitmap_from_string(c, "ALL") == 0 && aml_bitmap_isfull(c) == 1);
	CHECK(aml_bitmap_from_string(c, NULL) == 0 && aml_bitmap_iszero(c) == 1);
	aml_bitmap_copy_from_ulong(c, words, 64);
	CHECK(aml_bitmap_nset(c) == 2 && aml_bitmap_isset(c, 2) == 1);
	words[0] = 0;
	aml_bitmap_copy_to_ulong(c, words, 64);
	CHECK(words[0] == 0x5UL && words[1] == 0);
	aml_bitmap_destroy(&b);
	aml_bitmap_destroy(&c);
	CHECK(b == NULL && c == NULL);
	aml_bitmap_destroy(NULL);
	printf("bitmap: OK\n");
}

static void test_vector(void)
{
	struct aml_vector *v;
	int x[5] = {4, -1, 7, 0, 2}, out, key = 7;
	void *p;
	size_t n, pos;
	CHECK(aml_vector_create(&v, 0) == -AML_EINVAL);
	CHECK(aml_vector_create(&v, sizeof(int)) == AML_SUCCESS);
	for (int i = 0; i < 5; i++)
		CHECK(aml_vector_push_back(v, &x[i]) == AML_SUCCESS);
	CHECK(aml_vector_length(v, &n) == AML_SUCCESS && n == 5);
	CHECK(aml_vector_get(v, 5, &p) == -AML_EDOM);
	CHECK(aml_vector_get(v, 2, &p) == AML_SUCCESS && *(int *)p == 7);
	CHECK(aml_vector_find(v, &key, cmp_int, &pos) == AML_SUCCESS && pos == 2);
	CHECK(aml_vector_sort(v, cmp_int) == AML_SUCCESS);
	CHECK(aml_vector_bsearch(v, &key, cmp_int, &pos) == AML_SUCCESS && pos == 4);
	CHECK(aml_vector_take(v, 0, &out) == AML_SUCCESS && out == -1);
	CHECK(aml_vector_pop_back(v, &out) == AML_SUCCESS && out == 7);
	CHECK(aml_vector_resize(v, 10) == AML_SUCCESS);
	CHECK(aml_vector_get(v, 9, &p) == AML_SUCCESS && *(int *)p == 0);
	CHECK(aml_vector_resize(v, 0) == AML_SUCCESS && aml_vector_pop_back(v, &out) == -AML_EDOM);
	aml_vector_destroy(&v);
	CHECK(v == NULL);
	printf("vector: OK\n");
}

static void test_queue(void)
{
	struct aml_queue *q = aml_queue_create(2);
	int m[8];
	void **slot;
	size_t seen = 0;
	CHECK(q != NULL && aml_queue_len(q) == 0 && aml_queue_pop(q) == NULL);
	for (int i = 0; i < 8; i++)
		CHECK(aml_queue_push(q, &m[i]) == AML_SUCCESS);
	CHECK(aml_queue_len(q) == 8 && q->max == 8);
	CHECK(aml_queue_pop(q) == &m[0]);
	CHECK(aml_queue_find(q, &m[5], same_ptr, &slot) == AML_SUCCESS && *slot == &m[5]);
	CHECK(aml_queue_take(q, slot) == AML_SUCCESS && aml_queue_len(q) == 6);
	CHECK(aml_queue_find(q, &m[5], same_ptr, NULL) == -AML_EDOM);
	CHECK(aml_queue_get(q, 6, &slot) == -AML_EDOM);
	CHECK(aml_queue_get(q, 0, &slot) == AML_SUCCESS && *slot == &m[1]);
	for (slot = aml_queue_head(q); slot != NULL;
	     slot = aml_queue_next(q, (const void **)slot))
		seen++;
	CHECK(seen == 6);
	CHECK(aml_queue_take(q, q->elems + q->max) == -AML_EDOM);
	aml_queue_clear(q);
	CHECK(aml_queue_len(q) == 0 && aml_queue_head(q) == NULL);
	/* aml_queue_extend keeps a wrapped ring in order. */
	for (int i = 0; i < 8; i++)
		CHECK(aml_queue_push(q, &m[i]) == AML_SUCCESS);
	CHECK(aml_queue_pop(q) == &m[0] && aml_queue_pop(q) == &m[1]);
	CHECK(aml_queue_push(q, &m[0]) == AML_SUCCESS); /* wraps */
	CHECK(aml_queue_extend(q) == AML_SUCCESS && q->max == 16 && aml_queue_len(q) == 7);
	for (int i = 2; i < 8; i++)
		CHECK(aml_queue_pop(q) == &m[i]);
	CHECK(aml_queue_pop(q) == &m[0] && aml_queue_pop(q) == NULL);
	CHECK(aml_queue_extend(NULL) == -AML_EINVAL);
	aml_queue_destroy(q);
	printf("queue: OK\n");
}

static void test_version_and_malloc(void)
{
	CHECK(aml_version_major == AML_VERSION_MAJOR && aml_version_minor == AML_VERSION_MINOR);
	CHECK(aml_version_patch == AML_VERSION_PATCH);
	CHECK(strcmp(aml_version_string, AML_VERSION_STRING) == 0);
	CHECK(strcmp(aml_version_revision, AML_VERSION_REVISION) == 0);
#ifndef __cplusplus
	{
		/* a char, then a double (aligned), then 3 ints after them */
		char *p = (char *)AML_INNER_MALLOC_ARRAY(3, int, char, double);
		int *a = (int *)AML_INNER_MALLOC_GET_ARRAY(p, int, char, double);
		double *d = (double *)AML_INNER_MALLOC_GET_FIELD(p, 2, char, double);
		CHECK(p != NULL && (char *)d == p + offsetof(struct { char c; double d; }, d));
		CHECK((char *)a >= (char *)(d + 1) && a[2] == 0);
		a[2] = 1;
		free(p);
	}
#endif
	printf("version, inner malloc: OK\n");
}

/* The Linux backend's setup makes and releases the ready aml_dma_linux, as aml_init does. */
static void test_backend(void)
{
	char a[64], b[64];
	CHECK(aml_dma_linux == NULL);
	CHECK(aml_backend_linux_init() == AML_SUCCESS && aml_dma_linux != NULL);
	CHECK(aml_backend_linux_init() == AML_SUCCESS); /* there already */
	memset(a, 7, sizeof(a));
	CHECK(aml_dma_copy_custom(aml_dma_linux, (struct aml_layout *)b, (struct aml_layout *)a,
	                          aml_dma_linux_memcpy_op, (void *)sizeof(a)) == AML_SUCCESS);
	CHECK(memcmp(a, b, sizeof(a)) == 0);
	CHECK(aml_backend_linux_finalize() == AML_SUCCESS && aml_dma_linux == NULL);
	printf("backend: OK\n");
}

int main(void)
{
	test_backend();
	test_bitmap();
	test_vector();
	test_queue();
	test_version_and_malloc();
	printf("test_utils: OK\n");
	return 0;
}
