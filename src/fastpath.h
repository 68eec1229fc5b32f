/* fastpath.h - the two fast paths, malloc and free on a thread-cache hit, inlined into the
 * entry points (override.c, api.c, pool.c, arena.c) and nowhere else: they call api.c's slow
 * paths, the top of the allocator, which no lower layer may do.
 */
#ifndef CM_FASTPATH_H
#define CM_FASTPATH_H

#include "internal.h"

#pragma GCC visibility push(hidden)

/* ---- fast paths ----------------------------------------------------------------------------
 * Before a thread's first slow path, cm_thread_cache_current points at an empty shared cache
 * whose lists are all empty with max_length 0, so both paths fall through to the slow path
 * with no extra test. malloc: a size test (sizes up to 1152 B first), a table read, a pop (with
 * a link check), the sampling countdown (prof.c: charges are 0 when sampling is off, so it never
 * runs out) and the free mark cleared. free: a pagemap read of the class byte, an object-start
 * test, the double-free test (the free mark), a length test and a push (a full list goes to
 * cm_free_list_full, which skips the span lookup the general path makes). No byte counts: a
 * cache's bytes are bounded by its lists' max_length (thread_cache.c). Together 87 instructions per
 * malloc+free pair up to 1152 B (90 above) with the caller's loop and PLT jumps; the budget test
 * counts them with callgrind and fails above its budget.
 */
static inline void *cm_alloc(size_t size)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    size_t size_class;
    if (CM_UNLIKELY(!cm_small_class(size, &size_class)))
        return cm_alloc_slow(size);
    cm_free_list *list = &cache->lists[size_class];
    int64_t left = cache->sample_left - cm_sample_charge[size_class];
    void *object = list->head;
    if (CM_LIKELY(left >= 0) && CM_LIKELY(object != NULL)) {
        cache->sample_left = left;
        list->head = cm_link_next_checked(object);
        cm_object_hand_out(object);
        list->length--;
        return object;
    }
    return cm_alloc_slow(size);
}

static inline void cm_free(void *p)
{
    cm_pagemap_leaf *leaf = cm_pagemap_leaf_of(p);
    cm_thread_cache *cache = cm_thread_cache_current;
    size_t index = cm_pagemap_index(p);
    size_t size_class;
    if (CM_LIKELY(leaf != NULL && (size_class = leaf->size_classes[index]) != 0)) {
        /* p must start one of the span's objects (size_class.c: start_limit). */
        uint64_t offset = ((uint64_t)leaf->span_pages[index] << CM_PAGE_SHIFT) |
                          ((uintptr_t)p & (CM_PAGE_SIZE - 1));
        const cm_class_info *info = &cm_classes[size_class];
        cm_free_list *list = &cache->lists[size_class];
        uintptr_t mark = cm_free_mark(p);
        if (CM_LIKELY(offset * info->divisor_magic < info->start_limit &&
                      ((uintptr_t *)p)[1] != mark)) {
            if (CM_LIKELY(list->length < list->max_length)) {
                cm_link_set_marked(p, list->head, mark);
                list->head = p;
                list->length++;
                return;
            }
            cm_free_list_full(p);
            return;
        }
    }
    cm_free_slow(p, "free");
}

#pragma GCC visibility pop

#endif /* CM_FASTPATH_H */
