/*
 * aml/layout/reshape.h - the reshape layout (libaml on ferry): other dims over any target
 * layout's elements (element i in native order is the target's element i), where a dense
 * reshape would need a copy. One malloc'd block (free() releases it and leaves the target);
 * it owns its target: aml_layout_destroy / aml_layout_reshape_destroy destroy it too, and
 * duplicate duplicates it.
 */
#ifndef AML_AREA_LAYOUT_RESHAPE_H
#define AML_AREA_LAYOUT_RESHAPE_H

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

struct aml_layout_data_reshape {
	struct aml_layout *target; /* owned */
	size_t ndims;
	size_t target_ndims;
	size_t *dims;        /* native order */
	size_t *coffsets;    /* elements below each dim, native order (coffsets[0] = 1) */
	size_t *target_dims; /* native order */
};

/* order: its low bit, AML_LAYOUT_ORDER_ROW_MAJOR or AML_LAYOUT_ORDER_COLUMN_MAJOR (of dims
 * and of the new layout). On success the layout owns target. -AML_EINVAL: NULL layout, target
 * or dims, ndims 0, a target without dims, dims not holding the target's element count;
 * -AML_ENOMEM. */
int aml_layout_reshape_create(struct aml_layout **layout, struct aml_layout *target,
                              const int order, const size_t ndims, const size_t *dims);
/* Destroys the layout and its target; NULL: no-op. */
void aml_layout_reshape_destroy(struct aml_layout *l);
int aml_layout_reshape_duplicate(const struct aml_layout *layout, struct aml_layout **out,
                                 void *ptr);

void *aml_layout_reshape_column_deref(const struct aml_layout_data *data, const size_t *coords);
void *aml_layout_reshape_row_deref(const struct aml_layout_data *data, const size_t *coords);
void *aml_layout_reshape_rawptr(const struct aml_layout_data *data);
int aml_layout_reshape_column_order(const struct aml_layout_data *data);
int aml_layout_reshape_row_order(const struct aml_layout_data *data);
int aml_layout_reshape_column_dims(const struct aml_layout_data *data, size_t *dims);
int aml_layout_reshape_row_dims(const struct aml_layout_data *data, size_t *dims);
size_t aml_layout_reshape_ndims(const struct aml_layout_data *data);
size_t aml_layout_reshape_element_size(const struct aml_layout_data *data);
int aml_layout_reshape_column_fprintf(const struct aml_layout_data *data, FILE *stream,
                                      const char *prefix);
int aml_layout_reshape_row_fprintf(const struct aml_layout_data *data, FILE *stream,
                                   const char *prefix);

extern struct aml_layout_ops aml_layout_reshape_row_ops;
extern struct aml_layout_ops aml_layout_reshape_column_ops;

#ifdef __cplusplus
}
#endif

#endif
