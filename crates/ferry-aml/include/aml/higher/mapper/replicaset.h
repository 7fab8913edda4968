/*
 * aml/higher/mapper/replicaset.h - replicas of a structure built by threads (libaml on
 * ferry): parts marked AML_MAPPER_REPLICASET_SHARED / GLOBAL are copied by one thread of the
 * group sharing the config and connected by the others, in lock step; LOCAL parts are copied
 * by each, in numbered rounds per config. AML's public config struct. A config serves one set
 * of builds between aml_replica_build_init and aml_replica_build_fini. No hwloc.
 */
#ifndef AML_HIGHER_MAPPER_REPLICASET_H
#define AML_HIGHER_MAPPER_REPLICASET_H 1

#include <pthread.h>
#include <semaphore.h>
#include "aml.h"
#include "aml/higher/mapper.h"
#include "aml/higher/mapper/deepcopy.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AML_MAPPER_REPLICASET_GLOBAL (AML_MAPPER_FLAG_SPLIT | 0x80000000)
#define AML_MAPPER_REPLICASET_SHARED (AML_MAPPER_FLAG_SPLIT | 0x40000000)
#define AML_MAPPER_REPLICASET_LOCAL (AML_MAPPER_FLAG_SPLIT | 0x20000000)

struct aml_mapper_visitor;

struct aml_shared_replica_config {
	struct aml_area *area;                   /* where copies go */
	struct aml_area_mmap_options *area_opts;
	struct aml_dma *dma_host_dst;
	aml_dma_operator memcpy_host_dst;
	unsigned int num_shared;                 /* the threads sharing the config */
	pthread_mutex_t producer;                /* held by the thread copying a part */
	sem_t consumed;
	sem_t produced;
	void *ptr;                               /* the part copied last */
};

/* A NULL out: aml_errno set to AML_EINVAL. */
void aml_replica_build_init(struct aml_shared_replica_config *out, unsigned num_sharing,
                            struct aml_area *area, struct aml_area_mmap_options *opts,
                            struct aml_dma *dma_host_dst, aml_dma_operator memcpy_host_dst);
void aml_replica_build_fini(struct aml_shared_replica_config *out);
/* Starts the thread; pthread_join gives the replica (NULL on failure, aml_errno set). Its
 * buffers are appended to replicaset_pointers (a UT_array of struct aml_mapped_ptr, passed as
 * itself, as AML) under replicaset_mutex. All the threads of a group must be started. */
int aml_mapper_replica_build_start(pthread_t *thread_handle, struct aml_mapper_visitor *visitor,
                                   struct aml_shared_replica_config *local,
                                   struct aml_shared_replica_config *shared,
                                   struct aml_shared_replica_config *global,
                                   aml_mapped_ptrs *replicaset_pointers,
                                   pthread_mutex_t *replicaset_mutex);

#ifdef __cplusplus
}
#endif

#endif /* AML_HIGHER_MAPPER_REPLICASET_H */
