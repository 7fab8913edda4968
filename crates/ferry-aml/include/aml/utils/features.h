/*
 * aml/utils/features.h - the backends of this library (libaml on ferry; included by aml.h).
 * LIBNUMA: the NUMA Linux area (aml/area/linux.h), which libaml implements on the kernel's
 * mbind without libnuma. CUDA is loaded at run time: aml_support_backends tells whether a
 * driver and a device are there.
 */
#ifndef AML_FEATURES_H
#define AML_FEATURES_H

#ifdef __cplusplus
extern "C" {
#endif

#define AML_HAVE_BACKEND_LIBNUMA 1
#define AML_HAVE_BACKEND_CUDA 1
#define AML_HAVE_BACKEND_OPENCL 0
#define AML_HAVE_BACKEND_HWLOC 0
#define AML_HAVE_BACKEND_ZE 0
#define AML_HAVE_BACKEND_HIP 0

#define AML_BACKEND_LIBNUMA (1UL << 1)
#define AML_BACKEND_CUDA (1UL << 2)
#define AML_BACKEND_HWLOC (1UL << 3)
#define AML_BACKEND_OPENCL (1UL << 4)
#define AML_BACKEND_ZE (1UL << 5)
#define AML_BACKEND_HIP (1UL << 6)

/* 1 if every backend flag in `backends` is usable here (LIBNUMA: always; CUDA: a driver and a
 * device), else 0. */
int aml_support_backends(const unsigned long backends);

#ifdef __cplusplus
}
#endif

#endif
