/*
 * aml/utils/vector.h - a growable array of fixed-size elements (libaml on ferry). Pointers
 * from aml_vector_get stay valid until the length changes.
 */
#ifndef AML_VECTOR_H
#define AML_VECTOR_H 1

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct aml_vector;

int aml_vector_length(const struct aml_vector *vector, size_t *length);
/* -AML_EINVAL: NULL vector or out; -AML_EDOM: index out of bounds. */
int aml_vector_get(const struct aml_vector *vector, size_t index, void **out);
/* First e with comp(key, e) == 0; pos may be NULL. -AML_FAILURE: none. */
int aml_vector_find(const struct aml_vector *vector, const void *key,
                    int (*comp)(const void *, const void *), size_t *pos);
int aml_vector_sort(struct aml_vector *vector, int (*comp)(const void *, const void *));
int aml_vector_bsearch(const struct aml_vector *vector, const void *key,
                       int (*comp)(const void *, const void *), size_t *pos);
/* New elements are zeroed. */
int aml_vector_resize(struct aml_vector *vector, size_t newlen);
int aml_vector_push_back(struct aml_vector *vector, const void *element);
/* -AML_EINVAL: NULL vector or out; -AML_EDOM: empty. */
int aml_vector_pop_back(struct aml_vector *vector, void *out);
int aml_vector_take(struct aml_vector *vector, const size_t position, void *out);
int aml_vector_create(struct aml_vector **vector, const size_t element_size);
void aml_vector_destroy(struct aml_vector **vector);

#ifdef __cplusplus
}
#endif

#endif /* AML_VECTOR_H */
