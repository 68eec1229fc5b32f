/* fastpath.h - the two fast paths, malloc and free on a thread-cache hit, and free's test of
 * a block for realloc and malloc_usable_size (cm_small_class_of), inlined into the entry
 * points (override.c, operator_new.c, compound.c, pool.c, arena.c) and nowhere else: they call
 * api.c's slow paths, the top of the allocator, which no lower layer may do (and
 * thread_cache.c's for a span's local list, which only a live cache with a slot reaches, past
 * every mode api.c decides); api.c does not include this file, so the fast paths stand on the
 * slow paths and not the other way round.
 */
#ifndef CM_FASTPATH_H
#define CM_FASTPATH_H

#include "internal.h"

#pragma GCC visibility push(hidden)

/* ---- fast paths ----------------------------------------------------------------------------
 * Before a thread's first slow path, cm_thread_cache_current points at an empty shared cache
 * whose lists are all empty with max_length 0 and start_limit 0, so both paths fall through to
 * the slow path with no extra test (and never write to it). malloc: a size test (sizes up to
 * 1152 B first), a table read (while sampling, a table that sends every size to the slow path:
 * api.c's alloc_sampling counts allocations down to the next sample point), a pop with a link
 * check, and the free mark cleared; an empty list steps through the class's fresh run instead
 * (never-used objects in address order, no link to read: thread_cache.c, "fresh runs"), then
 * pops its inbox (a mailbox taken whole, with a prefetch ahead: "inboxes"), and only then
 * calls the slow path. free: a pagemap read of the class byte, an object-start test
 * (with the constants its list carries), the double-free test (the free mark's low byte: a
 * match goes to the slow path, which tests the word; internal.h), a push if the list
 * has room (a full list sends an object of a span the thread owns to the span's local list, one
 * of the owner the class's outbox collects for to the outbox, and any other to
 * cm_free_list_full, which skips the span lookup the general path makes). No byte
 * counts: a cache's bytes are bounded by its lists' max_length, and its local lists by the
 * spans they are on (thread_cache.c).
 * Together 70 instructions per malloc+free pair up to 1152 B (73 above) with the caller's loop
 * and PLT jumps; the budget test counts them with callgrind and fails above its budget. free's
 * pagemap read goes through the hot leaf while the heap has one (pagemap.c).
 */
/* A free the full list has no room for, of a span the thread owns: onto the span's local list
 * (thread_cache.c, "local lists") while the thread holds it (so the list has objects already)
 * and the object is not the span's last one out; the slow path does the rest. */
static inline void cm_free_to_own_span(cm_thread_cache *cache, cm_span *span,
                                       const cm_free_list *list, void *p, uintptr_t mark)
{
    /* The class from the list's place, not kept from the class byte: keeping it costs the
     * hit path a register move. */
    size_t size_class = (size_t)(list - cache->lists);
    if (CM_LIKELY(__atomic_load_n(&span->local_holder, __ATOMIC_RELAXED) == cache &&
                  span->local_count + 1 < __atomic_load_n(&span->used, __ATOMIC_RELAXED))) {
        cm_link_set_marked(p, span->local_free, mark);
        span->local_free = p;
        span->local_count++;
        cache->local_objects[size_class]++;
        return;
    }
    cm_thread_cache_free_local(span, p);
}

/* A free the full list has no room for, of a span whose owner the class's outbox collects
 * for (thread_cache.c, "outboxes"): onto the outbox's newest run while it is of the same span
 * (onto a plain chain, whatever the span) and the outbox has room; the slow path starts a run
 * or a chain, or posts a full outbox first. The span is only named, never read: a consumer's
 * span lines are cold. */
static inline void cm_free_to_outbox(cm_thread_cache *cache, const cm_span *span,
                                     const cm_free_list *list, void *p, uintptr_t mark)
{
    size_t size_class = (size_t)(list - cache->lists);
    cm_outbox *box = &cache->outboxes[size_class];
    if (CM_LIKELY((box->chain.run_span == (uintptr_t)span || box->chain.plain) &&
                  box->chain.count < box->most)) {
        cm_link_set_marked(p, box->chain.top, mark);
        box->chain.top = p;
        box->chain.count++;
        return;
    }
    cm_thread_cache_free_remote(span, p, (unsigned)size_class);
}

/* The slow path of an allocation by family's calls: the malloc family's takes one argument
 * less, which kept a register free in cm_alloc_aligned (posix_memalign 131 -> 128
 * instructions, tests/test_fastpath_budget.sh). */
static inline void *cm_alloc_slow_of(size_t size, cm_family family)
{
    return family == CM_BY_MALLOC ? cm_alloc_slow(size) : cm_alloc_slow_by(size, family);
}

