/*
 * aml/higher/mapper.h - mappers (libaml on ferry): the description of a C structure for the
 * deep copy and its visit: its size, and for each pointer field its offset, the number of
 * elements it points to (a function of the structure; NULL: one) and the field's mapper.
 * A mapper with AML_MAPPER_FLAG_SPLIT is allocated apart from its parent by the deep copy.
 *
 * aml_mapper_decl(name, flags, type, ...) declares `struct aml_mapper name` for `type`, where
 * ... is nothing (no pointer field), pairs (field, &field_mapper) of single elements, or
 * triples (field, count_field, &field_mapper) where count_field is the structure's member
 * that counts the elements of field (read with its own integer type; AML reads a size_t
 * whatever its type). Up to 16 triples or 24 pairs; a count that is a multiple of 6 is read
 * as triples, as AML. Triples define functions, so that form belongs at file scope.
 * aml_final_mapper_decl(name, flags, type) declares a mapper without pointer fields.
 * Common to C and C++ (no designated initializers).
 */
#ifndef AML_HIGHER_MAPPER_H
#define AML_HIGHER_MAPPER_H 1

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Allocate apart from the parent in a deep copy. */
#define AML_MAPPER_FLAG_SPLIT 0x1
/* Allocate on the host (implies AML_MAPPER_FLAG_SPLIT). */
#define AML_MAPPER_FLAG_HOST 0x3

/* The number of elements of a field, from a pointer to its structure. */
typedef size_t (*num_element_fn)(void *);

struct aml_mapper {
	uint64_t flags;                /* AML_MAPPER_FLAG_* */
	size_t size;                   /* sizeof the structure */
	size_t n_fields;               /* its pointer fields */
	size_t *offsets;               /* each field's offset */
	num_element_fn *num_elements;  /* each field's count (NULL array or entry: 1) */
	struct aml_mapper **fields;    /* each field's mapper */
};

/* Copies the arrays. -AML_EINVAL: NULL out, or fields without offsets or mappers. */
int aml_mapper_create(struct aml_mapper **out, uint64_t flags, const size_t struct_size,
                      const size_t num_fields, const size_t *fields_offset,
                      const num_element_fn *num_elements, struct aml_mapper **fields);
/* Frees a mapper from aml_mapper_create; *mapper set NULL (NULL: no-op). */
void aml_mapper_destroy(struct aml_mapper **mapper);

extern struct aml_mapper aml_char_mapper;
extern struct aml_mapper aml_short_mapper;
extern struct aml_mapper aml_int_mapper;
extern struct aml_mapper aml_long_mapper;
extern struct aml_mapper aml_long_long_mapper;
extern struct aml_mapper aml_uchar_mapper;
extern struct aml_mapper aml_uint_mapper;
extern struct aml_mapper aml_ulong_mapper;
extern struct aml_mapper aml_ulong_long_mapper;
extern struct aml_mapper aml_float_mapper;
extern struct aml_mapper aml_double_mapper;
extern struct aml_mapper aml_long_double_mapper;
extern struct aml_mapper aml_ptr_mapper;
extern struct aml_mapper aml_char_split_mapper;
extern struct aml_mapper aml_short_split_mapper;
extern struct aml_mapper aml_int_split_mapper;
extern struct aml_mapper aml_long_split_mapper;
extern struct aml_mapper aml_long_long_split_mapper;
extern struct aml_mapper aml_uchar_split_mapper;
extern struct aml_mapper aml_ushort_split_mapper;
extern struct aml_mapper aml_uint_split_mapper;
extern struct aml_mapper aml_ulong_split_mapper;
extern struct aml_mapper aml_ulong_long_split_mapper;
extern struct aml_mapper aml_float_split_mapper;
extern struct aml_mapper aml_double_split_mapper;
extern struct aml_mapper aml_long_double_split_mapper;
extern struct aml_mapper aml_ptr_split_mapper;

#ifdef __cplusplus
}
#endif

/* The declaration macros (libaml's own; generated up to 48 arguments). */
#define AML_MAPPER_CAT_(a, b) a##b
#define AML_MAPPER_CAT(a, b) AML_MAPPER_CAT_(a, b)

