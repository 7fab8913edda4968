/*
 * aml/utils/macros.h - the preprocessor helpers of AML's header-only allocation macros
 * (libaml on ferry). AML_SIZEOF_ALIGNED(t1, ..., tn) is the size of a struct holding a t1,
 * ..., a tn in that order (each aligned as the compiler aligns struct members);
 * AML_OFFSETOF_ALIGNED(i, t1, ..., tn) the offset of its i-th member (from 1);
 * AML_SIZEOF_ALIGNED_ARRAY(n, type, t1, ...) the size of t1, ... followed by n elements of
 * type. Up to 16 types (AML allows more; none of its programs uses them). These declare
 * unnamed structs inside sizeof/offsetof: C only (C++ forbids types defined there).
 */
#ifndef AML_UTILS_MACROS_H
#define AML_UTILS_MACROS_H 1

#include <stddef.h>

#define STRINGIFY(a) STRINGIFY_(a)
#define STRINGIFY_(a) #a
#define CONCATENATE(a, b) CONCATENATE1(a, b)
#define CONCATENATE1(a, b) CONCATENATE2(a, b)
#define CONCATENATE2(a, b) a##b

/* The number of arguments, 1 to 16. */
#define VA_NARG(...) PP_ARG_N(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, _)
#define PP_ARG_N(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, N, ...) N

/* PLUS_1(n): n + 1 as a token, for n from 0 to 16. */
#define PLUS_1_0 1
#define PLUS_1_1 2
#define PLUS_1_2 3
#define PLUS_1_3 4
#define PLUS_1_4 5
#define PLUS_1_5 6
#define PLUS_1_6 7
#define PLUS_1_7 8
#define PLUS_1_8 9
#define PLUS_1_9 10
#define PLUS_1_10 11
#define PLUS_1_11 12
#define PLUS_1_12 13
#define PLUS_1_13 14
#define PLUS_1_14 15
#define PLUS_1_15 16
#define PLUS_1_16 17
#define PLUS_1(N) CONCATENATE(PLUS_1_, N)

/* Member i of the structs below is named AML_FIELD(i). */
#define AML_FIELD(N) CONCATENATE(__f, N)
#define AML_FIELD_DECL(type, N) type AML_FIELD(N);
#define AML_DECL_1(N, t, ...) AML_FIELD_DECL(t, N)
#define AML_DECL_2(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_1(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_3(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_2(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_4(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_3(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_5(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_4(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_6(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_5(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_7(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_6(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_8(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_7(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_9(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_8(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_10(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_9(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_11(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_10(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_12(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_11(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_13(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_12(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_14(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_13(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_15(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_14(PLUS_1(N), __VA_ARGS__)
#define AML_DECL_16(N, t, ...) AML_FIELD_DECL(t, N) AML_DECL_15(PLUS_1(N), __VA_ARGS__)

/* An unnamed struct with one member of each type, in order. */
#define AML_STRUCT_DECL(...) \
	struct { CONCATENATE(AML_DECL_, VA_NARG(__VA_ARGS__))(1, __VA_ARGS__, 0) }

#define AML_SIZEOF_ALIGNED(...) sizeof(AML_STRUCT_DECL(__VA_ARGS__))
#define AML_SIZEOF_ALIGNED_ARRAY(n, type, ...) \
	(sizeof(AML_STRUCT_DECL(__VA_ARGS__, type)) + ((n)-1) * sizeof(type))
#define AML_OFFSETOF_ALIGNED(N, ...) offsetof(AML_STRUCT_DECL(__VA_ARGS__), AML_FIELD(N))

#endif /* AML_UTILS_MACROS_H */
