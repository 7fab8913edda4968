/*
 * aml/layout/dense.h - dense layouts (libaml on ferry). Native storage is column-major:
 * dims innermost first; stride in elements; cpitch the cumulative pitch in bytes
 * (cpitch[0] = element size). A layout is one malloc'd block: free() releases it too.
 */
#ifndef AML_AREA_LAYOUT_DENSE_H
#define AML_AREA_LAYOUT_DENSE_H

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

struct aml_layout_dense {
	void *ptr;      /* address of element (0, ..., 0) */
	size_t ndims;   /* no fixed limit */
	size_t *dims;   /* native order */
	size_t *stride; /* elements between consecutive elements of a dim */
	size_t *cpitch; /* cumulative pitch in bytes; cpitch[0] = element size */
};

/* order: AML_LAYOUT_ORDER_COLUMN_MAJOR (0) or AML_LAYOUT_ORDER_ROW_MAJOR (1); dims, stride
 * (NULL: 1) and pitch (elements between consecutive indices of the next dim; NULL: dims, as
 * AML, even with strides: elements may then overlap) in that order. -AML_EINVAL: NULL
 * layout/ptr/dims, element_size or ndims 0, unknown order, a zero dim or stride, a given pitch
 * too small; -AML_ENOMEM. */
int aml_layout_dense_create(struct aml_layout **layout, void *ptr, const int order,
                            const size_t element_size, const size_t ndims, const size_t *dims,
                            const size_t *stride, const size_t *pitch);

void *aml_layout_column_deref(const struct aml_layout_data *data, const size_t *coords);
int aml_layout_column_order(const struct aml_layout_data *data);
size_t aml_layout_dense_ndims(const struct aml_layout_data *data);
size_t aml_layout_dense_element_size(const struct aml_layout_data *data);
int aml_layout_column_reshape(const struct aml_layout_data *data, struct aml_layout **output,
                              size_t ndims, const size_t *dims);
int aml_layout_column_slice(const struct aml_layout_data *data, struct aml_layout **output,
                            const size_t *offsets, const size_t *dims, const size_t *strides);
void *aml_layout_row_deref(const struct aml_layout_data *data, const size_t *coords);
int aml_layout_row_order(const struct aml_layout_data *data);
int aml_layout_row_dims(const struct aml_layout_data *data, size_t *dims);
int aml_layout_row_reshape(const struct aml_layout_data *data, struct aml_layout **output,
                           const size_t ndims, const size_t *dims);
int aml_layout_row_slice(const struct aml_layout_data *data, struct aml_layout **output,
                         const size_t *offsets, const size_t *dims, const size_t *strides);
int aml_layout_row_slice_native(const struct aml_layout_data *data, struct aml_layout **output,
                                const size_t *offsets, const size_t *dims,
                                const size_t *strides);
/* The dense layouts' other methods, which AML exports without declaring. */
void *aml_layout_dense_rawptr(const struct aml_layout_data *data);
int aml_layout_column_dims(const struct aml_layout_data *data, size_t *dims);
int aml_layout_column_fprintf(const struct aml_layout_data *data, FILE *stream,
                              const char *prefix);
int aml_layout_row_fprintf(const struct aml_layout_data *data, FILE *stream, const char *prefix);
/* ptr NULL: the same pointer. -AML_EINVAL: NULL, or not a dense layout. */
int aml_layout_dense_duplicate(const struct aml_layout *layout, struct aml_layout **out,
                               void *ptr);

extern struct aml_layout_ops aml_layout_column_ops;
extern struct aml_layout_ops aml_layout_row_ops;

#ifdef __cplusplus
}
#endif

#endif
