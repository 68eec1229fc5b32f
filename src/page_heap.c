/* page_heap.c - the back end: spans of whole 8 KiB pages, split on demand, coalesced on free,
 * grown from the OS in chunks of at least 2 MiB, and given back to the OS by age.
 *
 *   free_sets[0]    resident free spans (written since the OS gave them, or not given back)
 *   free_sets[1]    released free spans (a fresh chunk's untouched pages, or madvised away)
 *     exact[n]      free spans of exactly n pages, 1 <= n <= 128 (n = 0 unused); bit n of
 *                   nonempty says whether the list has a span, so a search is a bit scan
 *     large         free spans of more than 128 pages, searched best fit
 *
 * A request takes the smallest hole of up to 128 pages that fits, whatever its state (a hole
 * cut for less keeps the others whole); past the holes, a request of up to 128 pages is cut
 * from a resident run first, and a larger one takes the best fit of either state
 * (find_locked). So pages a program wrote and freed are handed out again before any page the
 * OS must fault in: a program that frees its small objects and allocates them again keeps the
 * resident set it had (a fresh chunk's untouched rest would otherwise sit in the same
 * coalesced span, at a lower address, and be touched first). Resident and released free
 * spans side by side stay apart for that; when no single span fits a request, a run of free
 * spans of both states is merged before the heap grows (find_across_locked): a request one
 * coalesced span would have served never grows the heap.
 * Callers: the central cache (spans for size classes) and alloc.c (large allocations, and
 * blocks realloc moves, placed with free pages after them: cm_page_heap_alloc_with_room). One
 * lock, heap_lock, guards every list, every FREE span and the counters; it is taken inside a
 * central cache lock and may take the pagemap and metadata locks (see internal.h).
 * Invariants: no two FREE spans of the same state are adjacent (free coalesces both ways); a
 * FREE span is on the set its released flag names; its first and last pages map to it and
 * its inner pages map to NULL; free_pages == sum of FREE span lengths, released_pages == sum
 * over released FREE spans.
 * Release by age: a free span idle for CMALLOC_RELEASE_DELAY_MS is madvised away, checked
 * whenever the heap is entered, or at once by cm_page_heap_release (which background.c's
 * release thread also calls). Release on growth: the heap gives back as many resident free
 * pages as it maps (grow_locked). When the OS refuses memory, cm_page_heap_unmap_free unmaps every
 * free span so that the retry can succeed.
 * Span structs: cm_span_new and cm_span_delete recycle them through spare_spans (its own lock,
 * span_struct_lock, taken inside the heap lock and outside metadata's, since alloc.c also makes
 * and deletes LARGE and MAPPED spans without the heap lock). A dead span struct is never freed:
 * a stale pagemap entry may still point at it, and it says DEAD.
 */
#include "internal.h"

#include <string.h>

#define GROW_MIN_PAGES (CM_HEAP_GROW_MIN >> CM_PAGE_SHIFT)

static cm_lock heap_lock = CM_LOCK_INIT;
typedef struct {
    cm_span *exact[CM_HEAP_LISTS + 1];
    uint64_t nonempty[(CM_HEAP_LISTS + 64) / 64]; /* bit n: exact[n] has a span */
    cm_span *large;
} free_set;
_Static_assert(CM_HEAP_LISTS < 64 * (sizeof((free_set *)0)->nonempty / sizeof(uint64_t)),
               "a bit per list");
static free_set free_sets[2]; /* indexed by a span's released flag */
static size_t free_pages;     /* in FREE spans */
static size_t released_pages; /* in FREE spans given back to the OS */
static size_t large_pages;    /* in LARGE spans (allocations above the largest class) */
static size_t large_count;    /* LARGE spans */
static uint64_t last_release_scan_ms;
static cm_lock span_struct_lock = CM_LOCK_INIT;
static cm_span *spare_spans; /* dead span structs, linked through next */

/* A zeroed span struct, or NULL when the OS refuses memory. */
cm_span *cm_span_new(void)
{
    cm_lock_acquire(&span_struct_lock);
    cm_span *span = spare_spans;
    if (span != NULL)
        spare_spans = span->next;
    cm_lock_release(&span_struct_lock);
    if (span == NULL)
        return cm_metadata_alloc(sizeof *span); /* zeroed */
    memset(span, 0, sizeof *span);
    return span;
}