/* family: the calls that must free the block (internal.h), for the debug mode's slow path. */
static inline void *cm_alloc_by(size_t size, cm_family family)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    size_t size_class;
    if (CM_UNLIKELY(!cm_class_lookup_in(cm_fast_path_classes, size, &size_class)))
        return cm_alloc_slow_of(size, family);
    cm_free_list *list = &cache->lists[size_class];
    if (CM_LIKELY(list->head != NULL))
        return cm_free_list_pop(list);
    /* the list is empty: the class's fresh run (never-used objects in address order, no link
     * to read; thread_cache.c, "fresh runs"), then its inbox (objects other threads freed,
     * popped with a prefetch ahead; "inboxes"), found from the list's address: from the class,
     * it cost the hit path a register move */
    cm_fresh_run *run = (cm_fresh_run *)((char *)list + offsetof(cm_thread_cache, runs) -
                                         offsetof(cm_thread_cache, lists));
    void *object = cm_fresh_run_take(run);
    if (CM_LIKELY(object != NULL))
        return object;
    return run->inbox != NULL ? cm_thread_cache_inbox_pop(run) : cm_alloc_slow_of(size, family);
}

static inline void *cm_alloc(size_t size)
{
    return cm_alloc_by(size, CM_BY_MALLOC);
}

/* Inlined into every entry point that frees, whatever the compiler makes of its size: a call
 * would add its jump to every free. size: what a sized free (a sized operator delete, C23's
 * free_sized) was told, or CM_UNSIZED; family: the calls the free is of (internal.h); caller:
 * the call a report names. None is read on the fast path: the debug mode's blocks all take the
 * slow path, where it checks the size and the family. fit: a size the block's class must hold
 * for the fast path to take it (free_sized's; 0, a constant the test folds away, for the
 * others). slow: api.c's cm_free_slow, or a path of the entry point's own in front of it
 * (operator_new.c's, compound.c's). */
typedef void (*cm_free_slow_path)(void *p, size_t size, cm_family family, const char *caller);
static CM_ALWAYS_INLINE void cm_free_as(void *p, size_t size, size_t fit, cm_family family,
                                        const char *caller, cm_free_slow_path slow)
{
    cm_pagemap_leaf *leaf = cm_pagemap_leaf_of(p);
    cm_thread_cache *cache = cm_thread_cache_current;
    size_t index = cm_pagemap_index(p);
    size_t size_class;
    if (CM_LIKELY(leaf != NULL && (size_class = leaf->classes[index].size_class) != 0)) {
        /* p must start one of the span's objects (size_class.c: start_limit). */
        uint64_t offset = ((uint64_t)leaf->classes[index].span_pages << CM_PAGE_SHIFT) |
                          ((uintptr_t)p & (CM_PAGE_SIZE - 1));
        cm_free_list *list = &cache->lists[size_class];
        uintptr_t mark = cm_free_mark(p);
        if (CM_LIKELY(offset * list->start_magic < list->start_limit &&
                      !cm_object_may_be_free(p, mark) && cm_classes[size_class].size >= fit)) {
            if (CM_LIKELY(--list->room >= 0)) {
                cm_free_list_push(list, p, mark);
                return;
            }
            list->room = 0; /* it had none */
            uint16_t owner = __atomic_load_n(&leaf->classes[index].owner, __ATOMIC_RELAXED);
            if (owner == cache->own_slot)
                cm_free_to_own_span(cache, leaf->spans[index], list, p, mark);
            else if (owner == cache->outbox_slot[list - cache->lists])
                cm_free_to_outbox(cache, leaf->spans[index], list, p, mark);
            else
                cm_free_list_full(p);
            return;
        }
    }
    slow(p, size, family, caller);
}

static CM_ALWAYS_INLINE void cm_free(void *p)
{
    cm_free_as(p, CM_UNSIZED, 0, CM_BY_MALLOC, "free", cm_free_slow);
}

/* The class of p if it starts an object of a SMALL span and carries no free mark, tested as
 * cm_free tests it (so 0 before the thread's first slow path, whose empty lists admit no
 * object); else 0, and the caller takes the general path, which reports a bad pointer (or,
 * for a live object whose second word merely shares the mark's low byte, serves it). For
 * realloc, which then moves a small block through the fast paths (the general path looks the
 * span up, divides to find the object start, and allocates and frees through the thread
 * cache's slow paths: two moves of 100 B to 300 and back 889 instructions at 8d8bfbd, 291
 * now, copies included, tests/test_fastpath_budget.sh), and
 * for malloc_usable_size. cm_free writes the same test out rather than call this: shared,
 * in either shape tried, it cost free a register copy (the fast-path budget's pair 73 -> 74
 * instructions, tests/test_fastpath_budget.sh). */
static inline size_t cm_small_class_of(const void *p)
{
    const cm_pagemap_leaf *leaf = cm_pagemap_leaf_of(p);
    size_t index = cm_pagemap_index(p), size_class;
    if (leaf == NULL || (size_class = leaf->classes[index].size_class) == 0)
        return 0;
    uint64_t offset = ((uint64_t)leaf->classes[index].span_pages << CM_PAGE_SHIFT) |
                      ((uintptr_t)p & (CM_PAGE_SIZE - 1));
    const cm_free_list *list = &cm_thread_cache_current->lists[size_class];
    bool start = offset * list->start_magic < list->start_limit;
    return start && !cm_object_may_be_free(p, cm_free_mark(p)) ? size_class : 0;
}

#pragma GCC visibility pop

#endif /* CM_FASTPATH_H */
