/*
 * test_mapper.c - AML's mappers on libaml (aml/higher/mapper.h, aml/higher/mapper/visitor.h):
 * the declaration macros (triples with counts of any integer type, pairs, final), the ready
 * mappers, aml_mapper_create / destroy, the visitor over a tree of structures read by the
 * host and through aml_dma_linux with its memcpy operator (the walk, the size, the match),
 * the creator (next, connect, branch, finish, abort) and the deep copy into aml_area_linux
 * and on the host (aml/higher/mapper/{creator,deepcopy}.h), split fields and empty ones.
 * Common subset of C and C++; prints "test_mapper: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/dma/linux.h>
#include <aml/higher/mapper.h>
#include <aml/area/linux.h>
#include <aml/higher/mapper/creator.h>
#include <aml/higher/mapper/deepcopy.h>
#include <aml/higher/mapper/visitor.h>

#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);      \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

struct leaf {
	int v;
	double w;
};
aml_final_mapper_decl(leaf_mapper, 0, struct leaf);

struct node {
	unsigned short nleaves; /* a count narrower than size_t, read as its own type */
	struct leaf *leaves;
	char tag;
	int *values;
	size_t nvalues;
};
aml_mapper_decl(node_mapper, 0, struct node, leaves, nleaves, &leaf_mapper, values, nvalues,
                &aml_int_mapper);

struct root {
	long id;
	struct node *node;
	struct leaf *split;
};
aml_final_mapper_decl(leaf_split_mapper, AML_MAPPER_FLAG_SPLIT, struct leaf);
aml_mapper_decl(root_mapper, 0, struct root, node, &node_mapper, split, &leaf_split_mapper);

static void test_decl(void)
{
	CHECK(leaf_mapper.size == sizeof(struct leaf) && leaf_mapper.n_fields == 0);
	CHECK(node_mapper.n_fields == 2 && node_mapper.size == sizeof(struct node));
	CHECK(node_mapper.offsets[0] == offsetof(struct node, leaves));
	CHECK(node_mapper.offsets[1] == offsetof(struct node, values));
	CHECK(node_mapper.fields[0] == &leaf_mapper && node_mapper.fields[1] == &aml_int_mapper);
	struct node n;
	memset(&n, 0xff, sizeof(n)); /* padding set: a size_t read would see it */
	n.nleaves = 3;
	n.nvalues = 7;
	CHECK(node_mapper.num_elements[0](&n) == 3 && node_mapper.num_elements[1](&n) == 7);
	CHECK(root_mapper.n_fields == 2 && root_mapper.num_elements[0] == NULL);
	CHECK(aml_int_mapper.size == sizeof(int) && aml_ptr_mapper.size == sizeof(void *));
	CHECK(aml_long_double_mapper.size == sizeof(long double));
	CHECK(aml_double_split_mapper.flags == AML_MAPPER_FLAG_SPLIT && aml_double_mapper.flags == 0);
	printf("declarations: OK\n");
}

static void test_create(void)
{
	struct aml_mapper *m, *none;
	size_t offsets[2] = {offsetof(struct node, leaves), offsetof(struct node, values)};
	struct aml_mapper *fields[2] = {&leaf_mapper, &aml_int_mapper};
	CHECK(aml_mapper_create(NULL, 0, 8, 0, NULL, NULL, NULL) == -AML_EINVAL);
	CHECK(aml_mapper_create(&m, 0, 8, 2, NULL, NULL, fields) == -AML_EINVAL);
	CHECK(aml_mapper_create(&m, AML_MAPPER_FLAG_SPLIT, sizeof(struct node), 2, offsets, NULL,
	                        fields) == AML_SUCCESS);
	offsets[0] = 99; /* copied */
	CHECK(m->n_fields == 2 && m->offsets[0] == offsetof(struct node, leaves));
	CHECK(m->num_elements == NULL && m->fields[1] == &aml_int_mapper);
	CHECK(m->flags == AML_MAPPER_FLAG_SPLIT);
	aml_mapper_destroy(&m);
	CHECK(m == NULL);
	aml_mapper_destroy(&m);
	aml_mapper_destroy(NULL);
	CHECK(aml_mapper_create(&none, 0, 4, 0, NULL, NULL, NULL) == AML_SUCCESS);
	CHECK(none->offsets == NULL && none->size == 4);
	aml_mapper_destroy(&none);
	printf("create: OK\n");
}

