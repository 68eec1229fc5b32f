/* operator_new.c - C++ operator new and delete in every variant, by mangled name, so that a
 * C++ program calls cmalloc directly; in a file of their own so that a program linked with
 * libcmalloc.a takes this object only when it uses them (a C program never does).
 *
 * On failure new calls the program's new_handler until it succeeds, and with none throws
 * std::bad_alloc through libstdc++'s own thrower; the nothrow forms return NULL instead, also
 * when the handler throws. libstdc++'s functions are named weakly in the shared library, so a
 * C program loads it without libstdc++ (they are present whenever a C++ program runs), and
 * strongly in the static archive's copy (built with -DCM_CXX_RUNTIME_LINKED): a weak name does
 * not pull a member out of libstdc++.a, and a program linked with -static or
 * -static-libstdc++ that uses nothing else of the thrower's member had none, so new aborted
 * where it must throw.
 *
 * They are C++'s default operators: where the program has its own operator new or delete, the
 * defaults that call those call the program's (the sections below say which, and how), and in
 * the static archive's copy they are weak, so that the program's own win the link.
 *
 * Left out of the sanitizer builds (CM_PREFIX), which keep the C++ runtime's own operators.
 */
#include "fastpath.h"

#include <stdlib.h>

#ifndef CM_PREFIX
#ifdef CM_CXX_RUNTIME_LINKED
#define CM_CXX_RUNTIME_NAME          /* strong: pulls libstdc++.a's member */
#define CM_CXX_RUNTIME_HAS(function) true
#else
#define CM_CXX_RUNTIME_NAME          __attribute__((weak))
#define CM_CXX_RUNTIME_HAS(function) ((function) != NULL)
#endif

typedef void (*cm_new_handler)(void);
extern cm_new_handler _ZSt15get_new_handlerv(void) CM_CXX_RUNTIME_NAME;
extern void _ZSt17__throw_bad_allocv(void) CM_CXX_RUNTIME_NAME __attribute__((noreturn));
bool cm_call_new_handler_nothrow(cm_new_handler handler); /* new_handler.cc */

/* std::bad_alloc, or NULL for a nothrow form; why names the cause when there is no C++
 * runtime to throw it. */
static CM_COLD void *refuse_new(bool nothrow, const char *why)
{
    if (nothrow)
        return NULL;
    if (CM_CXX_RUNTIME_HAS(_ZSt17__throw_bad_allocv))
        _ZSt17__throw_bad_allocv();
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: operator new: ");
    cm_message_str(&m, why);
    cm_message_str(&m, " and no C++ runtime to throw std::bad_alloc; aborting\n");
    cm_message_write(&m, 2);
    abort();
}

static CM_COLD void *new_failed(size_t size, size_t alignment, bool nothrow, cm_family family)
{
    for (;;) {
        cm_new_handler handler =
            CM_CXX_RUNTIME_HAS(_ZSt15get_new_handlerv) ? _ZSt15get_new_handlerv() : NULL;
        if (handler == NULL)
            return refuse_new(nothrow, "out of memory");
        if (!nothrow)
            handler();
        else if (!cm_call_new_handler_nothrow(handler))
            return NULL;
        void *p = cm_alloc_aligned_by(alignment, size, family);
        if (p != NULL)
            return p;
    }
}

/* family: CM_BY_NEW or CM_BY_NEW_ARRAY, the delete that must free it, for the debug mode. */
static inline void *new_object(size_t size, size_t alignment, bool nothrow, cm_family family)
{
    void *p = alignment <= CM_ALIGNMENT ? cm_alloc_by(size, family)
                                        : cm_alloc_aligned_by(alignment, size, family);
    return CM_LIKELY(p != NULL) ? p : new_failed(size, alignment, nothrow, family);
}

/* In the static archive's copy the operators are weak, as each of libstdc++'s is in a member
 * of its own: a program linked with libcmalloc.a that has some of its own (its operator new and
 * delete over an arena) keeps them, where a second, strong definition of each failed the link,
 * and cmalloc's others call them as below. In the shared library the program's come first in
 * the dynamic linker's lookup anyway. */
#ifdef CM_CXX_RUNTIME_LINKED
#define CM_OPERATOR CM_EXPORT __attribute__((weak))
#else
#define CM_OPERATOR CM_EXPORT
#endif
#define CM_NEW(name, ...)                \
    CM_OPERATOR void *name(__VA_ARGS__); \
    CM_OPERATOR void *name(__VA_ARGS__)
