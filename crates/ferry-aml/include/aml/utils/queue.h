/*
 * aml/utils/queue.h - a FIFO of pointers in a ring (libaml on ferry; AML's public struct:
 * elements from head to tail, exclusive, modulo max; a full ring doubles).
 */
#ifndef AML_QUEUE_H
#define AML_QUEUE_H 1

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct aml_queue {
	size_t max;   /* capacity */
	size_t head;  /* index of the first element */
	size_t tail;  /* index one past the last element */
	size_t len;   /* number of elements */
	void **elems; /* max slots */
};

/* NULL when out of memory. */
struct aml_queue *aml_queue_create(const size_t max);
void aml_queue_clear(struct aml_queue *q);
void aml_queue_destroy(struct aml_queue *q);
size_t aml_queue_len(const struct aml_queue *q);
int aml_queue_push(struct aml_queue *q, void *element);
/* Doubles the capacity (at least one slot), the elements kept in order (AML exports it
 * without declaring it). -AML_EINVAL: NULL. */
int aml_queue_extend(struct aml_queue *q);
/* NULL if empty. */
void *aml_queue_pop(struct aml_queue *q);
/* The slot of the first e with comp(e, key) == 0 in *out (may be NULL); -AML_EDOM: none. */
int aml_queue_find(struct aml_queue *q, const void *key, int comp(const void *, const void *),
                   void ***out);
int aml_queue_get(const struct aml_queue *q, size_t index, void ***out);
/* Removes the element in slot `element`; -AML_EDOM: the slot holds none. */
int aml_queue_take(struct aml_queue *q, void **element);
void **aml_queue_head(const struct aml_queue *q);
void **aml_queue_next(const struct aml_queue *q, const void **current);

#ifdef __cplusplus
}
#endif

#endif /* AML_QUEUE_H */
