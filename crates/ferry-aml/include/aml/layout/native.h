/* aml/layout/native.h - layout calls in native (column-major) order (libaml on ferry). */
#ifndef AML_LAYOUT_NATIVE_H
#define AML_LAYOUT_NATIVE_H

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

void *aml_layout_deref_native(const struct aml_layout *layout, const size_t *coords);
int aml_layout_dims_native(const struct aml_layout *layout, size_t *dims);
int aml_layout_slice_native(const struct aml_layout *layout, struct aml_layout **reshaped_layout,
                            const size_t *offsets, const size_t *dims, const size_t *strides);

#ifdef __cplusplus
}
#endif

#endif
