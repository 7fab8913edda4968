/*
 * aml/layout/pad.h - the pad layout (libaml on ferry): a target layout extended along its
 * dims with a neutral element (copied in): an element inside the target's dims is the
 * target's, one beyond them the neutral element. One malloc'd block (free() releases it and
 * leaves the target); it owns its target: aml_layout_destroy / aml_layout_pad_destroy destroy
 * it too, and duplicate duplicates it.
 */
#ifndef AML_LAYOUT_PAD_H
#define AML_LAYOUT_PAD_H 1

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

struct aml_layout_pad {
	int tags;                  /* the order given at creation */
	struct aml_layout *target; /* owned */
	size_t ndims;              /* the target's */
	size_t element_size;       /* the target's */
	size_t *dims;              /* native order */
	size_t *target_dims;       /* native order */
	void *neutral;             /* element_size bytes, inside the layout's block */
};

/* order: its low bit, AML_LAYOUT_ORDER_ROW_MAJOR or AML_LAYOUT_ORDER_COLUMN_MAJOR (of dims,
 * as many as the target's, and of the new layout). On success the layout owns target.
 * -AML_EINVAL: NULL layout, target, dims or neutral, a target without dims or element size, a
 * dim below the target's (AML documents dims as the target's plus the pad and does not
 * check); -AML_ENOMEM. */
int aml_layout_pad_create(struct aml_layout **layout, const int order, struct aml_layout *target,
                          const size_t *dims, void *neutral);
/* Destroys the layout and its target; NULL: no-op. */
void aml_layout_pad_destroy(struct aml_layout *layout);
int aml_layout_pad_duplicate(const struct aml_layout *layout, struct aml_layout **out,
                             void *ptr);

void *aml_layout_pad_column_deref(const struct aml_layout_data *data, const size_t *coords);
void *aml_layout_pad_row_deref(const struct aml_layout_data *data, const size_t *coords);
void *aml_layout_pad_rawptr(const struct aml_layout_data *data);
int aml_layout_pad_column_order(const struct aml_layout_data *data);
int aml_layout_pad_row_order(const struct aml_layout_data *data);
int aml_layout_pad_column_dims(const struct aml_layout_data *data, size_t *dims);
int aml_layout_pad_row_dims(const struct aml_layout_data *data, size_t *dims);
size_t aml_layout_pad_ndims(const struct aml_layout_data *data);
size_t aml_layout_pad_element_size(const struct aml_layout_data *data);
int aml_layout_pad_column_fprintf(const struct aml_layout_data *data, FILE *stream,
                                  const char *prefix);
int aml_layout_pad_row_fprintf(const struct aml_layout_data *data, FILE *stream,
                               const char *prefix);

extern struct aml_layout_ops aml_layout_pad_column_ops;
extern struct aml_layout_ops aml_layout_pad_row_ops;

#ifdef __cplusplus
}
#endif

#endif