void cm_span_delete(cm_span *span)
{
    span->state = CM_SPAN_DEAD;
    span->size_class = 0;
    cm_lock_acquire(&span_struct_lock);
    span->next = spare_spans;
    spare_spans = span;
    cm_lock_release(&span_struct_lock);
}

/* List n of a set: exact[n] for 1 <= n <= CM_HEAP_LISTS, large for CM_HEAP_LISTS + 1. */
static cm_span **set_list(free_set *set, size_t n)
{
    return n <= CM_HEAP_LISTS ? &set->exact[n] : &set->large;
}

static cm_span **list_for(const cm_span *span)
{
    return set_list(&free_sets[span->released], span->pages);
}

static void list_insert(cm_span *span)
{
    CM_ASSERT(cm_lock_is_mine(&heap_lock) && span->state == CM_SPAN_FREE && span->pages > 0);
    cm_span **head = list_for(span);
    span->prev = NULL;
    span->next = *head;
    if (*head)
        (*head)->prev = span;
    *head = span;
    if (span->pages <= CM_HEAP_LISTS)
        free_sets[span->released].nonempty[span->pages / 64] |=
            (uint64_t)1 << (span->pages % 64);
    free_pages += span->pages;
    released_pages += span->released ? span->pages : 0;
}

static void list_remove(cm_span *span)
{
    if (span->prev)
        span->prev->next = span->next;
    else if ((*list_for(span) = span->next) == NULL && span->pages <= CM_HEAP_LISTS)
        free_sets[span->released].nonempty[span->pages / 64] &=
            ~((uint64_t)1 << (span->pages % 64));
    if (span->next)
        span->next->prev = span->prev;
    span->next = span->prev = NULL;
    free_pages -= span->pages;
    released_pages -= span->released ? span->pages : 0;
}

static void map_ends(cm_span *span)
{
    cm_pagemap_set(span->page, span);
    cm_pagemap_set(span->page + span->pages - 1, span);
}

/* A free neighbour of span on the given side (-1 left, +1 right), of either state, or NULL. */
static cm_span *free_neighbour(cm_span *span, int side)
{
    uintptr_t page = side < 0 ? span->page - 1 : span->page + span->pages;
    cm_span *other = cm_pagemap_lookup((void *)(page << CM_PAGE_SHIFT));
    if (other == NULL || other->state != CM_SPAN_FREE)
        return NULL;
    bool touches = side < 0 ? other->page + other->pages == span->page
                            : span->page + span->pages == other->page;
    return touches ? other : NULL;
}

/* Takes other, span's free neighbour on side, off its list and into span (whose ends the caller
 * maps). Caller holds heap_lock. */
static void absorb(cm_span *span, cm_span *other, int side)
{
    list_remove(other);
    /* The two facing end pages become inner pages of the merged span. */
    cm_pagemap_set(side < 0 ? other->page + other->pages - 1 : other->page, NULL);
    cm_pagemap_set(side < 0 ? span->page : span->page + span->pages - 1, NULL);
    if (side < 0)
        span->page = other->page;
    span->pages += other->pages;
    cm_span_delete(other);
}

/* Merges span with its free neighbours of the same state and puts it on its list. Caller
 * holds heap_lock. */
static void insert_coalesced(cm_span *span)
{
    span->state = CM_SPAN_FREE;
    for (int side = -1; side <= 1; side += 2) {
        cm_span *other = free_neighbour(span, side);
        if (other != NULL && other->released == span->released)
            absorb(span, other, side);
    }
    map_ends(span);
    list_insert(span);
}

/* Pages of free spans, of either state, in the unbroken run that span lies in. */
static size_t free_run_pages(cm_span *span)
{
    size_t pages = span->pages;
    for (int side = -1; side <= 1; side += 2)
        for (cm_span *s = free_neighbour(span, side); s != NULL; s = free_neighbour(s, side))
            pages += s->pages;
    return pages;
}

/* Span merged with every free span around it, of either state, and back on its list: for a
 * request no single span fits. Resident when any part is (the pages the program wrote are).
 * Caller holds heap_lock. */
static cm_span *merge_run_locked(cm_span *span)
{
    list_remove(span);
    for (int side = -1; side <= 1; side += 2) {
        for (cm_span *other; (other = free_neighbour(span, side)) != NULL;) {
            span->released &= other->released;
            absorb(span, other, side);
        }
    }
    map_ends(span);
    list_insert(span);
    return span;
}

