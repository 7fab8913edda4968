/*
 * test_allocators.c - AML's allocators on libaml (aml/higher/allocator*.h): the generic calls,
 * the area, buddy and sized allocators over aml_area_linux (memory written and read back) and
 * over a counting area handing out addresses nobody may touch (the bookkeeping stays outside
 * the memory, as AML's tests need), the low-level buddy allocator, the chunk calls, the error
 * values, and libaml's internal/utarray.h. Common subset of C and C++; prints
 * "test_allocators: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/area/linux.h>
#include <aml/higher/allocator.h>
#include <aml/higher/allocator/area.h>
#include <aml/higher/allocator/buddy.h>
#include <aml/higher/allocator/sized.h>
#include <internal/utarray.h>

#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);      \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

/* An area handing out consecutive fake addresses (never dereferenced), counting calls. */
struct counting {
	size_t next, maps, unmaps, mapped;
};

static void *counting_mmap(const struct aml_area_data *data, size_t size,
                           struct aml_area_mmap_options *opts)
{
	struct counting *c = (struct counting *)data;
	(void)opts;
	void *p = (void *)c->next;
	c->next += size;
	c->maps++;
	c->mapped += size;
	return p;
}

static int counting_munmap(const struct aml_area_data *data, void *ptr, size_t size)
{
	struct counting *c = (struct counting *)data;
	(void)ptr;
	c->unmaps++;
	c->mapped -= size;
	return AML_SUCCESS;
}

static struct aml_area_ops counting_ops = {counting_mmap, counting_munmap, NULL};

static void test_generic(void)
{
	struct aml_allocator none = {NULL, NULL};
	struct aml_allocator_chunk chunk;
	aml_errno = 0;
	CHECK(aml_alloc(NULL, 8) == NULL && aml_errno == AML_EINVAL);
	CHECK(aml_alloc(&none, 8) == NULL && aml_errno == AML_EINVAL);
	CHECK(aml_free(NULL, NULL) == AML_SUCCESS);
	CHECK(aml_free(&none, &none) == -AML_EINVAL);
	CHECK(aml_allocator_alloc_chunk(NULL, 8) == NULL && aml_errno == AML_EINVAL);
	CHECK(aml_allocator_free_chunk(NULL, NULL) == AML_SUCCESS);
	CHECK(aml_allocator_free_chunk(&none, &chunk) == -AML_EINVAL);
	printf("generic: OK\n");
}

/* n allocations of size bytes, written, read back, freed in a mixed order. */
static void fill_and_free(struct aml_allocator *a, size_t size, int n)
{
	unsigned char *p[64];
	CHECK(n <= 64);
	for (int i = 0; i < n; i++) {
		p[i] = (unsigned char *)aml_alloc(a, size);
		CHECK(p[i] != NULL);
		memset(p[i], i + 1, size);
	}
	for (int i = 0; i < n; i++)
		for (size_t j = 0; j < size; j += 7)
			CHECK(p[i][j] == (unsigned char)(i + 1));
	for (int i = 0; i < n; i += 2)
		CHECK(aml_free(a, p[i]) == AML_SUCCESS);
	for (int i = 1; i < n; i += 2)
		CHECK(aml_free(a, p[i]) == AML_SUCCESS);
	CHECK(aml_free(a, p[0]) == -AML_EINVAL); /* freed already */
}

