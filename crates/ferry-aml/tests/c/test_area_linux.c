/*
 * test_area_linux.c - AML's Linux area on libaml: the ready area, NUMA areas of every policy
 * (the kernel's binding checked page by page), mmap options (a shared file mapping), the
 * nodeset's libnuma layout, printout and errors. Common subset of C and C++; prints
 * "test_area_linux: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/area/linux.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);      \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

/* libnuma's struct bitmask, which the area's nodeset is laid out as. */
struct nodes {
	unsigned long size;
	unsigned long *maskp;
};

static const size_t MiB = 1 << 20;

static int prints(const struct aml_area *a, const char *want)
{
	char buf[4096];
	size_t n;
	FILE *f = tmpfile();
	CHECK(f != NULL);
	CHECK(aml_area_fprintf(f, "t", a) == AML_SUCCESS);
	rewind(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return strstr(buf, want) != NULL;
}

/* Maps, touches and checks the binding of every page, unmaps. */
static void map_bound(struct aml_area *a)
{
	struct aml_area_linux_data *d = (struct aml_area_linux_data *)a->data;
	char *p = (char *)aml_area_mmap(a, MiB, NULL);
	CHECK(p != NULL);
	memset(p, 7, MiB);
	for (size_t off = 0; off < MiB; off += 4096)
		CHECK(aml_area_linux_check_binding(d, p + off, 4096) == 1);
	CHECK(aml_area_munmap(a, p, MiB) == AML_SUCCESS);
}

int main(void)
{
	static const enum aml_area_linux_policy policies[4] = {
	        AML_AREA_LINUX_POLICY_DEFAULT, AML_AREA_LINUX_POLICY_BIND,
	        AML_AREA_LINUX_POLICY_PREFERRED, AML_AREA_LINUX_POLICY_INTERLEAVE};
	static const char *names[4] = {"policy: default", "policy: bind", "policy: preferred",
	                                "policy: interleave"};
	struct aml_area *a;
	struct aml_bitmap mask;
	struct nodes *n;
	int first;
	char *p;

	/* A container whose seccomp profile refuses the NUMA system calls: nothing to test. */
	{
		unsigned long m[AML_BITMAP_MAX / (8 * sizeof(unsigned long))] = {0};
		int mode = 0;
		if (syscall(SYS_get_mempolicy, &mode, m, (unsigned long)AML_BITMAP_MAX, NULL, 0UL) != 0 &&
		    (errno == ENOSYS || errno == EPERM)) {
			printf("test_area_linux: skipped: get_mempolicy refused: %s\n", strerror(errno));
			return 0;
		}
	}

	/* The ready area: no binding. */
	CHECK(aml_area_linux.data == (struct aml_area_data *)&aml_area_linux_data_default);
	CHECK(aml_area_linux_data_default.nodeset == NULL);
	p = (char *)aml_area_mmap(&aml_area_linux, MiB, NULL);
	CHECK(p != NULL);
	memset(p, 1, MiB);
	CHECK(aml_area_munmap(&aml_area_linux, p, MiB) == AML_SUCCESS);
	CHECK(prints(&aml_area_linux, "t: bitmask: 0x0\nt: policy: default\n"));

	/* Every policy over every allowed node (NULL nodemask). */
	for (int i = 0; i < 4; i++) {
		CHECK(aml_area_linux_create(&a, NULL, policies[i]) == AML_SUCCESS);
		n = (struct nodes *)((struct aml_area_linux_data *)a->data)->nodeset;
		CHECK(n != NULL && n->size == AML_BITMAP_MAX && n->maskp != NULL);
		map_bound(a);
		CHECK(prints(a, names[i]));
		CHECK(prints(a, "t: bitmask: size: 2048\n"));
		aml_area_linux_destroy(&a);
		CHECK(a == NULL);
	}

	/* Bound to the first allowed node only. */
	CHECK(aml_area_linux_create(&a, NULL, AML_AREA_LINUX_POLICY_BIND) == AML_SUCCESS);
	n = (struct nodes *)((struct aml_area_linux_data *)a->data)->nodeset;
	aml_bitmap_copy_from_ulong(&mask, n->maskp, n->size);
	aml_area_linux_destroy(&a);
	first = aml_bitmap_first(&mask);
	CHECK(first >= 0);
	aml_bitmap_zero(&mask);
	aml_bitmap_set(&mask, first);
	CHECK(aml_area_linux_create(&a, &mask, AML_AREA_LINUX_POLICY_BIND) == AML_SUCCESS);
	map_bound(a);
	aml_area_linux_destroy(&a);
	CHECK(aml_area_linux_create(&a, &mask, AML_AREA_LINUX_POLICY_INTERLEAVE) == AML_SUCCESS);
	map_bound(a);

	/* A shared file mapping through the options, bound too. */
	{
		char name[] = "/tmp/test_area_linux_XXXXXX";
		char buf[4096];
		struct aml_area_linux_mmap_options o;
		int fd = mkstemp(name);
		CHECK(fd >= 0);
		unlink(name);
		memset(buf, 5, sizeof(buf));
		CHECK(write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf));
		o.ptr = NULL;
		o.flags = MAP_SHARED;
		o.mode = PROT_READ | PROT_WRITE;
		o.fd = fd;
		o.offset = 0;
		p = (char *)aml_area_mmap(a, sizeof(buf), (struct aml_area_mmap_options *)&o);
		CHECK(p != NULL && p[0] == 5 && p[4095] == 5);
		CHECK(aml_area_munmap(a, p, sizeof(buf)) == AML_SUCCESS);
		/* A bad file: NULL with aml_errno. */
		o.fd = 1000000;
		CHECK(aml_area_mmap(a, sizeof(buf), (struct aml_area_mmap_options *)&o) == NULL);
		CHECK(aml_errno == AML_FAILURE);
		close(fd);
	}
	aml_area_linux_destroy(&a);

	/* Errors. */
	aml_bitmap_zero(&mask);
	aml_bitmap_set(&mask, AML_BITMAP_MAX - 1);
	CHECK(aml_area_linux_create(&a, &mask, AML_AREA_LINUX_POLICY_BIND) == -AML_EDOM);
	CHECK(a == NULL);
	CHECK(aml_area_linux_create(&a, NULL, (enum aml_area_linux_policy)9) == -AML_EINVAL);
	CHECK(aml_area_linux_create(NULL, NULL, AML_AREA_LINUX_POLICY_BIND) == -AML_EINVAL);
	CHECK(aml_area_linux_mbind(NULL, NULL, 0) == -AML_EINVAL);
	CHECK(aml_area_linux_check_binding(NULL, NULL, 0) == -AML_EINVAL);
	aml_area_linux_destroy(NULL);
	a = NULL;
	aml_area_linux_destroy(&a);
	printf("test_area_linux: OK\n");
	return 0;
}