/* A span of at least pages made by merging a released free span with the resident ones around
 * it (every such run holds a released span, and the heap has few: chunks' untouched rests and
 * spans given back by age), or NULL where no run of free spans holds that many. Caller holds
 * heap_lock. */
static cm_span *find_across_locked(size_t pages)
{
    for (size_t n = 1; n <= CM_HEAP_LISTS + 1; n++)
        for (cm_span *s = *set_list(&free_sets[1], n); s != NULL; s = s->next)
            if (free_run_pages(s) >= pages)
                return merge_run_locked(s);
    return NULL;
}

/* Gives back resident free spans idle at least min_idle_ms, largest first, until at least
 * most pages are released or none is left; returns the pages released. Caller holds heap_lock. */
static size_t release_free_locked(uint64_t now, uint64_t min_idle_ms, size_t most)
{
    CM_ASSERT(cm_lock_is_mine(&heap_lock));
    size_t released = 0;
    for (size_t n = CM_HEAP_LISTS + 1; n >= 1 && released < most; n--) {
        for (cm_span *s = *set_list(&free_sets[0], n), *next; s && released < most; s = next) {
            next = s->next; /* s moves to the released set, next stays on this list */
            if (now - s->free_since_ms < min_idle_ms)
                continue;
            cm_os_release(cm_span_start(s), s->pages << CM_PAGE_SHIFT);
            released += s->pages;
            list_remove(s);
            s->released = 1;
            insert_coalesced(s);
        }
    }
    return released;
}

/* Release by age: every free span idle at least min_idle_ms. */
static size_t release_idle_locked(uint64_t now, uint64_t min_idle_ms)
{
    last_release_scan_ms = now;
    return release_free_locked(now, min_idle_ms, SIZE_MAX);
}

static void maybe_release_locked(void)
{
    int64_t delay = cm_option.release_delay_ms;
    if (delay < 0 || free_pages == released_pages)
        return;
    uint64_t now = cm_os_now_ms();
    if (now - last_release_scan_ms >= (uint64_t)delay / 2)
        release_idle_locked(now, (uint64_t)delay);
}

/* Maps a fresh chunk of at least pages and adds it as a free span. Caller holds heap_lock.
 * The heap grows although it may hold resident free spans (too small or too scattered for the
 * request): as many of those pages are given back first, so that growing does not add to the
 * resident set what sits unused (a program moving from one phase to the next, from small
 * objects to large ones, would otherwise keep both phases' memory resident for a whole
 * release delay). */
static bool grow_locked(size_t pages)
{
    CM_ASSERT(cm_lock_is_mine(&heap_lock));
    size_t chunk = pages > GROW_MIN_PAGES ? pages : GROW_MIN_PAGES;
    char *memory = cm_os_map(chunk << CM_PAGE_SHIFT);
    if (memory == NULL)
        return false;
    if (cm_option.release_delay_ms >= 0 && free_pages > released_pages)
        release_free_locked(cm_os_now_ms(), 0, chunk);
    cm_span *span = cm_span_new();
    if (span == NULL || !cm_pagemap_ensure((uintptr_t)memory >> CM_PAGE_SHIFT, chunk)) {
        if (span)
            cm_span_delete(span);
        cm_os_unmap(memory, chunk << CM_PAGE_SHIFT);
        return false;
    }
    span->page = (uintptr_t)memory >> CM_PAGE_SHIFT;
    span->pages = chunk;
    span->released = 1; /* never touched: not resident */
    span->free_since_ms = cm_os_now_ms();
    insert_coalesced(span);
    return true;
}

/* The smallest exact list of set with a span of at least pages, or 0 when none has one. */
static size_t exact_fit(const free_set *set, size_t pages)
{
    /* The first bit set from pages on. */
    for (size_t word = pages / 64;
         pages <= CM_HEAP_LISTS && word < sizeof set->nonempty / sizeof set->nonempty[0];
         word++) {
        uint64_t bits = set->nonempty[word] &
                        (word == pages / 64 ? ~(uint64_t)0 << (pages % 64) : ~(uint64_t)0);
        if (bits)
            return word * 64 + (size_t)__builtin_ctzll(bits);
    }
    return 0;
}

