/* compound.c - the calls made of others: calloc, realloc, the aligned forms, C23's sized frees
 * (free_sized, free_aligned_sized) and malloc_usable_size, built on the fast paths (fastpath.h)
 * and on the modes' own calls (api.c decides which mode takes a block; check.c's and prof.c's
 * realloc hooks). Called by the entry points (override.c). Holds no lock and no state.
 */
#include "fastpath.h"

#include <string.h>

/* alignment: a power of two. Aligned blocks above CM_ALIGNMENT are served unsampled, and in
 * the debug mode with their header inside an object aligned for them (check.c). Up to a page,
 * one with a class pops its list as malloc's fast path does (class 0, whose list is always
 * empty, while the sampler or the debug mode sends allocations to the slow path, or before
 * init): through alloc.c's slow path, which fills the list, posix_memalign(64, 100) and free
 * took 223 instructions at 8d8bfbd, 128 now (tests/test_fastpath_budget.sh). family: the calls
 * that must free the block (internal.h), for the debug mode. */
static CM_ALWAYS_INLINE void *alloc_aligned(size_t alignment, size_t size, cm_family family)
{
    if (alignment <= CM_ALIGNMENT)
        return cm_alloc_by(size, family);
    size_t size_class;
    if (alignment <= CM_PAGE_SIZE &&
        cm_class_lookup_in(cm_fast_path_classes, size < alignment ? alignment : size,
                           &size_class)) {
        cm_free_list *list =
            &cm_thread_cache_current->lists[cm_aligned_class(alignment, size_class)];
        if (CM_LIKELY(list->head != NULL))
            return cm_free_list_pop(list);
    }
    if (CM_UNLIKELY(!cm_is_initialized()))
        cm_init();
    if (CM_UNLIKELY(cm_option.check)) {
        void *p = cm_check_alloc_aligned(alignment, size, family);
        return p ? p : cm_out_of_memory();
    }
    return cm_alloc_aligned_unchecked(alignment, size);
}

void *cm_alloc_aligned(size_t alignment, size_t size)
{
    return alloc_aligned(alignment, size, CM_BY_MALLOC);
}

void *cm_alloc_aligned_by(size_t alignment, size_t size, cm_family family)
{
    return alloc_aligned(alignment, size, family);
}

void *cm_calloc(size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total))
        return cm_out_of_memory();
    void *p = cm_alloc(total);
    /* A fresh mapping is already zero (unless the debug mode filled it). */
    if (p != NULL && (cm_option.check || !cm_alloc_is_zeroed(p, total)))
        memset(p, 0, total);
    return p;
}

/* realloc's move to q, the new block (NULL: out of memory, p kept): the contents, and the old
 * block freed by release. */
static void *move_block(void *q, void *p, size_t old, size_t size,
                        void (*release)(void *, const char *))
{
    if (q != NULL) {
        memcpy(q, p, size < old ? size : old);
        release(p, "realloc");
    }
    return q;
}

/* move_block's release through the modes (api.c), for the blocks they may hold. */
static void free_through_modes(void *p, const char *caller)
{
    cm_free_slow(p, CM_UNSIZED, CM_BY_MALLOC, caller);
}

/* move_block's release for a block cm_small_class_of vetted. */
static void free_moved(void *p, const char *caller)
{
    (void)caller;
    cm_free(p);
}

/* realloc(p, 0) frees p and returns NULL, as glibc does. A sampled or guarded block moves
 * through the sampler, and in the debug mode every block that does not shrink moves (so stale
 * pointers hit the quarantine): their old blocks are freed through api.c's slow path, where those
 * modes see them; an ordinary block's straight through alloc.c, which gives a block moved to a
 * large size whole pages, to grow in place next time (while sampling, which charges every
 * allocation, it comes from cm_alloc). */
