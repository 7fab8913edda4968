/* libaml: AML's tiling calls in native (column-major) order. */
#ifndef AML_TILING_NATIVE_H
#define AML_TILING_NATIVE_H

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The tile at coords given in native order; NULL + aml_errno as aml_tiling_index. */
struct aml_layout *aml_tiling_index_native(const struct aml_tiling *tiling,
                                           const size_t *coords);
/* Tiles per dim, native order. */
int aml_tiling_dims_native(const struct aml_tiling *tiling, size_t *dims);

#ifdef __cplusplus
}
#endif

#endif /* AML_TILING_NATIVE_H */
