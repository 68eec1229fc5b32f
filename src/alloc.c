/* alloc.c - the allocator beneath the modes: size routing, large and mapped spans, and the
 * checks that turn a bad pointer into a clear report. api.c (above it, and above check.c and
 * the sampler) holds the slow paths of the entry points and decides which mode serves a call;
 * what it asks of the spans is here, in the *_unchecked functions and realloc's in-place cases.
 *
 * Size routing:
 *   size <= 256 KiB               a size class, through the thread cache
 *   256 KiB < size <= threshold   a LARGE span of whole pages from the page heap (kept and
 *                                 reused when freed, returned to the OS by age)
 *   size > threshold              a MAPPED span: its own mmap, munmap on free, mremap on realloc
 * (threshold = CMALLOC_MMAP_THRESHOLD, raised by frees of mapped blocks up to
 * CMALLOC_MMAP_THRESHOLD_MAX). A block realloc moves to CM_REALLOC_PAGES_MIN (32 KiB) or more
 * is a LARGE span whatever its size, with free pages after it where the heap has them, and a
 * LARGE span grows in place up to the threshold's maximum (cm_realloc_in_place).
 * Holds no lock of its own; the live MAPPED counters are atomics.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic size_t mapped_live_bytes, mapped_live_count;

/* Start addresses of the last MAPPED spans unmapped: a second free of one of them is told
 * apart from a pointer cmalloc never made. */
#define RECENTLY_UNMAPPED 64
static _Atomic uintptr_t recently_unmapped[RECENTLY_UNMAPPED];
static _Atomic unsigned recently_unmapped_next;

size_t cm_mapped_live_bytes(size_t *count)
{
    *count = atomic_load_explicit(&mapped_live_count, memory_order_relaxed);
    return atomic_load_explicit(&mapped_live_bytes, memory_order_relaxed);
}

/* mallopt may change the threshold while other threads read it. */
static size_t mmap_threshold(void)
{
    return __atomic_load_n(&cm_option.mmap_threshold, __ATOMIC_RELAXED);
}

/* ---- MAPPED spans ------------------------------------------------------------------------ */
static cm_span *map_span(size_t pages, size_t alignment)
{
    size_t bytes = pages << CM_PAGE_SHIFT;
    char *memory = cm_os_map_aligned(bytes, alignment > CM_PAGE_SIZE ? alignment : CM_PAGE_SIZE);
    if (memory == NULL)
        return NULL;
    cm_span *span = cm_span_new();
    if (span == NULL || !cm_pagemap_ensure((uintptr_t)memory >> CM_PAGE_SHIFT, 1)) {
        if (span)
            cm_span_delete(span);
        cm_os_unmap(memory, bytes);
        return NULL;
    }
    span->page = (uintptr_t)memory >> CM_PAGE_SHIFT;
    span->pages = pages;
    span->state = CM_SPAN_MAPPED;
    cm_page_heap_set_mapped(span);
    atomic_fetch_add_explicit(&mapped_live_bytes, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&mapped_live_count, 1, memory_order_relaxed);
    return span;
}

/* A mapped block freed by the program: later blocks of its size will likely come and go
 * too, so they are served by the page heap (kept and reused) rather than mmap and munmap. */
static void raise_mmap_threshold(size_t bytes)
{
    if (bytes > mmap_threshold() && bytes <= cm_option.mmap_threshold_max)
        __atomic_store_n(&cm_option.mmap_threshold, bytes, __ATOMIC_RELAXED);
}

static void unmap_span(cm_span *span)
{
    size_t bytes = span->pages << CM_PAGE_SHIFT;
    void *start = cm_span_start(span);
    unsigned slot = atomic_fetch_add_explicit(&recently_unmapped_next, 1, memory_order_relaxed);
    atomic_store_explicit(&recently_unmapped[slot % RECENTLY_UNMAPPED], (uintptr_t)start,
                          memory_order_relaxed);
    cm_page_heap_forget_mapped(span);
    cm_os_unmap(start, bytes);
    atomic_fetch_sub_explicit(&mapped_live_bytes, bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&mapped_live_count, 1, memory_order_relaxed);
}

/* When the OS refuses memory: give back everything cached (the calling thread's cache, the
 * transfer caches) and unmap every free span, so that one retry can succeed. */
static bool reclaim_for_retry(void)
{
    cm_thread_cache_flush_current();
    cm_central_drain();
    return cm_page_heap_unmap_free() > 0;
}

/* growable: a block realloc moved, placed where as many free pages follow it as it has. */
static cm_span *large_span(size_t size, size_t alignment, bool growable)
{
    size_t pages = size ? (size + CM_PAGE_SIZE - 1) >> CM_PAGE_SHIFT : 1; /* aligned size 0 */
    if (size > mmap_threshold())
        return map_span(pages, alignment);
    return growable ? cm_page_heap_alloc_with_room(pages, pages)
                    : cm_page_heap_alloc(
                          pages, alignment > CM_PAGE_SIZE ? alignment >> CM_PAGE_SHIFT : 1, 0);
}