void *cm_realloc(void *p, size_t size)
{
    if (p == NULL)
        return cm_alloc(size);
    if (size == 0) {
        cm_free(p);
        return NULL;
    }
    size_t old;
    if (CM_UNLIKELY(cm_sampling) && cm_sample_realloc_moves(p, &old))
        return move_block(cm_alloc(size), p, old, size, free_through_modes);
    if (CM_UNLIKELY(cm_option.check))
        return cm_check_shrink(p, size)
                   ? p
                   : move_block(cm_alloc(size), p, cm_usable_size(p, "realloc"), size,
                                free_through_modes);
    size_t size_class = cm_small_class_of(p);
    if (size_class != 0) {
        old = cm_classes[size_class].size;
        if (size <= old && size >= old / 2)
            return p;
        if (size < CM_REALLOC_PAGES_MIN)
            return move_block(cm_alloc(size), p, old, size, free_moved);
    }
    void *resized = cm_realloc_in_place(p, size, &old);
    if (resized != NULL || old == 0)
        return resized;
    void *q = CM_UNLIKELY(cm_sampling) ? cm_alloc(size) : cm_alloc_for_realloc(size);
    return move_block(q, p, old, size, cm_free_unchecked);
}

/* A small block's class size, vetted as realloc vets it (cm_small_class_of); anything else
 * (the debug mode's blocks, guarded, large and bad pointers) through api.c. The general path
 * looks the span up and divides: 76 instructions a call at 8d8bfbd, 39 now, mimalloc v3 25
 * (tests/test_fastpath_budget.sh; its program under LD_PRELOAD=<lib> for the peer). */
size_t cm_malloc_usable_size(const void *p)
{
    size_t size_class = cm_small_class_of(p);
    return size_class != 0 ? cm_classes[size_class].size : cm_usable_size(p, "malloc_usable_size");
}

/* Whether alignment is a power of two that p has. */
static bool aligned_to(const void *p, size_t alignment)
{
    return cm_is_power_of_two(alignment) && ((uintptr_t)p & (alignment - 1)) == 0;
}

/* cm_free_sized's general path, for what free's fast test does not take and for a pointer
 * that lacks the alignment: a bad pointer or a double free reported as free reports them, a
 * size past the block's usable bytes or a wrong alignment as a sized free's. */
static void free_sized_general(void *p, size_t alignment, size_t size, const char *caller)
{
    size_t usable = cm_usable_size(p, caller);
    if (usable == 0)
        return; /* NULL, or reported */
    if (CM_UNLIKELY(size > usable || !aligned_to(p, alignment))) {
        cm_report_sized_free(caller, p, alignment, size, usable, false);
        return;
    }
    cm_free_slow(p, size, CM_BY_MALLOC, caller);
}

/* free's fast path did not take a sized free: p is no live small block, or its class is
 * smaller than size (the general path reports it). The alignment was tested before. */
static void free_sized_slow(void *p, size_t size, cm_family family, const char *caller)
{
    (void)family;
    free_sized_general(p, 1, size, caller);
}

/* free_sized and free_aligned_sized (C23; glibc has its own since 2.43, which a program's call
 * must not reach with cmalloc's block): a free told the size the block was asked for, and the
 * alignment for the aligned form (alignment 1 for free_sized). C leaves any other size or
 * alignment undefined; without a record of each request, what can be checked is that the size
 * fits the block (in the debug mode, the size requested) and that p has the alignment, a power
 * of two. A call that fails either is reported, and the block leaked, as a bad pointer is; a
 * bad pointer or a double free is reported as free reports it, naming caller. A small block
 * whose class holds size takes free's fast path, with the class's size tested there: malloc
 * and free_sized 92 instructions a pair against free's 73, 141 with free_sized vetting the
 * block apart before free's path (tests/test_fastpath_budget.sh, at 6a5b69d for the 141). */
void cm_free_sized(void *p, size_t alignment, size_t size, const char *caller)
{
    if (CM_LIKELY(aligned_to(p, alignment)))
        cm_free_as(p, size, size, CM_BY_MALLOC, caller, free_sized_slow);
    else
        free_sized_general(p, alignment, size, caller);
}