#define CM_DELETE(name, ...)            \
    CM_OPERATOR void name(__VA_ARGS__); \
    CM_OPERATOR void name(__VA_ARGS__)

/* ---- a program's own operator new ------------------------------------------------------------
 * C++'s default new[] calls the program's operator new(size_t) when it has its own, and the
 * nothrow forms its new or new[], returning NULL for what that throws: libstdc++'s do, and
 * under LD_PRELOAD cmalloc's are those defaults. Otherwise a program with its own new (over an
 * arena, say) and delete had its nothrow blocks from cmalloc deleted by its own delete. The
 * test is a load of the GOT beside each of these calls; plain new pays nothing. */
typedef void *(*cm_new_fn)(size_t size);
void *_Znwm(size_t size);
void *_Znam(size_t size);
void *cm_call_new_nothrow(cm_new_fn new_fn, size_t size); /* new_handler.cc */
/* cmalloc's own definitions, under names no program takes (as for delete, below) */
extern void *cm_own_new(size_t size) __attribute__((alias("_Znwm"), visibility("hidden")));
extern void *cm_own_new_array(size_t size) __attribute__((alias("_Znam"), visibility("hidden")));

/* Of an operator's array form and its plain one, each as the program binds it (read through
 * the GOT) and as cmalloc defines it, the program's own that family's blocks go to: the array
 * form's for new[]'s, else the plain one's; NULL when the program has neither. */
typedef void (*cm_operator)(void);
static cm_operator program_operator(cm_family family, cm_operator array_bound,
                                    cm_operator array_own, cm_operator bound, cm_operator own)
{
    if (family == CM_BY_NEW_ARRAY && array_bound != array_own)
        return array_bound;
    return bound != own ? bound : NULL;
}

/* The program's own new for family's blocks, or NULL when it has none. */
static cm_new_fn program_new(cm_family family)
{
    return (cm_new_fn)program_operator(family, (cm_operator)_Znam, (cm_operator)cm_own_new_array,
                                       (cm_operator)_Znwm, (cm_operator)cm_own_new);
}

/* new(size), new[](size), and their nothrow forms */
CM_NEW(_Znwm, size_t size)
{
    return new_object(size, 0, false, CM_BY_NEW);
}
CM_NEW(_Znam, size_t size)
{
    cm_new_fn program = program_new(CM_BY_NEW);
    return CM_UNLIKELY(program != NULL) ? program(size)
                                        : new_object(size, 0, false, CM_BY_NEW_ARRAY);
}
CM_NEW(_ZnwmRKSt9nothrow_t, size_t size, const void *tag)
{
    (void)tag;
    cm_new_fn program = program_new(CM_BY_NEW);
    return CM_UNLIKELY(program != NULL) ? cm_call_new_nothrow(program, size)
                                        : new_object(size, 0, true, CM_BY_NEW);
}
CM_NEW(_ZnamRKSt9nothrow_t, size_t size, const void *tag)
{
    (void)tag;
    cm_new_fn program = program_new(CM_BY_NEW_ARRAY);
    return CM_UNLIKELY(program != NULL) ? cm_call_new_nothrow(program, size)
                                        : new_object(size, 0, true, CM_BY_NEW_ARRAY);
}
/* new(size, align_val_t), new[](size, align_val_t), and their nothrow forms. An alignment
 * that is not a power of two (0 included) is refused at once, as libstdc++ does: bad_alloc
 * without asking the new_handler, which could never make it valid. The program's own aligned
 * new is called as the plain forms call its new: by new[](size, align_val_t) and by the
 * nothrow forms (the array one its new[](size, align_val_t) first). */
typedef void *(*cm_new_aligned_fn)(size_t size, size_t alignment);
void *_ZnwmSt11align_val_t(size_t size, size_t alignment);
void *_ZnamSt11align_val_t(size_t size, size_t alignment);
void *cm_call_new_aligned_nothrow(cm_new_aligned_fn new_fn, size_t size,
                                  size_t alignment); /* new_handler.cc */
extern void *cm_own_new_aligned(size_t size, size_t alignment)
    __attribute__((alias("_ZnwmSt11align_val_t"), visibility("hidden")));
extern void *cm_own_new_array_aligned(size_t size, size_t alignment)
    __attribute__((alias("_ZnamSt11align_val_t"), visibility("hidden")));

