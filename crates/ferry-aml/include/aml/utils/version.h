/* aml/utils/version.h - libaml's version (ferry's AML drop-in). */
#ifndef AML_VERSION_H
#define AML_VERSION_H 1

#ifdef __cplusplus
extern "C" {
#endif

#define AML_VERSION_MAJOR 0
#define AML_VERSION_MINOR 3
#define AML_VERSION_PATCH 0
#define AML_VERSION_REVISION ""
#define AML_VERSION_STRING "0.3.0-ferry"
extern const int aml_version_major;
extern const int aml_version_minor;
extern const int aml_version_patch;
extern const char *aml_version_revision;
extern const char *aml_version_string;

#ifdef __cplusplus
}
#endif

#endif /* AML_VERSION_H */
