/* aml/area/linux.h - host memory area (libaml on ferry): anonymous private mmap. NUMA
 * binding (aml_area_linux_create with a nodeset) is not part of this library. */
#ifndef AML_AREA_LINUX_NUMA_H
#define AML_AREA_LINUX_NUMA_H

#include <aml.h>

#ifdef __cplusplus
extern "C" {
#endif

extern struct aml_area_ops aml_area_linux_ops;
extern struct aml_area aml_area_linux;

#ifdef __cplusplus
}
#endif

#endif