/* The program's own aligned new for family's blocks, or NULL when it has none. */
static cm_new_aligned_fn program_new_aligned(cm_family family)
{
    return (cm_new_aligned_fn)program_operator(
        family, (cm_operator)_ZnamSt11align_val_t, (cm_operator)cm_own_new_array_aligned,
        (cm_operator)_ZnwmSt11align_val_t, (cm_operator)cm_own_new_aligned);
}

static inline void *new_aligned(size_t size, size_t alignment, bool nothrow, cm_family family)
{
    if (CM_UNLIKELY(!cm_is_power_of_two(alignment)))
        return refuse_new(nothrow, "an alignment that is not a power of two");
    return new_object(size, alignment, nothrow, family);
}
CM_NEW(_ZnwmSt11align_val_t, size_t size, size_t alignment)
{
    return new_aligned(size, alignment, false, CM_BY_NEW);
}
CM_NEW(_ZnamSt11align_val_t, size_t size, size_t alignment)
{
    cm_new_aligned_fn program = program_new_aligned(CM_BY_NEW);
    return CM_UNLIKELY(program != NULL) ? program(size, alignment)
                                        : new_aligned(size, alignment, false, CM_BY_NEW_ARRAY);
}
CM_NEW(_ZnwmSt11align_val_tRKSt9nothrow_t, size_t size, size_t alignment, const void *tag)
{
    (void)tag;
    cm_new_aligned_fn program = program_new_aligned(CM_BY_NEW);
    return CM_UNLIKELY(program != NULL) ? cm_call_new_aligned_nothrow(program, size, alignment)
                                        : new_aligned(size, alignment, true, CM_BY_NEW);
}
CM_NEW(_ZnamSt11align_val_tRKSt9nothrow_t, size_t size, size_t alignment, const void *tag)
{
    (void)tag;
    cm_new_aligned_fn program = program_new_aligned(CM_BY_NEW_ARRAY);
    return CM_UNLIKELY(program != NULL) ? cm_call_new_aligned_nothrow(program, size, alignment)
                                        : new_aligned(size, alignment, true, CM_BY_NEW_ARRAY);
}

/* ---- a program's own operator delete --------------------------------------------------------
 * C++'s default array, sized and nothrow deletes call the program's operator delete(void *)
 * when it has its own (and the sized delete[] its operator delete[](void *)): libstdc++'s do,
 * and under LD_PRELOAD cmalloc's are those defaults. A program whose own operator new hands out
 * memory of its own (an arena, a pool) has it deleted through cmalloc's sized delete, which
 * the compiler calls for `delete p`: such a pointer is in no span of cmalloc's, so the fast
 * path never takes it, and the slow path below hands it to the program's delete instead of
 * reporting it. A program's own new that returns malloc's blocks as they are has them freed by
 * cmalloc's fast path, its own delete not called. The aligned forms call the program's aligned
 * delete the same way (its delete[](void *, align_val_t) for the sized aligned delete[]), with
 * the alignment they were given. */
typedef void (*cm_delete_fn)(void *p);
void _ZdlPv(void *p);
void _ZdaPv(void *p);
/* cmalloc's own definitions, under names no program takes: _ZdlPv and _ZdaPv (as _Znwm and
 * _Znam above), read through the GOT, are whichever definitions the program binds to. */
extern void cm_own_delete(void *p) __attribute__((alias("_ZdlPv"), visibility("hidden")));
extern void cm_own_delete_array(void *p) __attribute__((alias("_ZdaPv"), visibility("hidden")));

/* The program's own delete for family's blocks, or NULL when it has none. */
static cm_delete_fn program_delete(cm_family family)
{
    return (cm_delete_fn)program_operator(family, (cm_operator)_ZdaPv,
                                          (cm_operator)cm_own_delete_array, (cm_operator)_ZdlPv,
                                          (cm_operator)cm_own_delete);
}

/* Whether p is memory of the program's own: in no span of cmalloc's and no guard slot. */
static bool program_memory(const void *p)
{
    return p != NULL && cm_span_of(p) == NULL && !cm_guard_owns(p);
}

static void delete_slow(void *p, size_t size, cm_family family, const char *name)
{
    cm_delete_fn program;
    if (program_memory(p) && (program = program_delete(family)) != NULL) {
        program(p);
        return;
    }
    cm_free_slow(p, size, family, name);
}

/* delete, delete[]: plain, nothrow, sized, aligned, sized+aligned, aligned+nothrow. Each hands
 * the debug mode its family, the sized forms their size too, which it checks against the
 * block's (fastpath.h's cm_free_as). */
