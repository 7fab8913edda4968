/*
 * aml/higher/replicaset.h - the generic replicaset (libaml on ferry): replicas of one buffer
 * and their methods. AML's only implementation needs hwloc, which libaml does not use; a
 * program may bring its own methods.
 */
#ifndef AML_HIGHER_REPLICASET_H
#define AML_HIGHER_REPLICASET_H 1

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct aml_replicaset_data;
struct aml_replicaset_ops;

struct aml_replicaset {
	unsigned int n;                /* replicas */
	size_t size;                   /* the size of one */
	void **replica;                /* their pointers */
	struct aml_replicaset_ops *ops;
	struct aml_replicaset_data *data;
};

struct aml_replicaset_ops {
	int (*init)(struct aml_replicaset *replicaset, const void *data);
	int (*sync)(struct aml_replicaset *replicaset, const unsigned int id);
};

/* -AML_EINVAL: NULL; -AML_ENOTSUP: no such method. */
int aml_replicaset_init(struct aml_replicaset *replicaset, const void *data);
int aml_replicaset_sync(struct aml_replicaset *replicaset, const unsigned int id);

#ifdef __cplusplus
}
#endif

#endif /* AML_HIGHER_REPLICASET_H */