/* A LARGE or MAPPED allocation of at least size bytes, aligned to alignment (a power of two
 * >= CM_PAGE_SIZE; CM_PAGE_SIZE when growable). */
static void *alloc_large(size_t size, size_t alignment, bool growable)
{
    if (size > CM_REQUEST_MAX || alignment > CM_REQUEST_MAX) /* no mapping, no reclaim: fail now */
        return cm_out_of_memory();
    cm_span *span = large_span(size, alignment, growable);
    if (span == NULL && reclaim_for_retry())
        span = large_span(size, alignment, growable);
    return span ? cm_span_start(span) : cm_out_of_memory();
}

static void *alloc_class(unsigned size_class)
{
    void *p = cm_thread_cache_alloc_slow(size_class);
    if (p == NULL && reclaim_for_retry())
        p = cm_thread_cache_alloc_slow(size_class);
    return p ? p : cm_out_of_memory();
}

/* An allocation without the debug mode's header or the sampler, for api.c, check.c, prof.c. */
void *cm_alloc_unchecked(size_t size)
{
    return size > CM_MAX_SMALL ? alloc_large(size, CM_PAGE_SIZE, false)
                               : alloc_class(cm_size_class(size));
}

/* realloc's new block when the old one must move (api.c): from CM_REALLOC_PAGES_MIN up, whole
 * pages with free pages after them, that a later realloc can grow in place
 * (cm_realloc_in_place). */
void *cm_alloc_for_realloc(size_t size)
{
    return size >= CM_REALLOC_PAGES_MIN ? alloc_large(size, CM_PAGE_SIZE, true)
                                        : alloc_class(cm_size_class(size));
}

/* An aligned allocation without the debug mode or the sampler (api.c's cm_alloc_aligned
 * decides); alignment: a power of two above CM_ALIGNMENT. */
void *cm_alloc_aligned_unchecked(size_t alignment, size_t size)
{
    if (size <= CM_MAX_SMALL && alignment <= CM_PAGE_SIZE) {
        unsigned size_class =
            cm_aligned_class(alignment, cm_size_class(size < alignment ? alignment : size));
        if (size_class != 0)
            return alloc_class(size_class);
    }
    return alloc_large(size, alignment, false);
}

/* ---- free ---------------------------------------------------------------------------------- */

/* The span of which p is an object start, or NULL. */
static cm_span *object_span(const void *p)
{
    cm_span *span = cm_is_initialized() ? cm_span_of(p) : NULL;
    if (span == NULL)
        return NULL;
    size_t offset = (size_t)((const char *)p - (const char *)cm_span_start(span));
    switch (span->state) {
    case CM_SPAN_SMALL: /* an object start, not a slot in the tail past the last object */
        return offset % cm_classes[span->size_class].size == 0 &&
                       offset / cm_classes[span->size_class].size <
                           cm_classes[span->size_class].objects
                   ? span
                   : NULL;
    case CM_SPAN_LARGE:
    case CM_SPAN_MAPPED: return offset == 0 ? span : NULL;
    default: return NULL;
    }
}

bool cm_is_object_start(const void *p)
{
    return object_span(p) != NULL;
}

/* Whether p, which is no object's start, was very likely handed out before: the start of a
 * free span, of a recently unmapped MAPPED span, or a page boundary inside a free span (a
 * LARGE span merged with free neighbours after its free). Error path only: walks back
 * through the pagemap. */
static bool freed_before(const void *p)
{
    cm_span *span = cm_span_of(p);
    if (span != NULL)
        return span->state == CM_SPAN_FREE && p == cm_span_start(span);
    for (unsigned i = 0; i < RECENTLY_UNMAPPED; i++)
        if (atomic_load_explicit(&recently_unmapped[i], memory_order_relaxed) == (uintptr_t)p)
            return true;
    if (((uintptr_t)p & (CM_PAGE_SIZE - 1)) != 0)
        return false;
    for (size_t back = 1; back <= CM_PAGEMAP_LEAF_ENTRIES; back++) {
        const char *probe = (const char *)p - back * CM_PAGE_SIZE;
        if (cm_pagemap_leaf_of(probe) == NULL)
            return false;
        span = cm_span_of(probe);
        if (span != NULL)
            return span->state == CM_SPAN_FREE &&
                   ((uintptr_t)p >> CM_PAGE_SHIFT) - span->page < span->pages;
    }
    return false;
}

/* The span of a pointer the program hands back, or NULL after reporting it as bad. */
static cm_span *checked_span(const void *p, const char *caller)
{
    cm_span *span = object_span(p);
    if (span == NULL) {
        if (cm_is_initialized() && freed_before(p))
            cm_report_double_free(caller, p);
        else
            cm_report_invalid_pointer(caller, p);
    }
    return span;
}

