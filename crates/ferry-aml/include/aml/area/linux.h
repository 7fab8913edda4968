/*
 * aml/area/linux.h - host memory areas (libaml on ferry): mmap with AML's options, and NUMA
 * areas whose mappings the kernel binds (mbind, called directly: libaml does not need
 * libnuma). nodeset has the layout of libnuma's struct bitmask (size in bits, maskp) and lies
 * in the area's one malloc'd block.
 */
#ifndef AML_AREA_LINUX_NUMA_H
#define AML_AREA_LINUX_NUMA_H

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

extern struct aml_area_ops aml_area_linux_ops;
/* The ready area: no binding (data: &aml_area_linux_data_default). */
extern struct aml_area aml_area_linux;

enum aml_area_linux_policy {
	AML_AREA_LINUX_POLICY_DEFAULT,    /* the thread's policy; no mbind */
	AML_AREA_LINUX_POLICY_BIND,       /* the area's nodes only */
	AML_AREA_LINUX_POLICY_PREFERRED,  /* the area's node first */
	AML_AREA_LINUX_POLICY_INTERLEAVE, /* round-robin over the area's nodes */
};

struct bitmask; /* libnuma's: unsigned long size (bits); unsigned long *maskp */

struct aml_area_linux_data {
	struct bitmask *nodeset; /* NULL: no binding */
	enum aml_area_linux_policy policy;
};

extern struct aml_area_linux_data aml_area_linux_data_default;

/* mmap's arguments (pass as the struct aml_area_mmap_options * of aml_area_mmap). */
struct aml_area_linux_mmap_options {
	void *ptr;  /* address hint */
	int flags;  /* MAP_* */
	int mode;   /* PROT_* */
	int fd;     /* -1: anonymous */
	off_t offset;
};

/* nodemask NULL: every node this thread may use. -AML_EINVAL: NULL area, an unknown policy;
 * -AML_EDOM: a node this thread may not use; -AML_FAILURE: the kernel would not tell the
 * allowed nodes; -AML_ENOMEM. */
int aml_area_linux_create(struct aml_area **area, const struct aml_bitmap *nodemask,
                          const enum aml_area_linux_policy policy);
/* Frees the area (not its mappings) and sets *area to NULL; NULL: no-op. */
void aml_area_linux_destroy(struct aml_area **area);
/* Binds size bytes at ptr (page-aligned) as the area says (mbind, MPOL_MF_MOVE).
 * -AML_EINVAL: NULL bind, unknown policy; -AML_FAILURE: the kernel refused. */
int aml_area_linux_mbind(struct aml_area_linux_data *bind, void *ptr, size_t size);
/* 1 if the page at ptr is bound as the area says, 0 if not, -AML_EINVAL if unknown. */
int aml_area_linux_check_binding(struct aml_area_linux_data *area_data, void *ptr, size_t size);
/* mmap with opts (struct aml_area_linux_mmap_options *) or anonymous private read-write; no
 * binding. NULL with aml_errno (AML_ENOMEM, AML_FAILURE). */
void *aml_area_linux_mmap(const struct aml_area_data *area_data, size_t size,
                          struct aml_area_mmap_options *opts);
/* aml_area_linux_mmap, then aml_area_linux_mbind unless default policy without nodeset; a
 * failed binding unmaps and returns NULL. The area's mmap. */
void *aml_area_linux_mmap_mbind(const struct aml_area_data *area_data, size_t size,
                                struct aml_area_mmap_options *opts);
int aml_area_linux_munmap(const struct aml_area_data *area_data, void *ptr, const size_t size);
int aml_area_linux_fprintf(const struct aml_area_data *data, FILE *stream, const char *prefix);

#ifdef __cplusplus
}
#endif

#endif