/* The smallest span of set's large list with at least pages (the lowest on a tie), or NULL. */
static cm_span *large_fit(const free_set *set, size_t pages)
{
    cm_span *best = NULL;
    for (cm_span *s = set->large; s; s = s->next)
        if (s->pages >= pages && (best == NULL || s->pages < best->pages ||
                                  (s->pages == best->pages && s->page < best->page)))
            best = s;
    return best;
}

/* A free span of at least pages, or NULL. Up to CM_HEAP_LISTS pages, free spans are holes
 * between live ones, and the smallest that fits is taken whatever its state (resident on a
 * tie): a hole cut for less keeps the others whole for the requests they fit (the order
 * book's 1 MiB buffer, freed and asked for again, finds its 128 pages; taking resident holes
 * first cost it a new chunk and 1 MiB of peak RSS). Above, they are open runs: a request of up
 * to CM_HEAP_LISTS pages (a class's span, a block below 1 MiB) is cut from a resident one
 * first, where one cut is as good as another; a larger request takes the smallest run that
 * fits whatever its state (resident on a tie), which keeps the largest runs whole for the
 * requests only they fit (resident first for those too, a soak of blocks up to 9 MiB mapped
 * twice the address space). Figures and commands: docs/PERFORMANCE.md, "Peak RSS, measured
 * at de83e81". */
static cm_span *find_locked(size_t pages)
{
    CM_ASSERT(cm_lock_is_mine(&heap_lock));
    size_t resident = exact_fit(&free_sets[0], pages), released = exact_fit(&free_sets[1], pages);
    if (resident != 0 && (released == 0 || resident <= released))
        return free_sets[0].exact[resident];
    if (released != 0)
        return free_sets[1].exact[released];
    cm_span *resident_run = large_fit(&free_sets[0], pages);
    if (resident_run != NULL && pages <= CM_HEAP_LISTS)
        return resident_run;
    cm_span *released_run = large_fit(&free_sets[1], pages);
    bool smaller = released_run != NULL &&
                   (resident_run == NULL || released_run->pages < resident_run->pages);
    return smaller ? released_run : resident_run;
}

/* Cuts span to [span->page + offset, + pages), returning the pieces around it to the lists. */
static bool trim_locked(cm_span *span, size_t offset, size_t pages)
{
    CM_ASSERT(cm_lock_is_mine(&heap_lock) && offset + pages <= span->pages);
    size_t tail = span->pages - offset - pages;
    cm_span *before = offset ? cm_span_new() : NULL, *after = tail ? cm_span_new() : NULL;
    if ((offset && before == NULL) || (tail && after == NULL)) {
        if (before)
            cm_span_delete(before);
        if (after)
            cm_span_delete(after);
        return false;
    }
    if (before) {
        *before = (cm_span){.page = span->page,
                            .pages = offset,
                            .released = span->released,
                            .free_since_ms = span->free_since_ms,
                            .state = CM_SPAN_FREE};
        map_ends(before);
        list_insert(before);
    }
    if (after) {
        *after = (cm_span){.page = span->page + offset + pages,
                           .pages = tail,
                           .released = span->released,
                           .free_since_ms = span->free_since_ms,
                           .state = CM_SPAN_FREE};
        map_ends(after);
        list_insert(after);
    }
    span->page += offset;
    span->pages = pages;
    return true;
}

/* cm_page_heap_alloc with room: the span is cut from the start of a free span with at least
 * room more pages where the heap has one (it is not grown for them); else as without room. */
static cm_span *allocate(size_t pages, size_t align_pages, unsigned size_class, size_t room)
{
    size_t want = pages + align_pages - 1;
    cm_lock_acquire(&heap_lock);
    cm_span *span = room ? find_locked(want + room) : NULL;
    if (span == NULL && room)
        span = find_across_locked(want + room);
    if (span == NULL)
        span = find_locked(want);
    if (span == NULL)
        span = find_across_locked(want);
    if (span == NULL && grow_locked(want))
        span = find_locked(want);
    if (span != NULL) {
        list_remove(span);
        size_t offset = (align_pages - (span->page & (align_pages - 1))) & (align_pages - 1);
        if (!trim_locked(span, offset, pages)) {
            list_insert(span);
            span = NULL;
        }
    }
    if (span != NULL) {
        /* A SMALL span keeps it: its carving faults its pages in (central_cache.c) */
        span->released = size_class != 0 && span->released;
        span->size_class = (uint8_t)size_class;
        if (size_class != 0) {
            span->state = CM_SPAN_SMALL;
            cm_pagemap_set_range(span->page, pages, span);
        } else {
            span->state = CM_SPAN_LARGE;
            map_ends(span);
            large_pages += pages;
            large_count++;
        }
    }
    maybe_release_locked();
    cm_lock_release(&heap_lock);
    return span;
}

