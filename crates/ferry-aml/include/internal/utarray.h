/*
 * internal/utarray.h - libaml's own growable array with the interface of uthash's utarray
 * (which AML installs as internal/utarray.h and its test programs use): UT_icd, UT_array and
 * the utarray_* calls below. Header-only; libaml itself does not use it. Out of memory
 * calls utarray_oom() (default: exit(-1), as uthash).
 */
#ifndef AML_INTERNAL_UTARRAY_H
#define AML_INTERNAL_UTARRAY_H 1

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#ifndef utarray_oom
#define utarray_oom() exit(-1)
#endif

typedef void(ctor_f)(void *dst, const void *src);
typedef void(dtor_f)(void *elt);
typedef void(init_f)(void *elt);

/* The element type: its size, and optional init, copy and destructor functions. */
typedef struct {
	size_t sz;
	init_f *init;
	ctor_f *copy;
	dtor_f *dtor;
} UT_icd;

/* i: elements in use; n: elements allocated; d: the elements. */
typedef struct {
	unsigned i, n;
	UT_icd icd;
	char *d;
} UT_array;

#define _utarray_eltptr(a, j) ((void *)((a)->d + (a)->icd.sz * (size_t)(j)))

static inline void utarray_init_(UT_array *a, const UT_icd *icd)
{
	memset(a, 0, sizeof(*a));
	a->icd = *icd;
}

static inline void utarray_done_(UT_array *a)
{
	if (a->icd.dtor)
		for (unsigned j = 0; j < a->i; j++)
			a->icd.dtor(_utarray_eltptr(a, j));
	free(a->d);
	a->d = NULL;
	a->i = a->n = 0;
}

static inline void utarray_reserve_(UT_array *a, unsigned by)
{
	if (a->i + by <= a->n)
		return;
	unsigned n = a->n ? a->n : 8;
	while (n < a->i + by)
		n *= 2;
	char *d = (char *)realloc(a->d, (size_t)n * a->icd.sz);
	if (d == NULL)
		utarray_oom();
	a->d = d;
	a->n = n;
}

static inline void utarray_push_back_(UT_array *a, const void *p)
{
	utarray_reserve_(a, 1);
	void *dst = _utarray_eltptr(a, a->i);
	a->i++;
	if (a->icd.copy)
		a->icd.copy(dst, p);
	else
		memcpy(dst, p, a->icd.sz);
}

static inline void utarray_extend_back_(UT_array *a)
{
	utarray_reserve_(a, 1);
	void *dst = _utarray_eltptr(a, a->i);
	a->i++;
	if (a->icd.init)
		a->icd.init(dst);
	else
		memset(dst, 0, a->icd.sz);
}

static inline void utarray_pop_back_(UT_array *a)
{
	if (a->i == 0)
		return;
	a->i--;
	if (a->icd.dtor)
		a->icd.dtor(_utarray_eltptr(a, a->i));
}

static inline void utarray_erase_(UT_array *a, unsigned pos, unsigned len)
{
	if (a->icd.dtor)
		for (unsigned j = 0; j < len; j++)
			a->icd.dtor(_utarray_eltptr(a, pos + j));
	if (a->i > pos + len)
		memmove(_utarray_eltptr(a, pos), _utarray_eltptr(a, pos + len),
		        (size_t)(a->i - (pos + len)) * a->icd.sz);
	a->i -= len;
}

static inline void *utarray_eltptr_(UT_array *a, unsigned j)
{
	return j < a->i ? _utarray_eltptr(a, j) : NULL;
}

static inline unsigned utarray_eltidx_(UT_array *a, const void *e)
{
	return e ? (unsigned)(((const char *)e - a->d) / a->icd.sz) : (unsigned)-1;
}

#define utarray_init(a, _icd) utarray_init_((a), (_icd))
#define utarray_done(a) utarray_done_(a)
#define utarray_new(a, _icd)                                                   \
	do {                                                                   \
		(a) = (UT_array *)malloc(sizeof(UT_array));                    \
		if ((a) == NULL)                                               \
			utarray_oom();                                         \
		utarray_init_((a), (_icd));                                    \
	} while (0)
#define utarray_free(a)                                                        \
	do {                                                                   \
		utarray_done_(a);                                              \
		free(a);                                                       \
	} while (0)
#define utarray_reserve(a, by) utarray_reserve_((a), (unsigned)(by))
#define utarray_push_back(a, p) utarray_push_back_((a), (p))
#define utarray_extend_back(a) utarray_extend_back_(a)
#define utarray_pop_back(a) utarray_pop_back_(a)
#define utarray_len(a) ((a)->i)
#define utarray_eltptr(a, j) utarray_eltptr_((a), (unsigned)(j))
#define utarray_eltidx(a, e) utarray_eltidx_((a), (e))
#define utarray_erase(a, pos, len) utarray_erase_((a), (unsigned)(pos), (unsigned)(len))
#define utarray_clear(a) utarray_erase_((a), 0, (a)->i)
#define utarray_front(a) utarray_eltptr_((a), 0)
#define utarray_back(a) ((a)->i ? _utarray_eltptr((a), (a)->i - 1) : NULL)
#define utarray_next(a, e) ((e) == NULL ? utarray_front(a) : utarray_eltptr_((a), utarray_eltidx_((a), (e)) + 1))

#endif /* AML_INTERNAL_UTARRAY_H */