#define AML_MAPPER_ARGN_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32, _33, _34, _35, _36, _37, _38, _39, _40, _41, _42, _43, _44, _45, _46, _47, _48, n, ...) n
#define AML_MAPPER_NARG(...) AML_MAPPER_ARGN_(__VA_ARGS__, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define AML_MAPPER_KIND_1 BAD
#define AML_MAPPER_KIND_2 PAIRS
#define AML_MAPPER_KIND_3 TRIPLES
#define AML_MAPPER_KIND_4 PAIRS
#define AML_MAPPER_KIND_5 BAD
#define AML_MAPPER_KIND_6 TRIPLES
#define AML_MAPPER_KIND_7 BAD
#define AML_MAPPER_KIND_8 PAIRS
#define AML_MAPPER_KIND_9 TRIPLES
#define AML_MAPPER_KIND_10 PAIRS
#define AML_MAPPER_KIND_11 BAD
#define AML_MAPPER_KIND_12 TRIPLES
#define AML_MAPPER_KIND_13 BAD
#define AML_MAPPER_KIND_14 PAIRS
#define AML_MAPPER_KIND_15 TRIPLES
#define AML_MAPPER_KIND_16 PAIRS
#define AML_MAPPER_KIND_17 BAD
#define AML_MAPPER_KIND_18 TRIPLES
#define AML_MAPPER_KIND_19 BAD
#define AML_MAPPER_KIND_20 PAIRS
#define AML_MAPPER_KIND_21 TRIPLES
#define AML_MAPPER_KIND_22 PAIRS
#define AML_MAPPER_KIND_23 BAD
#define AML_MAPPER_KIND_24 TRIPLES
#define AML_MAPPER_KIND_25 BAD
#define AML_MAPPER_KIND_26 PAIRS
#define AML_MAPPER_KIND_27 TRIPLES
#define AML_MAPPER_KIND_28 PAIRS
#define AML_MAPPER_KIND_29 BAD
#define AML_MAPPER_KIND_30 TRIPLES
#define AML_MAPPER_KIND_31 BAD
#define AML_MAPPER_KIND_32 PAIRS
#define AML_MAPPER_KIND_33 TRIPLES
#define AML_MAPPER_KIND_34 PAIRS
#define AML_MAPPER_KIND_35 BAD
#define AML_MAPPER_KIND_36 TRIPLES
#define AML_MAPPER_KIND_37 BAD
#define AML_MAPPER_KIND_38 PAIRS
#define AML_MAPPER_KIND_39 TRIPLES
#define AML_MAPPER_KIND_40 PAIRS
#define AML_MAPPER_KIND_41 BAD
#define AML_MAPPER_KIND_42 TRIPLES
#define AML_MAPPER_KIND_43 BAD
#define AML_MAPPER_KIND_44 PAIRS
#define AML_MAPPER_KIND_45 TRIPLES
#define AML_MAPPER_KIND_46 PAIRS
#define AML_MAPPER_KIND_47 BAD
#define AML_MAPPER_KIND_48 TRIPLES
#define AML_MAPPER_NP_2 1
#define AML_MAPPER_NT_3 1
#define AML_MAPPER_NP_4 2
#define AML_MAPPER_NT_6 2
#define AML_MAPPER_NP_8 4
#define AML_MAPPER_NT_9 3
#define AML_MAPPER_NP_10 5
#define AML_MAPPER_NT_12 4
#define AML_MAPPER_NP_14 7
#define AML_MAPPER_NT_15 5
#define AML_MAPPER_NP_16 8
#define AML_MAPPER_NT_18 6
#define AML_MAPPER_NP_20 10
#define AML_MAPPER_NT_21 7
#define AML_MAPPER_NP_22 11
#define AML_MAPPER_NT_24 8
#define AML_MAPPER_NP_26 13
#define AML_MAPPER_NT_27 9
#define AML_MAPPER_NP_28 14
#define AML_MAPPER_NT_30 10
#define AML_MAPPER_NP_32 16
#define AML_MAPPER_NT_33 11
#define AML_MAPPER_NP_34 17
#define AML_MAPPER_NT_36 12
#define AML_MAPPER_NP_38 19
#define AML_MAPPER_NT_39 13
#define AML_MAPPER_NP_40 20
#define AML_MAPPER_NT_42 14
#define AML_MAPPER_NP_44 22
#define AML_MAPPER_NT_45 15
#define AML_MAPPER_NP_46 23
#define AML_MAPPER_NT_48 16
#define AML_MAPPER_T_1(M, name, type, f, c, m) M(name, type, f, c, m)
#define AML_MAPPER_T_2(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_1(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_3(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_2(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_4(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_3(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_5(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_4(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_6(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_5(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_7(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_6(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_8(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_7(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_9(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_8(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_10(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_9(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_11(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_10(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_12(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_11(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_13(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_12(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_14(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_13(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_15(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_14(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_16(M, name, type, f, c, m, ...) M(name, type, f, c, m) AML_MAPPER_T_15(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_1(M, name, type, f, m) M(name, type, f, m)
#define AML_MAPPER_P_2(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_1(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_3(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_2(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_4(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_3(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_5(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_4(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_6(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_5(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_7(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_6(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_8(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_7(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_9(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_8(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_10(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_9(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_11(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_10(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_12(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_11(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_13(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_12(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_14(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_13(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_15(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_14(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_16(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_15(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_17(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_16(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_18(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_17(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_19(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_18(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_20(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_19(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_21(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_20(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_22(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_21(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_23(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_22(M, name, type, __VA_ARGS__)
#define AML_MAPPER_P_24(M, name, type, f, m, ...) M(name, type, f, m) AML_MAPPER_P_23(M, name, type, __VA_ARGS__)
#define AML_MAPPER_EACH_T(M, name, type, ...) \
	AML_MAPPER_CAT(AML_MAPPER_T_, AML_MAPPER_CAT(AML_MAPPER_NT_, AML_MAPPER_NARG(__VA_ARGS__)))(M, name, type, __VA_ARGS__)