/* A span of pages pages whose first page is a multiple of align_pages (a power of two), or
 * NULL when memory is exhausted. size_class 0 makes a LARGE span (first and last pages mapped);
 * otherwise a SMALL span of that class, every page mapped, so objects anywhere in it resolve. */
cm_span *cm_page_heap_alloc(size_t pages, size_t align_pages, unsigned size_class)
{
    return allocate(pages, align_pages, size_class, 0);
}

/* A LARGE span of pages pages followed, where the heap has them, by at least room free pages:
 * for a block realloc moved, so that the next realloc can grow it in place (resize below). */
cm_span *cm_page_heap_alloc_with_room(size_t pages, size_t room)
{
    return allocate(pages, 1, 0, room);
}

/* Resizes a LARGE span where it lies, for realloc: shrinking gives the tail back; growing
 * takes pages from a free right neighbour. False (span unchanged) when that neighbour is not
 * free or too small. */
bool cm_page_heap_resize(cm_span *span, size_t pages)
{
    bool done = true;
    cm_lock_acquire(&heap_lock);
    if (pages < span->pages) {
        cm_span *tail = cm_span_new();
        if (tail == NULL) {
            done = false;
        } else {
            *tail = (cm_span){.page = span->page + pages,
                              .pages = span->pages - pages,
                              .free_since_ms = cm_os_now_ms()};
            large_pages -= tail->pages;
            span->pages = pages;
            map_ends(span);
            map_ends(tail);
            insert_coalesced(tail);
        }
    } else if (pages > span->pages) {
        size_t need = pages - span->pages;
        cm_span *right = free_neighbour(span, 1);
        if (right != NULL && right->pages < need && free_run_pages(right) >= need)
            right = merge_run_locked(right); /* resident and released pages side by side */
        if (right == NULL || right->pages < need) {
            done = false;
        } else if (list_remove(right), !trim_locked(right, 0, need)) { /* rest stays free */
            list_insert(right);
            done = false;
        } else {
            if (span->pages > 1)
                cm_pagemap_set(span->page + span->pages - 1, NULL); /* becomes an inner page */
            cm_pagemap_set(right->page, NULL);
            cm_pagemap_set(right->page + right->pages - 1, NULL);
            cm_span_delete(right);
            span->pages = pages;
            map_ends(span);
            large_pages += need;
        }
    }
    cm_lock_release(&heap_lock);
    return done;
}

/* Records a MAPPED span's first page in the pagemap. Under heap_lock because coalescing reads
 * the entries next to free spans, which may be a mapping's. */
void cm_page_heap_set_mapped(cm_span *span)
{
    cm_lock_acquire(&heap_lock);
    cm_pagemap_set(span->page, span);
    cm_lock_release(&heap_lock);
}

/* Forgets a MAPPED span, its pagemap entry and its struct, in one hold of the heap lock and
 * before its mapping goes: a free that fork's prepare handler catches waiting for the lock has
 * changed nothing yet, so the block is still whole in the child (thread_cache.c's free says
 * why that matters). */
void cm_page_heap_forget_mapped(cm_span *span)
{
    cm_lock_acquire(&heap_lock);
    cm_pagemap_set(span->page, NULL);
    cm_span_delete(span);
    cm_lock_release(&heap_lock);
}

/* Takes back a LARGE span, or a SMALL span whose objects are all free; released says the
 * caller has already given its pages to the OS. */
static void take_back(cm_span *span, uint8_t released)
{
    cm_lock_acquire(&heap_lock);
    if (span->state == CM_SPAN_SMALL) {
        if (span->pages > 2)
            cm_pagemap_set_range(span->page + 1, span->pages - 2, NULL);
        span->size_class = 0;
    } else {
        large_pages -= span->pages;
        large_count--;
    }
    span->released = released;
    span->free_since_ms = cm_os_now_ms();
    insert_coalesced(span);
    maybe_release_locked();
    cm_lock_release(&heap_lock);
}

