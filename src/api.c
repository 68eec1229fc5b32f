/* api.c - the slow paths of the entry points (those of fastpath.h's fast paths, and usable
 * size): where a call's mode is decided. The debug mode (CMALLOC_CHECK, check.c) and the
 * sampler (CMALLOC_PROF / CMALLOC_GUARD_RATE, prof.c) each take a call here before the
 * allocator beneath them (alloc.c) serves it; none of those calls back up. The first slow path
 * of the process initializes it (cm_init). Below the fast paths, so it never uses them:
 * fastpath.h calls in, and the calls made of others (calloc, realloc, the aligned forms) are
 * in compound.c, above. Holds no lock and no state.
 */
#include "internal.h"

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

/* family: the calls that must free the block (internal.h), which the debug mode records. */
void *cm_alloc_slow_by(size_t size, cm_family family)
{
    if (CM_UNLIKELY(cm_sampling))
        return alloc_sampling(size);
    if (CM_UNLIKELY(!cm_is_initialized()))
        cm_init();
    CM_DEBUG_WALK();
    if (CM_UNLIKELY(cm_option.check)) {
        void *p = cm_check_alloc(size, family);
        return p ? p : cm_out_of_memory();
    }
    return cm_alloc_unchecked(size);
}

void *cm_alloc_slow(size_t size)
{
    return cm_alloc_slow_by(size, CM_BY_MALLOC);
}

/* size: what a sized free was told (CM_UNSIZED: nothing), and family: the calls it is of
 * (internal.h), which the debug mode checks. */
void cm_free_slow(void *p, size_t size, cm_family family, const char *caller)
{
    if (p == NULL || (CM_UNLIKELY(cm_option.check) && cm_check_free(p, size, family, caller)))
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
        cm_free_slow(p, CM_UNSIZED, CM_BY_MALLOC, "free");
        return;
    }
    CM_DEBUG_WALK();
    cm_thread_cache_free_slow(p, cm_pagemap_leaf_of(p)->classes[cm_pagemap_index(p)].size_class);
}

/* The usable size of p's block (in the debug mode, the size requested), never 0 for a block;
 * 0 for NULL, and for a pointer that starts no live block after a report naming caller. */
size_t cm_usable_size(const void *p, const char *caller)
{
    size_t size;
    if (p == NULL)
        return 0;
    if (CM_UNLIKELY(cm_option.check) && cm_check_usable_size(p, &size))
        return size;
    if (CM_UNLIKELY(cm_sampling) && cm_guard_owns(p))
        return cm_guard_usable_size(p, caller);
    return cm_usable_size_unchecked(p, caller);
}
