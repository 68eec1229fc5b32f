/* api.c - the slow paths of the entry points and the calls made of others (calloc, realloc,
 * the aligned forms, usable size): where a call's mode is decided. The debug mode
 * (CMALLOC_CHECK, check.c) and the sampler (CMALLOC_PROF / CMALLOC_GUARD_RATE, prof.c) each
 * take a call here before the allocator beneath them (alloc.c) serves it; none of those calls
 * back up. The first slow path of the process initializes it (cm_init).
 * Holds no lock and no state.
 */
#include "fastpath.h"

#include <string.h>

/* While sampling, the fast path sends every allocation here (cm_fast_path_classes): the same
 * pop, counted down towards the thread's next sample point by cm_sample_charge[class] (prof.c).
 * An allocation that would pass the point, or misses its list, goes to the sampler. */
static void *alloc_sampling(size_t size)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    size_t size_class;
    if (cm_small_class(size, &size_class)) {
        cm_free_list *list = &cache->lists[size_class];
        int64_t left = cache->sample_left - cm_sample_charge[size_class];
        if (left >= 0 && list->head != NULL) {
            cache->sample_left = left;
            return cm_free_list_pop(list);
        }
    }
    CM_DEBUG_WALK();
    return cm_sample_alloc(size);
}

void *cm_alloc_slow(size_t size)
{
    if (CM_UNLIKELY(cm_sampling))
        return alloc_sampling(size);
    if (CM_UNLIKELY(!cm_is_initialized()))
        cm_init();
    CM_DEBUG_WALK();
    if (CM_UNLIKELY(cm_option.check)) {
        void *p = cm_check_alloc(size);
        return p ? p : cm_out_of_memory();
    }
    return cm_alloc_unchecked(size);
}

/* alignment: a power of two. Aligned blocks above CM_ALIGNMENT are served unchecked and
 * unsampled (check.c's header would break their alignment). */
void *cm_alloc_aligned(size_t alignment, size_t size)
{
    if (alignment <= CM_ALIGNMENT)
        return cm_alloc(size);
    if (CM_UNLIKELY(!cm_is_initialized()))
        cm_init();
    return cm_alloc_aligned_unchecked(alignment, size);
}

void cm_free_slow(void *p, const char *caller)
{
    if (p == NULL || (CM_UNLIKELY(cm_option.check) && cm_check_free(p, caller)))
        return;
    CM_DEBUG_WALK();
    if (CM_UNLIKELY(cm_sampling) && cm_sample_free(p, caller))
        return;
    cm_free_unchecked(p, caller);
}

/* A free the fast path vetted (p starts an object of a SMALL span, its class in the pagemap,
 * and carries no free mark) that found its list full, or found the thread without a cache yet:
 * straight to the thread cache, without cm_free_unchecked's span lookup. That lookup reads the
 * span's metadata, cold in a thread that frees what others allocated (xmalloc's consumers
 * overflow a list every batch of frees). */
void cm_free_list_full(void *p)
{
    if (CM_UNLIKELY(cm_option.check || cm_sampling || !cm_is_initialized())) {
        cm_free_slow(p, "free");
        return;
    }
    CM_DEBUG_WALK();
    cm_thread_cache_free_slow(p, cm_pagemap_leaf_of(p)->classes[cm_pagemap_index(p)].size_class);
}

size_t cm_usable_size(const void *p)
{
    size_t size;
    if (p == NULL)
        return 0;
    if (CM_UNLIKELY(cm_option.check) && cm_check_usable_size(p, &size))
        return size;
    if (CM_UNLIKELY(cm_sampling) && cm_guard_owns(p))
        return cm_guard_usable_size(p, "malloc_usable_size");
    return cm_usable_size_unchecked(p);
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

/* realloc(p, 0) frees p and returns NULL, as glibc does. A sampled or guarded block moves
 * through the sampler, and in the debug mode every block that does not shrink moves (so stale
 * pointers hit the quarantine): their old blocks are freed through cm_free_slow, where those
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
        return move_block(cm_alloc(size), p, old, size, cm_free_slow);
    if (CM_UNLIKELY(cm_option.check))
        return cm_check_shrink(p, size)
                   ? p
                   : move_block(cm_alloc(size), p, cm_usable_size(p), size, cm_free_slow);
    void *resized = cm_realloc_in_place(p, size, &old);
    if (resized != NULL || old == 0)
        return resized;
    void *q = CM_UNLIKELY(cm_sampling) ? cm_alloc(size) : cm_alloc_for_realloc(size);
    return move_block(q, p, old, size, cm_free_unchecked);
}