#define AML_MAPPER_EACH_P(M, name, type, ...) \
	AML_MAPPER_CAT(AML_MAPPER_P_, AML_MAPPER_CAT(AML_MAPPER_NP_, AML_MAPPER_NARG(__VA_ARGS__)))(M, name, type, __VA_ARGS__)
#define AML_MAPPER_T_FN(name, type, f, c, m) \
	static size_t name##_aml_count_##f(void *p) { return (size_t)((type *)p)->c; }
#define AML_MAPPER_T_OFF(name, type, f, c, m) offsetof(type, f),
#define AML_MAPPER_T_NUM(name, type, f, c, m) name##_aml_count_##f,
#define AML_MAPPER_T_MAP(name, type, f, c, m) m,
#define AML_MAPPER_P_OFF(name, type, f, m) offsetof(type, f),
#define AML_MAPPER_P_NUM(name, type, f, m) NULL,
#define AML_MAPPER_P_MAP(name, type, f, m) m,
#define AML_MAPPER_INIT_(flags, type, n, off, num, fds) \
	{(uint64_t)(flags), sizeof(type), (n), (off), (num), (fds)}

#define AML_MAPPER_DECL_TRIPLES(name, flags, type, ...) \
	AML_MAPPER_EACH_T(AML_MAPPER_T_FN, name, type, __VA_ARGS__) \
	num_element_fn name##_aml_num_elements[] = {AML_MAPPER_EACH_T(AML_MAPPER_T_NUM, name, type, __VA_ARGS__)}; \
	size_t name##_aml_offsets[] = {AML_MAPPER_EACH_T(AML_MAPPER_T_OFF, name, type, __VA_ARGS__)}; \
	struct aml_mapper *name##_aml_fields[] = {AML_MAPPER_EACH_T(AML_MAPPER_T_MAP, name, type, __VA_ARGS__)}; \
	struct aml_mapper name = AML_MAPPER_INIT_(flags, type, sizeof(name##_aml_offsets) / sizeof(size_t), \
	                                          name##_aml_offsets, name##_aml_num_elements, name##_aml_fields)
#define AML_MAPPER_DECL_PAIRS(name, flags, type, ...) \
	num_element_fn name##_aml_num_elements[] = {AML_MAPPER_EACH_P(AML_MAPPER_P_NUM, name, type, __VA_ARGS__)}; \
	size_t name##_aml_offsets[] = {AML_MAPPER_EACH_P(AML_MAPPER_P_OFF, name, type, __VA_ARGS__)}; \
	struct aml_mapper *name##_aml_fields[] = {AML_MAPPER_EACH_P(AML_MAPPER_P_MAP, name, type, __VA_ARGS__)}; \
	struct aml_mapper name = AML_MAPPER_INIT_(flags, type, sizeof(name##_aml_offsets) / sizeof(size_t), \
	                                          name##_aml_offsets, name##_aml_num_elements, name##_aml_fields)
/* A count of arguments neither of pairs nor of triples: a compile error naming the macro. */
#define AML_MAPPER_DECL_BAD(name, flags, type, ...) \
	struct aml_mapper name = aml_mapper_decl_needs_pairs_or_triples_of_arguments

#define aml_mapper_decl(name, flags, type, ...) \
	AML_MAPPER_CAT(AML_MAPPER_DECL_, AML_MAPPER_CAT(AML_MAPPER_KIND_, AML_MAPPER_NARG(__VA_ARGS__)))(name, flags, type, __VA_ARGS__)
#define aml_final_mapper_decl(name, flags, type) \
	struct aml_mapper name = AML_MAPPER_INIT_(flags, type, 0, NULL, NULL, NULL)

#endif /* AML_HIGHER_MAPPER_H */
