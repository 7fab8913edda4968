/*
 * test_replica.c - AML's replica build on libaml (aml/higher/mapper/replicaset.h): four
 * threads build replicas of a structure whose parts are LOCAL (one per replica), SHARED (one
 * per pair) and GLOBAL (one for all) into aml_area_linux through aml_dma_linux; their buffers
 * gathered in a program-made UT_array (libaml's internal/utarray.h) and freed by
 * aml_mapper_deepfree. Also the deep copy's list read as a UT_array, the generic replicaset
 * (aml/higher/replicaset.h) with the program's own methods, and the error values. Common
 * subset of C and C++; prints "test_replica: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/area/linux.h>
#include <aml/dma/linux.h>
#include <aml/higher/mapper.h>
#include <aml/higher/mapper/deepcopy.h>
#include <aml/higher/mapper/replicaset.h>
#include <aml/higher/mapper/visitor.h>
#include <aml/higher/replicaset.h>
#include <internal/utarray.h>

#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);      \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

struct cell {
	long v;
};
aml_final_mapper_decl(global_cell_mapper, AML_MAPPER_REPLICASET_GLOBAL, struct cell);
aml_final_mapper_decl(local_cell_mapper, AML_MAPPER_REPLICASET_LOCAL, struct cell);

struct pair {
	struct cell *g;
};
aml_mapper_decl(pair_mapper, AML_MAPPER_REPLICASET_SHARED, struct pair, g, &global_cell_mapper);

struct top {
	size_t npairs;
	struct pair *pairs;
	int nmine;
	struct cell *mine;
	unsigned nall;
	struct cell *all;
	long tag;
};
aml_mapper_decl(top_mapper, 0, struct top, pairs, npairs, &pair_mapper, mine, nmine,
                &local_cell_mapper, all, nall, &global_cell_mapper);

static int sync_calls;
static int my_init(struct aml_replicaset *r, const void *data)
{
	for (unsigned i = 0; i < r->n; i++)
		memcpy(r->replica[i], data, r->size);
	return AML_SUCCESS;
}
static int my_sync(struct aml_replicaset *r, const unsigned int id)
{
	(void)r;
	sync_calls += (int)id + 1;
	return AML_SUCCESS;
}

static void test_replicaset(void)
{
	long a = 0, b = 0, src = 42;
	void *reps[2] = {&a, &b};
	struct aml_replicaset_ops ops = {my_init, NULL};
	struct aml_replicaset r = {2, sizeof(long), reps, &ops, NULL};
	CHECK(aml_replicaset_init(NULL, &src) == -AML_EINVAL);
	CHECK(aml_replicaset_init(&r, NULL) == -AML_EINVAL);
	CHECK(aml_replicaset_init(&r, &src) == AML_SUCCESS && a == 42 && b == 42);
	CHECK(aml_replicaset_sync(&r, 1) == -AML_ENOTSUP);
	ops.sync = my_sync;
	CHECK(aml_replicaset_sync(&r, 1) == AML_SUCCESS && sync_calls == 2);
	CHECK(aml_replicaset_sync(NULL, 0) == -AML_EINVAL);
	printf("replicaset: OK\n");
}

static void test_build(void)
{
	struct cell g0 = {10}, g1 = {11}, mine = {7}, all = {99};
	struct pair pairs[2] = {{&g0}, {&g1}};
	struct top t = {2, pairs, 1, &mine, 1, &all, 5};
	struct aml_shared_replica_config global, shared[2], local[4];
	UT_icd icd = {sizeof(struct aml_mapped_ptr), NULL, NULL, aml_mapped_ptr_destroy};
	UT_array *ptrs;
	pthread_mutex_t mutex;
	pthread_t threads[4];
	struct top *rep[4];
	struct aml_mapper_visitor *v;

	aml_replica_build_init(&global, 4, &aml_area_linux, NULL, aml_dma_linux,
	                       aml_dma_linux_memcpy_op);
	for (int i = 0; i < 2; i++)
		aml_replica_build_init(shared + i, 2, &aml_area_linux, NULL, aml_dma_linux,
		                       aml_dma_linux_memcpy_op);
	for (int i = 0; i < 4; i++)
		aml_replica_build_init(local + i, 1, &aml_area_linux, NULL, aml_dma_linux,
		                       aml_dma_linux_memcpy_op);
	utarray_new(ptrs, &icd);
	pthread_mutex_init(&mutex, NULL);
	CHECK(aml_mapper_visitor_create(&v, &t, &top_mapper, aml_dma_linux,
	                                aml_dma_linux_memcpy_op) == AML_SUCCESS);
	CHECK(aml_mapper_replica_build_start(NULL, v, local, shared, &global,
	                                     (aml_mapped_ptrs *)ptrs, &mutex) == -AML_EINVAL);
	for (int i = 0; i < 4; i++)
		CHECK(aml_mapper_replica_build_start(threads + i, v, local + i, shared + i / 2,
		                                     &global, (aml_mapped_ptrs *)ptrs,
		                                     &mutex) == AML_SUCCESS);
	for (int i = 0; i < 4; i++) {
		void *ret;
		CHECK(pthread_join(threads[i], &ret) == 0);
		rep[i] = (struct top *)ret;
		CHECK(rep[i] != NULL && rep[i] != &t);
	}
	for (int i = 0; i < 4; i++) {
		CHECK(rep[i]->tag == 5 && rep[i]->npairs == 2 && rep[i]->mine->v == 7);
		CHECK(rep[i]->all->v == 99 && rep[i]->pairs[0].g->v == 10 && rep[i]->pairs[1].g->v == 11);
		CHECK(rep[i]->all != &all && rep[i]->pairs != pairs);
		for (int j = 0; j < i; j++)
			CHECK(rep[i]->mine != rep[j]->mine); /* local: one each */
		CHECK(rep[i]->all == rep[0]->all);       /* global: one for all */
		CHECK(rep[i]->pairs[1].g == rep[0]->pairs[1].g);
	}
	CHECK(rep[0]->pairs == rep[1]->pairs && rep[2]->pairs == rep[3]->pairs); /* shared: per pair */
	CHECK(rep[0]->pairs != rep[2]->pairs);
	/* 4 roots, 4 local cells, 2 pair arrays, 1 global cell, 2 global cells under the pairs. */
	CHECK(utarray_len(ptrs) == 13);
	CHECK(aml_mapper_visitor_destroy(v) == AML_SUCCESS);
	CHECK(aml_mapper_deepfree(ptrs) == AML_SUCCESS);
	pthread_mutex_destroy(&mutex);
	aml_replica_build_fini(&global);
	for (int i = 0; i < 2; i++)
		aml_replica_build_fini(shared + i);
	for (int i = 0; i < 4; i++)
		aml_replica_build_fini(local + i);
	aml_replica_build_init(NULL, 1, NULL, NULL, NULL, NULL);
	CHECK(aml_errno == AML_EINVAL);
	aml_replica_build_fini(NULL);
	printf("replica build: OK\n");
}

