/*
 * aml/utils/bitmap.h - a fixed set of AML_BITMAP_MAX bits (libaml on ferry; AML's layout:
 * bit i in mask[i / AML_BITMAP_NBITS], at position i % AML_BITMAP_NBITS). Every function
 * checks its arguments: NULL or an index out of range is -AML_EINVAL (AML asserts in places).
 */
#ifndef AML_BITMAP_H
#define AML_BITMAP_H 1

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AML_BITMAP_MAX 2048
#define AML_BITMAP_BYTES (AML_BITMAP_MAX / 8)
#define AML_BITMAP_TYPE unsigned long
#define AML_BITMAP_SIZE ((int)(AML_BITMAP_BYTES / sizeof(AML_BITMAP_TYPE)))
#define AML_BITMAP_NBITS ((int)(8 * sizeof(AML_BITMAP_TYPE)))

struct aml_bitmap {
	unsigned long mask[AML_BITMAP_BYTES / sizeof(unsigned long)];
};

void aml_bitmap_copy(struct aml_bitmap *dst, const struct aml_bitmap *src);
int aml_bitmap_zero(struct aml_bitmap *bitmap);
int aml_bitmap_fill(struct aml_bitmap *bitmap);
/* 1 set, 0 not; -AML_EINVAL: NULL, i >= AML_BITMAP_MAX. */
int aml_bitmap_isset(const struct aml_bitmap *bitmap, const unsigned int i);
int aml_bitmap_iszero(const struct aml_bitmap *bitmap);
int aml_bitmap_isfull(const struct aml_bitmap *bitmap);
int aml_bitmap_isequal(const struct aml_bitmap *a, const struct aml_bitmap *b);
int aml_bitmap_set(struct aml_bitmap *bitmap, const unsigned int i);
int aml_bitmap_clear(struct aml_bitmap *bitmap, const unsigned int i);
/* Bits i to ii, both included; -AML_EINVAL: NULL, out of range, i > ii. */
int aml_bitmap_set_range(struct aml_bitmap *bitmap, const unsigned int i, const unsigned int ii);
int aml_bitmap_clear_range(struct aml_bitmap *bitmap, const unsigned int i,
                           const unsigned int ii);
/* The number of bits set. */
int aml_bitmap_nset(const struct aml_bitmap *bitmap);
/* ORs in (copies out) the first `size` bits of an array of unsigned long. */
void aml_bitmap_copy_from_ulong(struct aml_bitmap *bitmap, const unsigned long *src, size_t size);
void aml_bitmap_copy_to_ulong(const struct aml_bitmap *bitmap, unsigned long *dst, size_t size);
/* The highest / lowest bit set, -1 if none. */
int aml_bitmap_last(const struct aml_bitmap *bitmap);
int aml_bitmap_first(const struct aml_bitmap *bitmap);
/* NULL/"none"/"zero"/"empty", "all"/"fill"/"full", "1,5,7", or aml_bitmap_to_string's
 * "[0101...]": 0, else -1 (bitmap unchanged). */
int aml_bitmap_from_string(struct aml_bitmap *bitmap, const char *bitmap_str);
/* "[" one 0/1 per bit "]", malloc'd (free it); NULL on a NULL bitmap. */
char *aml_bitmap_to_string(const struct aml_bitmap *bitmap);
int aml_bitmap_create(struct aml_bitmap **map);
void aml_bitmap_destroy(struct aml_bitmap **map);
int aml_bitmap_dup(struct aml_bitmap **dst, const struct aml_bitmap *src);

#ifdef __cplusplus
}
#endif

#endif /* AML_BITMAP_H */