void cm_page_heap_free(cm_span *span)
{
    take_back(span, 0);
}

/* A LARGE span whose memory leaves the process now rather than by age: pools and arenas on
 * destroy (the madvise happens outside heap_lock). */
void cm_page_heap_free_released(cm_span *span)
{
    cm_os_release(cm_span_start(span), span->pages << CM_PAGE_SHIFT);
    take_back(span, 1);
}

/* Gives idle free spans back to the OS (all of them when everything). Returns bytes. */
size_t cm_page_heap_release(bool everything)
{
    cm_lock_acquire(&heap_lock);
    int64_t delay = cm_option.release_delay_ms;
    size_t pages =
        release_idle_locked(cm_os_now_ms(), everything || delay < 0 ? 0 : (uint64_t)delay);
    size_t bytes = pages << CM_PAGE_SHIFT;
    if (everything)
        bytes += cm_pagemap_release_unused();
    cm_lock_release(&heap_lock);
    return bytes;
}

/* Unmaps every free span: the last resort when the OS refuses memory (address space limits
 * count pages that are released but still mapped). Returns bytes unmapped. */
size_t cm_page_heap_unmap_free(void)
{
    size_t pages = 0;
    cm_lock_acquire(&heap_lock);
    for (int state = 0; state < 2; state++) {
        for (size_t n = 1; n <= CM_HEAP_LISTS + 1; n++) {
            for (cm_span *span, **head = set_list(&free_sets[state], n); (span = *head);) {
                list_remove(span);
                cm_pagemap_set(span->page, NULL);
                cm_pagemap_set(span->page + span->pages - 1, NULL);
                cm_os_unmap(cm_span_start(span), span->pages << CM_PAGE_SHIFT);
                pages += span->pages;
                cm_span_delete(span);
            }
        }
    }
    cm_lock_release(&heap_lock);
    return pages << CM_PAGE_SHIFT;
}

void cm_page_heap_counters(size_t *free_bytes, size_t *released_bytes, size_t *large_bytes,
                           size_t *large_spans)
{
    cm_lock_acquire(&heap_lock);
    *free_bytes = (free_pages - released_pages) << CM_PAGE_SHIFT;
    *released_bytes = released_pages << CM_PAGE_SHIFT;
    *large_bytes = large_pages << CM_PAGE_SHIFT;
    *large_spans = large_count;
    cm_lock_release(&heap_lock);
}

/* Checks the invariants in the header comment. */
bool cm_page_heap_valid(void)
{
    bool ok = true;
    size_t pages = 0, released = 0;
    cm_lock_acquire(&heap_lock);
    for (int state = 0; state < 2; state++) {
        free_set *set = &free_sets[state];
        for (size_t n = 1; n <= CM_HEAP_LISTS + 1; n++) {
            for (cm_span *s = *set_list(set, n); s; s = s->next) {
                ok &= s->state == CM_SPAN_FREE && s->released == state &&
                      list_for(s) == set_list(set, n);
                ok &= cm_pagemap_lookup(cm_span_start(s)) == s;
                ok &= cm_pagemap_lookup((char *)cm_span_start(s) +
                                        ((s->pages - 1) << CM_PAGE_SHIFT)) == s;
                for (int side = -1; side <= 1; side += 2) {
                    cm_span *other = free_neighbour(s, side);
                    ok &= other == NULL || other->released != s->released;
                }
                pages += s->pages;
                released += s->released ? s->pages : 0;
            }
        }
        for (size_t n = 1; n <= CM_HEAP_LISTS; n++)
            ok &= (set->exact[n] != NULL) == ((set->nonempty[n / 64] >> (n % 64)) & 1);
    }
    ok &= pages == free_pages && released == released_pages;
    cm_lock_release(&heap_lock);
    return ok;
}

/* The span struct lock is taken alone or inside the heap lock: prepare takes it second and
 * the parent and child release it first. */
void cm_page_heap_fork(int phase)
{
    if (phase == CM_FORK_PREPARE) {
        cm_lock_fork(&heap_lock, phase);
        cm_lock_fork(&span_struct_lock, phase);
    } else {
        cm_lock_fork(&span_struct_lock, phase);
        cm_lock_fork(&heap_lock, phase);
    }
}