struct node {
	size_t n;
	struct cell *cells;
};
aml_mapper_decl(node_mapper, 0, struct node, cells, n, &global_cell_mapper);

static void test_deepcopy_list(void)
{
	struct cell cells[3] = {{1}, {2}, {3}};
	struct node n = {3, cells};
	aml_mapped_ptrs out;
	struct node *c = (struct node *)aml_mapper_deepcopy(&out, &n, &node_mapper, &aml_area_linux,
	                                                    NULL, NULL, aml_dma_linux, NULL,
	                                                    aml_dma_linux_memcpy_op);
	CHECK(c != NULL && c->cells[2].v == 3);
	UT_array *list = (UT_array *)out;
	CHECK(utarray_len(list) == 2); /* the node, the split cells */
	CHECK(((struct aml_mapped_ptr *)utarray_eltptr(list, 0))->ptr == c);
	CHECK(((struct aml_mapped_ptr *)utarray_eltptr(list, 1))->area == &aml_area_linux);
	CHECK(aml_mapper_deepfree(out) == AML_SUCCESS);
	printf("deepcopy list: OK\n");
}

int main(void)
{
	CHECK(aml_init(NULL, NULL) == AML_SUCCESS);
	test_replicaset();
	test_build();
	test_deepcopy_list();
	CHECK(aml_finalize() == AML_SUCCESS);
	printf("test_replica: OK\n");
	return 0;
}