/* Whether p, an object start of span, is free already: a SMALL span's object that carries the
 * free mark and is on no cache a fork left behind (whose list takes it back, handed out). */
static bool small_object_free(void *p, const cm_span *span)
{
    return span->state == CM_SPAN_SMALL && cm_object_is_free(p) &&
           !cm_thread_cache_take_left_behind(p, span->size_class);
}

static void free_span_object(void *p, cm_span *span, const char *caller)
{
    if (span->state == CM_SPAN_SMALL) {
        if (small_object_free(p, span))
            cm_report_double_free(caller, p);
        else
            cm_thread_cache_free_slow(p, span->size_class);
    } else if (span->state == CM_SPAN_LARGE) {
        cm_page_heap_free(span);
    } else {
        raise_mmap_threshold(span->pages << CM_PAGE_SHIFT);
        unmap_span(span);
    }
}

void cm_free_unchecked(void *p, const char *caller)
{
    cm_span *span = checked_span(p, caller);
    if (span != NULL)
        free_span_object(p, span, caller);
}

static size_t span_usable_size(const cm_span *span)
{
    return span->state == CM_SPAN_SMALL ? cm_classes[span->size_class].size
                                        : span->pages << CM_PAGE_SHIFT;
}

/* 0 for a pointer that starts no block, reported as caller's. */
size_t cm_usable_size_unchecked(const void *p, const char *caller)
{
    cm_span *span = checked_span(p, caller);
    return span ? span_usable_size(span) : 0;
}

/* ---- calloc, realloc: what api.c's calls need of the spans ---------------------------------- */
/* Whether a fresh block of size bytes at p is known to read as zero: its own new mapping. */
bool cm_alloc_is_zeroed(const void *p, size_t size)
{
    cm_span *span = size > mmap_threshold() ? cm_pagemap_lookup(p) : NULL;
    return span != NULL && span->state == CM_SPAN_MAPPED;
}

/* Resizes a MAPPED span's mapping without copying: in place, or moved onto a new reservation.
 * Returns the new address or NULL (the old block intact). */
static void *remap_span(cm_span *span, size_t size)
{
    size_t pages = (size + CM_PAGE_SIZE - 1) >> CM_PAGE_SHIFT,
           old_bytes = span->pages << CM_PAGE_SHIFT;
    void *old = cm_span_start(span);
    if (cm_os_resize(old, old_bytes, pages << CM_PAGE_SHIFT)) {
        atomic_fetch_add_explicit(&mapped_live_bytes, (pages << CM_PAGE_SHIFT) - old_bytes,
                                  memory_order_relaxed);
        span->pages = pages;
        return old;
    }
    cm_span *moved = map_span(pages, CM_PAGE_SIZE);
    if (moved == NULL)
        return NULL;
    if (!cm_os_move(old, old_bytes, cm_span_start(moved), pages << CM_PAGE_SHIFT)) {
        unmap_span(moved);
        return NULL;
    }
    /* The old range is gone already: forget its span without unmapping again. */
    cm_page_heap_forget_mapped(span);
    atomic_fetch_sub_explicit(&mapped_live_bytes, old_bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&mapped_live_count, 1, memory_order_relaxed);
    return cm_span_start(moved);
}

/* realloc's cases that need no new block: the block fits (wasting at most half), a page-heap
 * block grows or shrinks where it lies, a MAPPED block is remapped. Returns the block (p, or a
 * MAPPED block's new address); NULL with *old_size = its usable size when the caller must move
 * it; NULL with *old_size = 0 when it failed (ENOMEM; an invalid or freed p reported), p
 * intact. */
void *cm_realloc_in_place(void *p, size_t size, size_t *old_size)
{
    *old_size = 0;
    cm_span *span = checked_span(p, "realloc");
    if (span == NULL)
        return cm_out_of_memory();
    if (small_object_free(p, span)) { /* else kept in place, or copied from, unnoticed */
        cm_report_double_free("realloc", p);
        return cm_out_of_memory();
    }
    size_t old = span_usable_size(span);
    if (span->state == CM_SPAN_MAPPED && size > mmap_threshold()) {
        if (size > CM_REQUEST_MAX)
            return cm_out_of_memory();
        void *moved = remap_span(span, size);
        return moved ? moved : cm_out_of_memory();
    }
    if (size <= old && size >= old / 2)
        return p;
    /* A LARGE block grows in place past the threshold too (a fresh block that size would be
     * mapped): the same free pages, without the copy into a mapping (up to the highest
     * threshold, so that frees keep their bound on what the heap holds). */
    size_t grow_limit = mmap_threshold() > cm_option.mmap_threshold_max
                            ? mmap_threshold()
                            : cm_option.mmap_threshold_max;
    if (span->state == CM_SPAN_LARGE && size >= CM_REALLOC_PAGES_MIN && size <= grow_limit &&
        cm_page_heap_resize(span, (size + CM_PAGE_SIZE - 1) >> CM_PAGE_SHIFT))
        return p;
    *old_size = old;
    return NULL;
}
