/* libaml: AML's resize tiling (the last tile of a dim holds what is left). */
#ifndef AML_TILING_RESIZE_H
#define AML_TILING_RESIZE_H 1

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

extern struct aml_tiling_ops aml_tiling_resize_column_ops;
extern struct aml_tiling_ops aml_tiling_resize_row_ops;

/* AML's data; dims in native (column-major) order. */
struct aml_tiling_resize {
	int tags;
	const struct aml_layout *layout;
	size_t ndims;
	size_t *tile_dims;
	size_t *dims;
	size_t *border_tile_dims;
};

/* tile_dims in the tags' order (AML_TILING_ORDER_*); the layout is not owned and must outlive
 * the tiling. -AML_EINVAL: NULL arguments, ndims 0 or not the layout's, a tile dim 0. */
int aml_tiling_resize_create(struct aml_tiling **t, int tags, const struct aml_layout *l,
                             size_t ndims, const size_t *tile_dims);
/* Frees the tiling (not the layout), sets *t NULL. */
void aml_tiling_resize_destroy(struct aml_tiling **t);

/* The ops, which AML exports without declaring them (the row-major tables take the
 * column-major ones for native order and the tile count). */
struct aml_layout *aml_tiling_resize_column_index(const struct aml_tiling_data *t, const size_t *coords);
void *aml_tiling_resize_column_rawptr(const struct aml_tiling_data *t, const size_t *coords);
int aml_tiling_resize_column_order(const struct aml_tiling_data *t);
int aml_tiling_resize_column_dims(const struct aml_tiling_data *t, size_t *dims);
size_t aml_tiling_resize_column_ndims(const struct aml_tiling_data *t);
size_t aml_tiling_resize_column_ntiles(const struct aml_tiling_data *t);
int aml_tiling_resize_column_fprintf(const struct aml_tiling_data *data, FILE *stream, const char *prefix);
struct aml_layout *aml_tiling_resize_row_index(const struct aml_tiling_data *t, const size_t *coords);
void *aml_tiling_resize_row_rawptr(const struct aml_tiling_data *t, const size_t *coords);
int aml_tiling_resize_row_order(const struct aml_tiling_data *t);
int aml_tiling_resize_row_dims(const struct aml_tiling_data *t, size_t *dims);
size_t aml_tiling_resize_row_ndims(const struct aml_tiling_data *t);
int aml_tiling_resize_row_fprintf(const struct aml_tiling_data *data, FILE *stream, const char *prefix);

#ifdef __cplusplus
}
#endif

#endif /* AML_TILING_RESIZE_H */