static const char delete_name[] = "operator delete", delete_array_name[] = "operator delete[]";
static CM_ALWAYS_INLINE const char *delete_name_of(cm_family family)
{
    return family == CM_BY_NEW ? delete_name : delete_array_name;
}
static CM_ALWAYS_INLINE void delete_block(void *p, size_t size, cm_family family)
{
    cm_free_as(p, size, 0, family, delete_name_of(family), delete_slow);
}

/* The aligned forms: the slow path has no room for the alignment, so the test for memory of
 * the program's own comes first where the program has an aligned delete of its own (else a
 * load of the GOT and a compare: these forms are not on the budget's fast paths). */
typedef void (*cm_delete_aligned_fn)(void *p, size_t alignment);
void _ZdlPvSt11align_val_t(void *p, size_t alignment);
void _ZdaPvSt11align_val_t(void *p, size_t alignment);
extern void cm_own_delete_aligned(void *p, size_t alignment)
    __attribute__((alias("_ZdlPvSt11align_val_t"), visibility("hidden")));
extern void cm_own_delete_array_aligned(void *p, size_t alignment)
    __attribute__((alias("_ZdaPvSt11align_val_t"), visibility("hidden")));

/* Where the program has an aligned delete of its own: memory of its own goes there, and every
 * other block to the general path (with the name and family the fast path would give it). */
static CM_COLD void delete_aligned_with(cm_delete_aligned_fn program, void *p, size_t size,
                                        size_t alignment, cm_family family)
{
    if (program_memory(p))
        program(p, alignment);
    else
        cm_free_slow(p, size, family, delete_name_of(family));
}

static CM_ALWAYS_INLINE void delete_aligned(void *p, size_t size, size_t alignment,
                                            cm_family family)
{
    cm_delete_aligned_fn program = (cm_delete_aligned_fn)program_operator(
        family, (cm_operator)_ZdaPvSt11align_val_t, (cm_operator)cm_own_delete_array_aligned,
        (cm_operator)_ZdlPvSt11align_val_t, (cm_operator)cm_own_delete_aligned);
    if (CM_UNLIKELY(program != NULL))
        delete_aligned_with(program, p, size, alignment, family);
    else
        cm_free_as(p, size, 0, family, delete_name_of(family), cm_free_slow);
}
CM_DELETE(_ZdlPv, void *p)
{
    delete_block(p, CM_UNSIZED, CM_BY_NEW);
}
CM_DELETE(_ZdaPv, void *p)
{
    delete_block(p, CM_UNSIZED, CM_BY_NEW_ARRAY);
}
CM_DELETE(_ZdlPvRKSt9nothrow_t, void *p, const void *tag)
{
    (void)tag;
    delete_block(p, CM_UNSIZED, CM_BY_NEW);
}
CM_DELETE(_ZdaPvRKSt9nothrow_t, void *p, const void *tag)
{
    (void)tag;
    delete_block(p, CM_UNSIZED, CM_BY_NEW_ARRAY);
}
CM_DELETE(_ZdlPvm, void *p, size_t size)
{
    delete_block(p, size, CM_BY_NEW);
}
CM_DELETE(_ZdaPvm, void *p, size_t size)
{
    delete_block(p, size, CM_BY_NEW_ARRAY);
}
CM_DELETE(_ZdlPvSt11align_val_t, void *p, size_t alignment)
{
    delete_aligned(p, CM_UNSIZED, alignment, CM_BY_NEW);
}
CM_DELETE(_ZdaPvSt11align_val_t, void *p, size_t alignment)
{
    delete_aligned(p, CM_UNSIZED, alignment, CM_BY_NEW_ARRAY);
}
CM_DELETE(_ZdlPvmSt11align_val_t, void *p, size_t size, size_t alignment)
{
    delete_aligned(p, size, alignment, CM_BY_NEW);
}
CM_DELETE(_ZdaPvmSt11align_val_t, void *p, size_t size, size_t alignment)
{
    delete_aligned(p, size, alignment, CM_BY_NEW_ARRAY);
}
CM_DELETE(_ZdlPvSt11align_val_tRKSt9nothrow_t, void *p, size_t alignment, const void *tag)
{
    (void)tag;
    delete_aligned(p, CM_UNSIZED, alignment, CM_BY_NEW);
}
CM_DELETE(_ZdaPvSt11align_val_tRKSt9nothrow_t, void *p, size_t alignment, const void *tag)
{
    (void)tag;
    delete_aligned(p, CM_UNSIZED, alignment, CM_BY_NEW_ARRAY);
}
#endif /* CM_PREFIX */