static struct leaf leaves[3] = {{1, 1.5}, {2, 2.5}, {3, 3.5}};
static int values[4] = {10, 20, 30, 40};
static struct leaf lone = {9, 9.5};

static void visit(struct aml_dma *dma, aml_dma_operator op)
{
	struct node n;
	struct root r;
	struct aml_mapper_visitor *v, *w;
	size_t size;
	memset(&n, 0, sizeof(n));
	n.nleaves = 3;
	n.leaves = leaves;
	n.tag = 'x';
	n.values = values;
	n.nvalues = 4;
	memset(&r, 0, sizeof(r));
	r.id = 5;
	r.node = &n;
	r.split = &lone;

	CHECK(aml_mapper_visitor_create(NULL, &r, &root_mapper, dma, op) == -AML_EINVAL);
	CHECK(aml_mapper_visitor_create(&v, NULL, &root_mapper, dma, op) == -AML_EINVAL);
	CHECK(aml_mapper_visitor_create(&v, &r, &root_mapper, dma, op) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_ptr(v) == &r && aml_mapper_visitor_array_len(v) == 1);
	CHECK(aml_mapper_visitor_parent(v) == -AML_EDOM && aml_mapper_visitor_ptr(v) == &r);
	CHECK(aml_mapper_visitor_next_field(v) == -AML_EDOM);
	CHECK(aml_mapper_visitor_first_field(v) == AML_SUCCESS && aml_mapper_visitor_ptr(v) == &n);
	CHECK(aml_mapper_visitor_first_field(v) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_ptr(v) == leaves && aml_mapper_visitor_is_array(v));
	CHECK(aml_mapper_visitor_array_len(v) == 3);
	CHECK(aml_mapper_visitor_first_field(v) == -AML_EDOM); /* a leaf has no field */
	CHECK(aml_mapper_visitor_prev_array_element(v) == -AML_EDOM);
	CHECK(aml_mapper_visitor_next_array_element(v) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_next_array_element(v) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_ptr(v) == &leaves[2]);
	CHECK(aml_mapper_visitor_next_array_element(v) == -AML_EDOM);
	CHECK(aml_mapper_visitor_prev_array_element(v) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_ptr(v) == &leaves[1]);
	CHECK(aml_mapper_visitor_next_field(v) == AML_SUCCESS && aml_mapper_visitor_ptr(v) == values);
	CHECK(aml_mapper_visitor_array_len(v) == 4);
	CHECK(aml_mapper_visitor_next_field(v) == -AML_EDOM);
	CHECK(aml_mapper_visitor_prev_field(v) == AML_SUCCESS && aml_mapper_visitor_ptr(v) == leaves);
	CHECK(aml_mapper_visitor_prev_field(v) == -AML_EDOM);
	CHECK(aml_mapper_visitor_subtree(v, &w) == AML_SUCCESS);
	/* A subtree is the element visited (its array aside), as AML. */
	CHECK(aml_mapper_visitor_size(w, &size) == AML_SUCCESS && size == sizeof(struct leaf));
	CHECK(aml_mapper_visitor_destroy(w) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_parent(v) == AML_SUCCESS && aml_mapper_visitor_ptr(v) == &n);
	CHECK(aml_mapper_visitor_next_field(v) == AML_SUCCESS && aml_mapper_visitor_ptr(v) == &lone);
	CHECK(aml_mapper_visitor_parent(v) == AML_SUCCESS && aml_mapper_visitor_ptr(v) == &r);
	/* The root, the node, its leaves and values; the split leaf aside. */
	CHECK(aml_mapper_visitor_size(v, &size) == AML_SUCCESS);
	CHECK(size == sizeof(r) + sizeof(n) + sizeof(leaves) + sizeof(values));

	/* A copy matches; a changed value, count or byte between pointers does not. */
	struct leaf leaves2[3];
	int values2[4];
	struct node n2;
	struct root r2;
	struct leaf lone2 = lone;
	memcpy(leaves2, leaves, sizeof(leaves));
	memcpy(values2, values, sizeof(values));
	n2 = n;
	n2.leaves = leaves2;
	n2.values = values2;
	r2 = r;
	r2.node = &n2;
	r2.split = &lone2;
	CHECK(aml_mapper_visitor_create(&w, &r2, &root_mapper, dma, op) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_match(v, w) == 1);
	values2[3] = 41;
	CHECK(aml_mapper_visitor_match(v, w) == 0);
	values2[3] = 40;
	n2.tag = 'y';
	CHECK(aml_mapper_visitor_match(v, w) == 0);
	n2.tag = 'x';
	n2.nvalues = 3;
	CHECK(aml_mapper_visitor_match(v, w) == 0);
	n2.nvalues = 4;
	lone2.v = 0;
	CHECK(aml_mapper_visitor_match(v, w) == 0);
	lone2.v = lone.v;
	CHECK(aml_mapper_visitor_match(v, w) == 1);
	n2.values = NULL;
	n2.nvalues = 0; /* an empty array: nothing to read, but not the same */
	CHECK(aml_mapper_visitor_match(v, w) == 0);
	CHECK(aml_mapper_visitor_match(NULL, w) == -AML_EINVAL);
	CHECK(aml_mapper_visitor_destroy(w) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_destroy(v) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_destroy(NULL) == -AML_EINVAL);
	CHECK(aml_mapper_visitor_ptr(NULL) == NULL && aml_mapper_visitor_array_len(NULL) == 0);
	CHECK(aml_mapper_visitor_first_field(NULL) == -AML_EINVAL);
}