static void test_area_allocator(void)
{
	struct aml_allocator *a, *other;
	struct counting c = {4096, 0, 0, 0};
	struct aml_area fake = {&counting_ops, (struct aml_area_data *)&c};
	int x;
	CHECK(aml_allocator_area_create(NULL, &aml_area_linux, NULL) == -AML_EINVAL);
	CHECK(aml_allocator_area_create(&a, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_allocator_area_create(&a, &aml_area_linux, NULL) == AML_SUCCESS);
	CHECK(a->ops == &aml_allocator_area_ops && a->data != NULL);
	fill_and_free(a, 10000, 16);
	CHECK(aml_free(a, &x) == -AML_EINVAL);
	CHECK(aml_alloc(a, 0) == NULL && aml_errno == AML_EINVAL);
	CHECK(aml_allocator_alloc_chunk(a, 8) == NULL && aml_errno == AML_ENOTSUP);
	CHECK(aml_alloc(a, 100) != NULL); /* left allocated: destroy unmaps it */
	CHECK(aml_allocator_buddy_destroy(&a) == -AML_EINVAL && a != NULL); /* another kind */
	CHECK(aml_allocator_area_destroy(&a) == AML_SUCCESS && a == NULL);
	CHECK(aml_allocator_area_destroy(&a) == -AML_EINVAL);

	CHECK(aml_allocator_area_create(&other, &fake, NULL) == AML_SUCCESS);
	void *p = aml_alloc(other, 100), *q = aml_alloc(other, 50);
	CHECK(p == (void *)4096 && q == (void *)4196 && c.maps == 2);
	CHECK(aml_free(other, p) == AML_SUCCESS && c.unmaps == 1);
	CHECK(aml_allocator_area_destroy(&other) == AML_SUCCESS && c.unmaps == 2 && c.mapped == 0);
	printf("area allocator: OK\n");
}

static void test_buddy_allocator(void)
{
	struct aml_allocator *a;
	struct counting c = {1, 0, 0, 0}; /* odd addresses: never touched */
	struct aml_area fake = {&counting_ops, (struct aml_area_data *)&c};
	struct aml_allocator_chunk *ch[32];
	CHECK(aml_allocator_buddy_create(NULL, &aml_area_linux, NULL) == -AML_EINVAL);
	CHECK(aml_allocator_buddy_create(&a, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_allocator_buddy_create(&a, &aml_area_linux, NULL) == AML_SUCCESS);
	CHECK(a->ops == &aml_allocator_buddy_ops);
	fill_and_free(a, 3000, 40);
	fill_and_free(a, 1, 64);
	void *z = aml_alloc(a, 0); /* the smallest block, as AML */
	CHECK(z != NULL && aml_free(a, z) == AML_SUCCESS);
	CHECK(aml_allocator_buddy_destroy(&a) == AML_SUCCESS && a == NULL);

	CHECK(aml_allocator_buddy_create(&a, &fake, NULL) == AML_SUCCESS);
	CHECK(c.maps == 0);
	for (int i = 0; i < 32; i++) {
		size_t size = 1 + (size_t)i * 1000;
		ch[i] = aml_allocator_alloc_chunk(a, size);
		CHECK(ch[i] != NULL && ch[i]->size >= size && ch[i]->size >= 64);
		CHECK((ch[i]->size & (ch[i]->size - 1)) == 0 && ch[i]->user_data == NULL);
		CHECK(ch[i]->size < 2 * size || ch[i]->size == 64);
		ch[i]->user_data = ch[i];
	}
	/* Pools double: 32 chunks of up to 32 KiB fit in a handful of mappings. */
	CHECK(c.maps > 0 && c.maps < 12);
	for (int i = 0; i < 32; i += 2)
		CHECK(aml_allocator_free_chunk(a, ch[i]) == AML_SUCCESS);
	CHECK(aml_allocator_free_chunk(a, ch[0]) == -AML_EINVAL);
	for (int i = 1; i < 32; i += 4)
		CHECK(aml_free(a, ch[i]->ptr) == AML_SUCCESS); /* a chunk's pointer frees it too */
	size_t maps = c.maps;
	void *again = aml_alloc(a, 64); /* from the freed blocks, no new mapping */
	CHECK(again != NULL && c.maps == maps);
	/* Destroy with blocks still out: pools unmapped, chunks freed (valgrind checks). */
	CHECK(aml_allocator_buddy_destroy(&a) == AML_SUCCESS && c.mapped == 0);
	CHECK(c.unmaps == c.maps);
	printf("buddy allocator: OK\n");
}

static void test_low_level_buddy(void)
{
	struct buddy_allocator *b;
	void *p, *q, *r, *s;
	char *base = (char *)0x10000;
	CHECK(buddy_allocator_create(NULL) == -AML_EINVAL);
	CHECK(buddy_allocator_create(&b) == AML_SUCCESS);
	CHECK(buddy_allocator_alloc(b, &p, 64) == -AML_ENOMEM); /* no memory yet */
	CHECK(buddy_allocator_extend(b, NULL, 1024) == -AML_EINVAL);
	CHECK(buddy_allocator_extend(b, base, 1000) == -AML_EINVAL);
	CHECK(buddy_allocator_extend(b, base, 32) == -AML_EINVAL);
	CHECK(buddy_allocator_extend(b, base, 1024) == AML_SUCCESS);
	CHECK(buddy_allocator_extend(b, base + 512, 1024) == -AML_EINVAL); /* overlaps */
	CHECK(buddy_allocator_alloc(b, &p, 0) == -AML_EINVAL);
	CHECK(buddy_allocator_alloc(b, &p, 512) == AML_SUCCESS && p == base);
	CHECK(buddy_allocator_alloc(b, &q, 100) == AML_SUCCESS && q == base + 512);
	CHECK(buddy_allocator_alloc(b, &r, 64) == AML_SUCCESS && r == base + 640);
	CHECK(buddy_allocator_alloc(b, &s, 512) == -AML_ENOMEM);
	CHECK(buddy_allocator_destroy(&b) == -AML_EBUSY && b != NULL);
	CHECK(buddy_allocator_free(b, base + 1) == -AML_EINVAL);
	CHECK(buddy_allocator_free(b, q) == AML_SUCCESS && buddy_allocator_free(b, r) == AML_SUCCESS);
	CHECK(buddy_allocator_free(b, r) == -AML_EINVAL);
	CHECK(buddy_allocator_free(b, p) == AML_SUCCESS);
	/* Everything merged back: the whole region in one block. */
	CHECK(buddy_allocator_alloc(b, &s, 1024) == AML_SUCCESS && s == base);
	CHECK(buddy_allocator_free(b, s) == AML_SUCCESS);
	CHECK(buddy_allocator_destroy(&b) == AML_SUCCESS && b == NULL);
	CHECK(buddy_allocator_destroy(&b) == -AML_EINVAL);
	printf("low-level buddy: OK\n");
}

static void test_sized_allocator(void)
{
	struct aml_allocator *a;
	struct counting c = {4096, 0, 0, 0};
	struct aml_area fake = {&counting_ops, (struct aml_area_data *)&c};
	void *p[100];
	CHECK(aml_allocator_sized_create(&a, 0, &aml_area_linux, NULL) == -AML_EINVAL);
	CHECK(aml_allocator_sized_create(&a, 64, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_allocator_sized_create(&a, 48, &aml_area_linux, NULL) == AML_SUCCESS);
	CHECK(a->ops == &aml_allocator_sized);
	fill_and_free(a, 48, 64);
	CHECK(aml_alloc(a, 47) == NULL && aml_errno == AML_EINVAL);
	CHECK(aml_allocator_sized_destroy(&a) == AML_SUCCESS && a == NULL);

	CHECK(aml_allocator_sized_create(&a, 64, &fake, NULL) == AML_SUCCESS && c.maps == 1);
	for (int i = 0; i < 100; i++) {
		p[i] = aml_alloc(a, 64);
		CHECK(p[i] != NULL);
		for (int j = 0; j < i; j++)
			CHECK(p[j] != p[i]);
	}
	CHECK(c.maps <= 8); /* pools grow: 1, 1, 2, 4, ... chunks */
	CHECK(aml_free(a, p[5]) == AML_SUCCESS && aml_alloc(a, 64) == p[5]);
	CHECK(aml_allocator_sized_destroy(&a) == AML_SUCCESS && c.mapped == 0);
	printf("sized allocator: OK\n");
}

struct pair {
	void *ptr;
	size_t size;
};

static void test_utarray(void)
{
	UT_icd icd = {sizeof(struct pair), NULL, NULL, NULL};
	UT_array *arr;
	struct pair e;
	utarray_new(arr, &icd);
	for (size_t i = 0; i < 100; i++) {
		e.ptr = (void *)i;
		e.size = i * 2;
		utarray_push_back(arr, &e);
	}
	CHECK(utarray_len(arr) == 100);
	CHECK(((struct pair *)utarray_eltptr(arr, 42))->size == 84);
	CHECK(utarray_eltptr(arr, 100) == NULL);
	utarray_erase(arr, 10, 5);
	CHECK(utarray_len(arr) == 95 && ((struct pair *)utarray_eltptr(arr, 10))->size == 30);
	CHECK(((struct pair *)utarray_back(arr))->size == 198);
	utarray_pop_back(arr);
	CHECK(utarray_len(arr) == 94);
	utarray_free(arr);
	printf("utarray: OK\n");
}

int main(void)
{
	CHECK(aml_init(NULL, NULL) == AML_SUCCESS);
	test_generic();
	test_area_allocator();
	test_buddy_allocator();
	test_low_level_buddy();
	test_sized_allocator();
	test_utarray();
	CHECK(aml_finalize() == AML_SUCCESS);
	printf("test_allocators: OK\n");
	return 0;
}
