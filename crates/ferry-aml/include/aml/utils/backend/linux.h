/*
 * aml/utils/backend/linux.h - the Linux backend's setup (libaml on ferry): the ready
 * aml_dma_linux, as aml_init / aml_finalize make and release it.
 */
#ifndef AML_UTILS_BACKEND_LINUX_H
#define AML_UTILS_BACKEND_LINUX_H 1

#ifdef __cplusplus
extern "C" {
#endif

/* Creates the ready aml_dma_linux if it is not there (one worker per core; AML: 32). */
int aml_backend_linux_init(void);
/* Destroys it, after its work. */
int aml_backend_linux_finalize(void);

#ifdef __cplusplus
}
#endif

#endif /* AML_UTILS_BACKEND_LINUX_H */