aml_mapper_decl(node_host_mapper, AML_MAPPER_FLAG_HOST, struct node, leaves, nleaves,
                &leaf_mapper, values, nvalues, &aml_int_mapper);

struct bag {
	size_t n;
	struct leaf *items;
};
aml_mapper_decl(bag_mapper, 0, struct bag, items, n, &leaf_split_mapper);
aml_mapper_decl(bag_packed_mapper, 0, struct bag, items, n, &leaf_mapper);

/* Whether the copy at c matches the original at o, pointers aside. */
static int same(void *o, void *c, struct aml_mapper *m)
{
	struct aml_mapper_visitor *a, *b;
	CHECK(aml_mapper_visitor_create(&a, o, m, NULL, NULL) == AML_SUCCESS);
	CHECK(aml_mapper_visitor_create(&b, c, m, NULL, NULL) == AML_SUCCESS);
	int r = aml_mapper_visitor_match(a, b);
	CHECK(aml_mapper_visitor_destroy(a) == AML_SUCCESS && aml_mapper_visitor_destroy(b) == AML_SUCCESS);
	return r;
}

static void test_deepcopy(void)
{
	struct node n;
	struct root r;
	aml_mapped_ptrs ptrs;
	memset(&n, 0, sizeof(n));
	n.nleaves = 3;
	n.leaves = leaves;
	n.tag = 'q';
	n.values = values;
	n.nvalues = 4;
	memset(&r, 0, sizeof(r));
	r.id = 7;
	r.node = &n;
	r.split = &lone;

	/* Into an area through a dma: two buffers (the split leaf apart). */
	struct root *c = (struct root *)aml_mapper_deepcopy(&ptrs, &r, &root_mapper, &aml_area_linux,
	                                                    NULL, NULL, aml_dma_linux, NULL,
	                                                    aml_dma_linux_memcpy_op);
	CHECK(c != NULL && c != &r && c->node != &n && c->split != &lone);
	CHECK(c->node->leaves != leaves && c->node->values[3] == 40 && c->split->v == 9);
	CHECK((char *)c->node == (char *)c + sizeof(struct root)); /* packed */
	CHECK(same(&r, c, &root_mapper) == 1);
	CHECK(aml_mapper_deepfree(ptrs) == AML_SUCCESS);
	CHECK(aml_mapper_deepfree(NULL) == -AML_EINVAL);

	/* On the host. */
	struct node *h = (struct node *)aml_mapper_deepcopy(&ptrs, &n, &node_host_mapper, NULL, NULL,
	                                                    NULL, NULL, NULL, NULL);
	CHECK(h != NULL && h->values != values && h->leaves[2].w == 3.5 && h->tag == 'q');
	CHECK(same(&n, h, &node_mapper) == 1);
	CHECK(aml_mapper_deepfree(ptrs) == AML_SUCCESS);

	/* An empty split field stays NULL; a NULL field with elements is refused, nothing kept. */
	struct bag b = {0, NULL};
	struct bag *bc = (struct bag *)aml_mapper_deepcopy(&ptrs, &b, &bag_mapper, &aml_area_linux,
	                                                   NULL, NULL, aml_dma_linux, NULL,
	                                                   aml_dma_linux_memcpy_op);
	CHECK(bc != NULL && bc->n == 0 && bc->items == NULL);
	CHECK(aml_mapper_deepfree(ptrs) == AML_SUCCESS);
	b.n = 2;
	aml_errno = 0;
	CHECK(aml_mapper_deepcopy(&ptrs, &b, &bag_packed_mapper, &aml_area_linux, NULL, NULL,
	                          aml_dma_linux, NULL, aml_dma_linux_memcpy_op) == NULL);
	CHECK(aml_errno == AML_EINVAL);
	CHECK(aml_mapper_deepcopy(NULL, &r, &root_mapper, &aml_area_linux, NULL, NULL, aml_dma_linux,
	                          NULL, aml_dma_linux_memcpy_op) == NULL && aml_errno == AML_EINVAL);
	printf("deepcopy: OK\n");

	/* The creator by hand: the split leaf connected to an existing copy. */
	struct aml_mapper_creator *cr, *br;
	void *out;
	size_t size;
	CHECK(aml_mapper_creator_create(NULL, &r, 0, &root_mapper, &aml_area_linux, NULL, NULL,
	                                aml_dma_linux, NULL, aml_dma_linux_memcpy_op) == -AML_EINVAL);
	CHECK(aml_mapper_creator_create(&cr, &r, 0, &root_mapper, NULL, NULL, NULL, NULL, NULL,
	                                NULL) == -AML_EINVAL);
	CHECK(aml_mapper_creator_create(&cr, &r, 0, &root_mapper, &aml_area_linux, NULL, NULL,
	                                aml_dma_linux, NULL, aml_dma_linux_memcpy_op) == AML_SUCCESS);
	CHECK(cr->size == sizeof(r) + sizeof(n) + sizeof(leaves) + sizeof(values));
	int err;
	while ((err = aml_mapper_creator_next(cr)) == AML_SUCCESS)
		;
	CHECK(err == -AML_EINVAL); /* the split leaf */
	CHECK(aml_mapper_creator_finish(cr, &out, &size) == -AML_EINVAL);
	CHECK(aml_mapper_creator_connect(cr, NULL) == -AML_EINVAL);
	CHECK(aml_mapper_creator_connect(cr, &lone) == -AML_EDOM);
	CHECK(aml_mapper_creator_next(cr) == -AML_EDOM);
	CHECK(aml_mapper_creator_finish(cr, &out, &size) == AML_SUCCESS);
	CHECK(((struct root *)out)->split == &lone && ((struct root *)out)->id == 7);
	CHECK(same(&r, out, &root_mapper) == 1);
	CHECK(aml_area_munmap(&aml_area_linux, out, size) == AML_SUCCESS);

	/* Branch, then abort both midway: nothing leaks. */
	CHECK(aml_mapper_creator_create(&cr, &r, 0, &root_mapper, &aml_area_linux, NULL, NULL,
	                                aml_dma_linux, NULL, aml_dma_linux_memcpy_op) == AML_SUCCESS);
	while ((err = aml_mapper_creator_next(cr)) == AML_SUCCESS)
		;
	CHECK(aml_mapper_creator_branch(&br, cr, NULL, NULL, aml_dma_linux,
	                                aml_dma_linux_memcpy_op) == -AML_EINVAL);
	CHECK(aml_mapper_creator_branch(&br, cr, &aml_area_linux, NULL, aml_dma_linux,
	                                aml_dma_linux_memcpy_op) == -AML_EDOM);
	CHECK(br != NULL && br->size == sizeof(struct leaf));
	CHECK(aml_mapper_creator_abort(br) == AML_SUCCESS);
	CHECK(aml_mapper_creator_abort(cr) == AML_SUCCESS);
	CHECK(aml_mapper_creator_abort(NULL) == -AML_EINVAL);
	CHECK(aml_mapper_creator_next(NULL) == -AML_EINVAL);
	printf("creator: OK\n");
}

int main(void)
{
	CHECK(aml_init(NULL, NULL) == AML_SUCCESS);
	test_decl();
	test_create();
	visit(NULL, NULL);
	printf("visitor (host): OK\n");
	visit(aml_dma_linux, aml_dma_linux_memcpy_op);
	printf("visitor (dma): OK\n");
	test_deepcopy();
	CHECK(aml_finalize() == AML_SUCCESS);
	printf("test_mapper: OK\n");
	return 0;
}
