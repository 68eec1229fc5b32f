/* central_cache.c - the middle end: one central cache per size class, shared by all threads.
 *
 *   transfer cache   an array of whole batches (NULL-terminated lists of exactly `batch`
 *                    objects). A thread's flush of a full batch and another thread's fill are
 *                    a pointer store and a pointer load under the lock: producer/consumer
 *                    traffic never touches spans. Its limit starts at the class's
 *                    transfer_capacity and doubles on overflow while other threads take the
 *                    batches (each remembers its flusher), up to limit_when_shared(); each
 *                    decay tick with no such take halves it back (policy.h says why). A fill
 *                    takes the newest batch no other live owner's spans hold, and another's
 *                    only when no span has room for it (batch_for).
 *   spans            the class's SMALL spans that have room (returned objects or never-used
 *                    space at the bump pointer), doubly linked; full spans are on no list, nor
 *                    a full span that runs came back to until a 1/CM_SPAN_WAKE_DIVISOR of it
 *                    is free (cm_central_take_runs). A span with room whose owner (the
 *                    pagemap's slot) lives is on that owner's list instead of the shared one,
 *                    and only its fills take from it, but for one behind the list's head that
 *                    another fill borrows before it carves (borrow_from_another); the owner's
 *                    exit, or its leaving the class idle, shares them. A fill takes a span as
 *                    its own only when it asks for CM_CLAIM_FILL objects or more.
 *
 * Spans handed back whole: a span whose every object comes back in its owner's mailbox take
 * becomes the owner's fresh run (or one of its spares) again, its objects still counted out,
 * without the page heap; by itself a whole run needs no lock (see the section of that name).
 * Callers: thread_cache.c (fill on a miss, as a list or with a fresh run of never-used objects
 * first, flush on overflow or thread exit, one object at a time for a thread whose cache is
 * gone, the runs of a mailbox, a span's local list), alloc.c (drain before a retry when the OS
 * refuses memory) and background.c (the decay tick).
 * Release by age: batches that sat in a transfer cache through a whole interval of
 * CMALLOC_RELEASE_DELAY_MS (below the interval's low-water mark) go back to their spans, so
 * that spans can empty and the page heap can return them; checked on fills and flushes.
 * Lock: each class's own; the page heap lock is taken inside it to get or return spans, and
 * carving in a span cut from released pages makes one system call under it (populate_carved:
 * the page faults it saves were taken under it too).
 * Invariant per class:
 *   objects_out == sum of span->used over its spans
 *              == objects in thread caches + in the transfer cache + held by the program.
 */
#include "internal.h"

#include <stdatomic.h>
#include <string.h>

typedef struct central {
    cm_lock lock;
    unsigned transfer_count;     /* batches in transfer[class] */
    unsigned transfer_limit;     /* batches it may hold now (0: not set yet, the class's start) */
    unsigned transfer_low_water; /* fewest batches held since the last decay tick */
    unsigned shared_takes;       /* fills since the last tick that took another thread's batch */
    cm_span *spans;              /* spans with room */
    size_t objects_out;
    unsigned owned_behind;  /* spans on owners' lists behind the first (borrow_from_another) */
    unsigned borrow_cursor; /* the slot its next search for one starts after */
} __attribute__((aligned(CM_CACHE_LINE))) central;

static central centrals[CM_CLASSES_MAX] = {[0 ... CM_CLASSES_MAX - 1] = {.lock = CM_LOCK_INIT}};
/* Each live owner's spans with room, per class, under the class's lock: only that owner's fills
 * take from them, so a thread's objects share pages with no other live thread's (larson_bench
 * at 2 threads: 83% of the windows' pages held both lanes' blocks when any fill could take any
 * span). A slot's lists go to the shared ones when its cache is abandoned. */
static cm_span *owned_spans[CM_REMOTE_SLOTS][CM_CLASSES_MAX];
enum { OWNER_NONE, OWNER_LIVE, OWNER_PARKED }; /* a slot's owner: none, a live cache, or one
                                                 parked for a successor (thread_cache.c) */
static _Atomic uint8_t slot_owner[CM_REMOTE_SLOTS]; /* its spans go on its lists unless NONE */
static _Atomic unsigned highest_owner; /* the highest slot that ever listed a span: where
                                          borrow_from_another's search stops */
/* The transfer caches' slots, apart from the locks and counters so that those stay on a few
 * pages (a fork's lock handover writes every class's lock: each page touched is copied). */
static void *transfer[CM_CLASSES_MAX][CM_TRANSFER_SLOTS];               /* full batches */
static const void *transfer_flusher[CM_CLASSES_MAX][CM_TRANSFER_SLOTS]; /* who flushed each */
static _Atomic uint64_t next_decay_ms;
static CM_THREAD_LOCAL char thread_tag; /* its address tells the calling thread apart */

static unsigned limit_at_start(unsigned size_class)
{
    return cm_classes[size_class].transfer_capacity;
}

/* The most batches the class's transfer cache may grow to while batches are shared. */
static unsigned limit_when_shared(unsigned size_class)
{
    const cm_class_info *info = &cm_classes[size_class];
    size_t batches = CM_TRANSFER_SHARED_BYTES / ((size_t)info->batch * info->size);
    unsigned start = limit_at_start(size_class);
    return batches < start               ? start
           : batches > CM_TRANSFER_SLOTS ? CM_TRANSFER_SLOTS
                                         : (unsigned)batches;
}

/* Takes the count batches from index at off the class's transfer cache, with their flushers. */
static void transfer_remove_locked(central *c, unsigned size_class, unsigned at, unsigned count)
{
    unsigned after = c->transfer_count - at - count;
    memmove(transfer[size_class] + at, transfer[size_class] + at + count,
            after * sizeof transfer[0][0]);
    memmove(transfer_flusher[size_class] + at, transfer_flusher[size_class] + at + count,
            after * sizeof transfer_flusher[0][0]);
    c->transfer_count -= count;
}

static unsigned transfer_limit(central *c, unsigned size_class)
{
    if (c->transfer_limit == 0)
        c->transfer_limit = limit_at_start(size_class);
    return c->transfer_limit;
}

/* Whether slot has a live (or parked) owner, whose spans are its own. */
static bool owner_lives(unsigned slot)
{
    return slot != 0 && atomic_load_explicit(&slot_owner[slot], memory_order_relaxed) != OWNER_NONE;
}

/* The list span goes on: its owner's while the owner lives, else the class's. */
static cm_span **list_for(central *c, cm_span *span, unsigned *owner)
{
    *owner = cm_pagemap_owner(cm_span_start(span));
    if (owner_lives(*owner))
        return &owned_spans[*owner][span->size_class];
    *owner = 0;
    return &c->spans;
}

static cm_span **list_holding(central *c, const cm_span *span)
{
    if (span->listed_owner != 0)
        return &owned_spans[span->listed_owner][span->size_class];
    return &c->spans;
}

static void span_list_push(central *c, cm_span **head, cm_span *span, unsigned owner)
{
    if (owner != 0) {
        c->owned_behind += *head != NULL;
        unsigned highest = atomic_load_explicit(&highest_owner, memory_order_relaxed);
        while (owner > highest && !atomic_compare_exchange_weak(&highest_owner, &highest, owner))
            ;
    }
    span->prev = NULL;
    span->next = *head;
    if (*head)
        (*head)->prev = span;
    *head = span;
    span->listed = 1;
    span->listed_owner = (uint16_t)owner;
}

static void span_list_add(central *c, cm_span *span)
{
    unsigned owner;
    cm_span **head = list_for(c, span, &owner);
    span_list_push(c, head, span, owner);
}

static void span_list_remove(central *c, cm_span *span)
{
    if (span->listed_owner != 0)
        c->owned_behind -= span->prev != NULL || span->next != NULL;
    if (span->prev)
        span->prev->next = span->next;
    else
        *list_holding(c, span) = span->next;
    if (span->next)
        span->next->prev = span->prev;
    span->listed = 0;
}

/* span->used changes under the class's lock only, and its local list's holder reads it
 * without (thread_cache.c, "local lists"): stored whole. */
static void span_add_used(cm_span *span, int64_t delta)
{
    __atomic_store_n(&span->used, (uint32_t)((int64_t)span->used + delta), __ATOMIC_RELAXED);
}

/* A fresh span for the class, on the list, or NULL when memory is exhausted. */
static cm_span *span_new_locked(central *c, unsigned size_class)
{
    CM_ASSERT(cm_lock_is_mine(&c->lock));
    const cm_class_info *info = &cm_classes[size_class];
    cm_span *span = cm_page_heap_alloc(info->pages, 1, size_class);
    if (span == NULL)
        return NULL;
    span->bump = cm_span_start(span);
    span->limit = span->bump + (size_t)info->objects * info->size;
    span->free_objects = NULL;
    __atomic_store_n(&span->used, 0, __ATOMIC_RELAXED);
    CM_ASSERT(span->local_holder == NULL); /* held spans have objects out: never freed */
    span_list_add(c, span);
    return span;
}

/* After objects went back to span: it has room, so it is listed; with no object out it
 * returns to the page heap. */
static void span_settle_locked(central *c, cm_span *span)
{
    if (!span->listed)
        span_list_add(c, span);
    if (span->used == 0) {
        span_list_remove(c, span);
        cm_page_heap_free(span);
    }
}

/* Gives back every object of a NULL-terminated list to its span. Objects of one span tend to
 * come in runs (a batch allocated from one span, freed in order), so each run is spliced onto
 * its span's list whole: the span is looked up and settled once per run, and only the run's
 * last link is rewritten (objects on a list carry their links and the free mark already). */
static void span_push_list_locked(central *c, void *head)
{
    while (head != NULL) {
        cm_span *span = cm_pagemap_lookup(head);
        const uintptr_t start = (uintptr_t)cm_span_start(span);
        const uintptr_t bytes = span->pages << CM_PAGE_SHIFT;
        void *first = head, *last;
        uint32_t run = 0;
        do {
            CM_ASSERT(cm_lock_is_mine(&c->lock) && span != NULL && span->state == CM_SPAN_SMALL &&
                      &centrals[span->size_class] == c && cm_object_is_free(head));
            last = head;
            head = cm_link_next_checked(head);
            run++;
        } while (head != NULL && (uintptr_t)head - start < bytes);
        CM_ASSERT(span->used >= run);
        cm_link_relink(last, span->free_objects);
        span->free_objects = first;
        span_add_used(span, -(int64_t)run);
        c->objects_out -= run;
        span_settle_locked(c, span);
    }
}

/* Objects on span's list of given-back objects (the SMALL span invariant, types.h). */
static uint32_t span_free_count(const cm_span *span, const cm_class_info *info)
{
    return info->objects - span->used - (uint32_t)((size_t)(span->limit - span->bump) / info->size);
}

/* ---- spans handed back whole to their owner ------------------------------------------------
 * A span whose every object came back to its owner's mailbox, each carved before, becomes the
 * owner's empty fresh run again, from its start, or else one of its spares (the runs after:
 * thread_cache.c keeps up to cm_spare_most a class): its objects go out in address order with
 * no link written, as a fresh span's would, without the trip through the page heap and the
 * fill that would cut it again (producer/consumer returns a span whole to its owner every 128
 * objects of 64 bytes: `build/bench/xmalloc_bench --batch 4096 --size 64 --queue 100
 * --threads 1` took 611K spans from the page heap in its 1.2 s before). The span stays counted
 * out: its objects go from the mailbox to the run as they are (their links and marks stale; a
 * run hands each out with its mark cleared). A run that is a whole span by itself needs no
 * lock (take_whole_spans); one whose span came back whole over several runs is found under the
 * lock (span_rerun_locked). */

/* Whether an owner's take has room for a span handed back whole: an empty run, or room for a
 * spare. */
static bool rerun_room(unsigned size_class, const cm_fresh_run *fresh,
                       const cm_spare_spans *spares)
{
    return fresh != NULL &&
           (fresh->next == fresh->end || spares->count < cm_spare_most(size_class));
}

/* The span becomes owner's fresh run if that is empty, else the newest of its spares. */
static void rerun(cm_span *span, const cm_class_info *info, cm_fresh_run *fresh,
                  cm_spare_spans *spares, unsigned owner)
{
    char *start = cm_span_start(span);
    if (fresh->next == fresh->end) {
        cm_fresh_run_start(fresh, start, info->objects, info->size);
    } else {
        cm_link_set(start, spares->top);
        spares->top = start;
        spares->count++;
    }
    if (cm_pagemap_owner(start) != owner) /* another owner's fill took it (borrow_from_another) */
        cm_pagemap_set_owner(span, owner);
}

/* A span whose runs all came back (used 0), every object once carved, handed back whole. */
static void span_rerun_locked(central *c, cm_span *span, const cm_class_info *info,
                              cm_fresh_run *fresh, cm_spare_spans *spares, unsigned owner)
{
    CM_ASSERT(span->used == 0 && span->bump == span->limit &&
              rerun_room(span->size_class, fresh, spares));
    if (span->listed)
        span_list_remove(c, span);
    span->free_objects = NULL;
    span_add_used(span, info->objects);
    c->objects_out += info->objects;
    rerun(span, info, fresh, spares, owner);
}

/* Whether last, a run's last object by its header, is a free object of the span from start
 * (the run's head's): a header is free memory, which a stray write may have changed. */
static bool run_last_valid(const cm_class_info *info, uintptr_t start, const void *last)
{
    const uintptr_t offset = (uintptr_t)last - start;
    return offset < (uintptr_t)info->objects * info->size && offset % info->size == 0 &&
           cm_object_is_free(last);
}

/* The span of run (a run's head, a free object of the class: n objects, the last last) when
 * the run holds every object of it and the span is out whole (cm_span_out_whole): then no
 * other thread can reach it (its objects are all the caller's, no fill finds it) and it is the
 * caller's to hand out again, with no lock; else NULL. Checked as the loop under the lock
 * checks a run; a run that fails is left to it. */
static cm_span *whole_span_of(unsigned size_class, void *run, uint32_t n, const void *last)
{
    const cm_class_info *info = &cm_classes[size_class];
    if (n != info->objects)
        return NULL;
    cm_span *span = cm_span_of(run);
    if (!run_last_valid(info, (uintptr_t)cm_span_start(span), last) ||
        !cm_span_out_whole(span, info))
        return NULL;
    return span;
}

/* The leading runs of a mailbox take (count objects) that are whole spans by themselves
 * (whole_span_of) are handed back while the take has room for them (rerun_room), with no
 * lock. Returns the rest of the take, *count lowered. Consumers post runs that end with their
 * span (thread_cache.c, "outboxes"), so producer/consumer's takes are almost all whole spans. */
static void *take_whole_spans(unsigned size_class, void *run, uint32_t *count,
                              cm_fresh_run *fresh, cm_spare_spans *spares, unsigned owner)
{
    while (run != NULL && rerun_room(size_class, fresh, spares) &&
           cm_is_free_object_of(size_class, run)) {
        uint32_t n;
        void *last;
        void *next = cm_run_header(run, &n, &last);
        cm_span *span = n <= *count ? whole_span_of(size_class, run, n, last) : NULL;
        if (span == NULL)
            break;
        rerun(span, &cm_classes[size_class], fresh, spares, owner);
        *count -= n;
        run = next;
    }
    return run;
}

/* Gives back the runs an owner took from its mailbox (internal.h, "runs": count objects of
 * size_class in all), each spliced onto its span's list by its header, with no object walked:
 * only heads and last objects are touched. Spans whose every object came back are handed back
 * whole to owner, as *fresh and *spares have room (NULL: none; "spans handed back whole",
 * above); another goes to the page heap, to be cut again from its start (a fill then hands
 * its objects out in address order, as a fresh run or carved links, instead of a chain of
 * objects another core wrote last); a span that was full is listed again only once a
 * 1/CM_SPAN_WAKE_DIVISOR of it is free, so that the fills that follow cut never-used objects
 * instead of taking a few returned ones at a time while the rest of the span is still on its
 * way home. A header that does not add up is reported as list corruption. */
void cm_central_take_runs(unsigned size_class, void *run, uint32_t count, cm_fresh_run *fresh,
                          cm_spare_spans *spares, unsigned owner)
{
    central *c = &centrals[size_class];
    const cm_class_info *info = &cm_classes[size_class];
    const uint32_t wake = (info->objects + CM_SPAN_WAKE_DIVISOR - 1) / CM_SPAN_WAKE_DIVISOR;
    void *const mail = run;
    if ((run = take_whole_spans(size_class, run, &count, fresh, spares, owner)) == NULL) {
        if (count != 0)
            cm_report_corrupt_list(mail);
        return;
    }
    void *const first = run;
    cm_lock_acquire(&c->lock);
    while (run != NULL) {
        /* Nothing read through a pointer before it is known to be a free object of the class:
         * a header is free memory, which a stray write may have changed. */
        if (!cm_is_free_object_of(size_class, run))
            cm_report_corrupt_list(run);
        cm_span *span = cm_span_of(run);
        uintptr_t start = (uintptr_t)cm_span_start(span);
        uint32_t n;
        void *last, *next = cm_run_header(run, &n, &last);
        if (n == 0 || n > count || n > span->used || !run_last_valid(info, start, last))
            cm_report_corrupt_list(run);
        cm_link_relink(last, span->free_objects);
        span->free_objects = run;
        span_add_used(span, -(int64_t)n);
        c->objects_out -= n;
        count -= n;
        if (span->used == 0 && span->bump == span->limit && rerun_room(size_class, fresh, spares))
            span_rerun_locked(c, span, info, fresh, spares, owner);
        else if (span->used == 0 || (!span->listed && span_free_count(span, info) >= wake))
            span_settle_locked(c, span);
        run = next;
    }
    if (count != 0)
        cm_report_corrupt_list(first);
    cm_lock_release(&c->lock);
}

/* Takes back a whole span a thread cache kept for a later fresh run (take_whole_spans), none
 * of its objects handed out: it goes to the page heap. */
void cm_central_take_span(char *start)
{
    cm_span *span = cm_span_of(start);
    central *c = &centrals[span->size_class];
    const uint32_t objects = cm_classes[span->size_class].objects;
    cm_lock_acquire(&c->lock);
    CM_ASSERT(span->state == CM_SPAN_SMALL && start == cm_span_start(span) &&
              cm_span_out_whole(span, &cm_classes[span->size_class]));
    span_add_used(span, -(int64_t)objects);
    c->objects_out -= objects;
    span_settle_locked(c, span);
    cm_lock_release(&c->lock);
}

/* Gives back the local list of a span the caller holds (thread_cache.c, "local lists"), with
 * object first when it is not NULL: an object no list holds yet, marked free only here, under
 * the lock, as cm_central_give_back does. The holder lets go of the span; one whose every
 * object came back goes to the page heap. The caller takes the span off its queue after,
 * without reading it: the span may be another one by then, and a fork that catches this call
 * waiting for the lock leaves the list on the queue, where the child looks for it. */
void cm_central_take_local(cm_span *span, void *object)
{
    central *c = &centrals[span->size_class];
    cm_lock_acquire(&c->lock);
    CM_ASSERT(span->state == CM_SPAN_SMALL && span->local_count < span->used + (object == NULL));
    if (object != NULL) {
        cm_link_set(object, span->local_free);
        if (span->local_free == NULL)
            span->local_last = object;
        span->local_free = object;
        span->local_count++;
    }
    uint32_t count;
    span->free_objects = cm_span_local_detach(span, span->free_objects, &count);
    span_add_used(span, -(int64_t)count);
    c->objects_out -= count;
    span_settle_locked(c, span);
    cm_lock_release(&c->lock);
}

/* slot has an owner now: the spans its fills take are listed as its own. */
void cm_central_own(unsigned slot)
{
    atomic_store_explicit(&slot_owner[slot], OWNER_LIVE, memory_order_relaxed);
}

/* slot's owner exited, and the slot waits with its spans for a successor: they stay its own,
 * but any fill that would carve may take one behind the head of its lists (borrow_from_another). */
void cm_central_park(unsigned slot)
{
    atomic_store_explicit(&slot_owner[slot], OWNER_PARKED, memory_order_relaxed);
}

/* slot's spans of size_class with room go to the shared list: its owner left the class unused
 * for a release delay, so their free objects serve other threads' fills. */
void cm_central_share(unsigned slot, unsigned size_class)
{
    central *c = &centrals[size_class];
    cm_lock_acquire(&c->lock);
    while (owned_spans[slot][size_class] != NULL) {
        cm_span *span = owned_spans[slot][size_class];
        span_list_remove(c, span);
        span_list_push(c, &c->spans, span, 0);
    }
    cm_lock_release(&c->lock);
}

/* slot's owner is gone (its mailboxes already given back): its spans with room go to the shared
 * lists, and so do spans that get room later, until the slot has an owner again. */
void cm_central_disown(unsigned slot)
{
    atomic_store_explicit(&slot_owner[slot], OWNER_NONE, memory_order_relaxed);
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++)
        cm_central_share(slot, size_class);
}

/* How many never-used objects a fill carves at span's bump pointer to get want of them (fewer
 * when the span runs out), and then up to the next CM_FALSE_SHARING boundary (span_take_locked
 * says why). Counted before the carving, so that its loop only writes links: the loop that
 * tested both bounds at every object ran 17 instructions an object, this one 10 (callgrind,
 * `build/bench/pool_bench --count 524288 --size 24 --free-order fifo --rounds 3`, whose fills
 * carve every object of every round). */
static uint32_t carve_count(const cm_span *span, const cm_class_info *info, uint32_t want)
{
    const uintptr_t bump = (uintptr_t)span->bump, left = (uintptr_t)span->limit - bump;
    uintptr_t bytes = (uintptr_t)want * info->size;
    if (bytes > left)
        bytes = left;
    while (bytes < left && ((bump + bytes) & (CM_FALSE_SHARING - 1)) != 0)
        bytes += info->size;
    return (uint32_t)(bytes / info->size);
}

/* Carving writes the links of never-used objects, page after page of a span: where the page
 * heap cut the span from pages given back to the OS (span->released), those pages are faulted
 * in (os.c's cm_os_populate) instead of a fault each as the links land. Only the pages the
 * links write to, what the carving would fault in anyway: up to a page an object, every page
 * of the run holds a link and one call brings them all; above a page, each link's own page,
 * and never the pages between, which a program that uses the start of a large block leaves
 * untouched (a 64 KiB buffer of which it fills 1 KiB holds one page resident, not 16). */
static void populate_carved(const cm_span *span, const cm_class_info *info, uint32_t carve)
{
    const uintptr_t page = CM_SYSTEM_PAGE, link_bytes = 2 * sizeof(uintptr_t);
    uintptr_t bump = (uintptr_t)span->bump, touched = bump;
    if (info->size > page) { /* a link, 16-byte aligned, never crosses a page */
        for (uint32_t i = 0; i < carve; i++)
            cm_os_populate((void *)((bump + (uintptr_t)i * info->size) & ~(page - 1)), page);
        return;
    }
    if (bump != (uintptr_t)cm_span_start(span))
        touched = bump - info->size + link_bytes; /* the end of the last carved link */
    uintptr_t start = (touched + page - 1) & ~(page - 1);
    uintptr_t end = (bump + (uintptr_t)(carve - 1) * info->size + link_bytes + page - 1) &
                    ~(page - 1);
    if (end > start)
        cm_os_populate((void *)start, end - start);
}

/* Moves want objects of span onto *list (fewer when it runs out, a few more to end a pair of
 * cache lines); returns how many. Given-back objects come first, cut off the span's list as a
 * run: read but not rewritten, as they carry their links and marks already, and not even read
 * when the whole list fits into an empty *list; when both the list and the fill's ask are at
 * least a 1/CM_PREFETCH_DIVISOR of the span's objects, the span is fetched ahead first. Then
 * never-used objects are carved at the bump pointer, or, with an empty run, when nothing else
 * was taken and *list is empty, become *run with no link written (thread_cache.c, "fresh
 * runs"). */
static uint32_t span_take_locked(cm_span *span, const cm_class_info *info, uint32_t want,
                                 void **list, cm_fresh_run *run)
{
    uint32_t taken = 0;
    void *first = span->free_objects;
    const uint32_t many = info->objects / CM_PREFETCH_DIVISOR;
    const uint32_t free_count = first != NULL ? span_free_count(span, info) : 0;
    if (first != NULL && want >= many && free_count >= many)
        cm_span_prefetch_objects(span, info);
    if (first != NULL && *list == NULL && free_count <= want) {
        taken = free_count;
        span->free_objects = NULL;
        *list = first;
    } else if (first != NULL) {
        void *last = first, *rest = cm_link_next_checked(first);
        for (taken = 1; taken < want && rest != NULL; taken++) {
            last = rest;
            rest = cm_link_next_checked(rest);
        }
        span->free_objects = rest;
        cm_link_relink(last, *list);
        *list = first;
    }
    /* Carving stops only at a boundary of CM_FALSE_SHARING bytes (or the span's end): objects
     * sharing a line, or the pair of lines the L2 prefetcher fetches together, go to one
     * thread, so threads writing their own objects never contend for the same lines. A
     * thread's first fills take one object, then two...: without this, two threads starting
     * together carved neighbours in turn and kept contending for as long as they kept those
     * objects (alloc-window-powerlaw at 2 threads ran at half speed in about half the runs;
     * `alloc_bench --mode=window ... --sharing` counts such neighbours, README "Benchmarks").
     * At most 7 more objects (16-byte objects, 128 bytes). */
    uint32_t carve = carve_count(span, info, taken < want ? want - taken : 0);
    if (span->released && carve > 0)
        populate_carved(span, info, carve);
    if (run != NULL && run->next == run->end && taken == 0 && *list == NULL)
        cm_fresh_run_start(run, span->bump, carve, info->size);
    else
        *list = cm_link_carved(span->bump, info->size, carve, *list);
    /* atomic: a local list's taker reads it without the lock (cm_span_prefetch_objects) */
    __atomic_store_n(&span->bump, span->bump + (size_t)carve * info->size, __ATOMIC_RELAXED);
    taken += carve;
    span_add_used(span, taken);
    return taken;
}

/* Whether the owner of slot, whose list of the class starts at head, can lend the span behind
 * head: a parked slot (its thread gone) any, a live owner only once it holds CM_LENDER_KEEPS
 * more. The head, the span the owner fills from, is never taken. */
static bool lends_one(unsigned slot, const cm_span *head)
{
    const cm_span *behind = head->next;
    for (unsigned kept = 0; kept < CM_LENDER_KEEPS && behind != NULL; kept++)
        behind = behind->next;
    return head->next != NULL &&
           (behind != NULL ||
            atomic_load_explicit(&slot_owner[slot], memory_order_relaxed) == OWNER_PARKED);
}

/* A span with room that another owner can lend, for a fill that would otherwise carve a fresh
 * span (NULL: none): of the first CM_BORROW_SCAN behind its list's head, the one with the most
 * room, so that the fewest of that owner's blocks come to share pages with the filler's. Those
 * spans behind the heads were where the owner build's memory went (policy.h, CM_BORROW_SCAN). */
static cm_span *borrow_from_another(central *c, unsigned size_class, unsigned owner)
{
    const unsigned slots = atomic_load_explicit(&highest_owner, memory_order_relaxed);
    for (unsigned n = 0; n < slots && c->owned_behind > 0; n++) {
        unsigned slot = c->borrow_cursor = c->borrow_cursor % slots + 1;
        cm_span *head = owned_spans[slot][size_class];
        if (slot == owner || head == NULL || !lends_one(slot, head))
            continue;
        cm_span *best = head->next;
        unsigned looked = 1;
        for (cm_span *span = best->next; span != NULL && looked < CM_BORROW_SCAN;
             span = span->next, looked++)
            if (span->used < best->used)
                best = span;
        return best;
    }
    return NULL;
}

/* The span a fill by owner takes from: one of its own with room, else one of the shared list,
 * else (a fill that claims what it takes) one borrowed from another owner, else a fresh
 * one; NULL when memory is exhausted. */
static cm_span *own_span(central *c, unsigned size_class, unsigned owner, bool claims)
{
    if (owner != 0 && owned_spans[owner][size_class] != NULL)
        return owned_spans[owner][size_class];
    cm_span *borrowed;
    if (c->spans == NULL && claims && (borrowed = borrow_from_another(c, size_class, owner)))
        return borrowed;
    return c->spans ? c->spans : span_new_locked(c, size_class);
}

/* The transfer cache's batch a fill by owner takes (its index; -1: none, fill from the spans):
 * the newest of the CM_TRANSFER_OWN_SCAN newest that no other live owner's spans hold (with no
 * owner, the newest), so that what a thread gave back in whole batches comes back to it,
 * not to a thread beside it whose blocks would then share pages with its own, and whose frees
 * of them would be remote. With none of its own, a fill takes another's batch only when no
 * span has room: a fresh span would leave that batch waiting (the order-book replay at 2
 * threads, one book each, ran 30.6M messages/s with any batch taken, 39.0M without). */
static int batch_for(central *c, unsigned size_class, unsigned owner)
{
    int newest = (int)c->transfer_count - 1;
    if (owner != 0)
        for (int i = newest; i >= 0 && i > newest - CM_TRANSFER_OWN_SCAN; i--) {
            unsigned holder = cm_pagemap_owner(transfer[size_class][i]);
            if (holder == owner || !owner_lives(holder))
                return i;
        }
    return owner != 0 && (owned_spans[owner][size_class] != NULL || c->spans != NULL) ? -1 : newest;
}

/* Takes about count objects as a NULL-terminated list in *head; returns how many. When the
 * transfer cache holds a batch, returns that whole batch; objects carved from a span's
 * never-used space run to the end of a pair of cache lines: either may exceed count. From
 * spans, at most one span's given-back objects per fill, so fewer than count when they run
 * out: taking a second span's list means walking it to its end, each link an object another
 * thread freed last and so a cache miss, under the lock (rpmalloc_bench at 1 and 2 threads ran
 * 14-17% faster without that walk). Returns 0 only when memory is exhausted. owner: the
 * filling cache's slot (remote.c; 0: none): its own spans are filled
 * from first, and a fill of CM_CLAIM_FILL objects or more takes the shared or fresh spans it
 * fills from as its own, their frees routed to it from now on; smaller fills (a list in its
 * slow start, and every fill of the classes above 8 KiB) leave them shared. */
static unsigned fill(unsigned size_class, unsigned count, void **head, unsigned owner,
                     cm_fresh_run *run)
{
    central *c = &centrals[size_class];
    unsigned n = 0;
    void *list = NULL;
    cm_lock_acquire(&c->lock);
    int batch = batch_for(c, size_class, owner);
    if (batch >= 0) {
        *head = transfer[size_class][batch];
        c->shared_takes += transfer_flusher[size_class][batch] != &thread_tag;
        transfer_remove_locked(c, size_class, (unsigned)batch, 1);
        if (c->transfer_count < c->transfer_low_water)
            c->transfer_low_water = c->transfer_count;
        cm_lock_release(&c->lock);
        return cm_classes[size_class].batch;
    }
    const bool claims = owner != 0 && count >= CM_CLAIM_FILL; /* else shared spans stay shared */
    while (n < count) {
        cm_span *span = own_span(c, size_class, owner, claims);
        if (span == NULL)
            break;
        bool given_back = span->free_objects != NULL;
        n += span_take_locked(span, &cm_classes[size_class], count - n, &list, run);
        if (claims && span->listed_owner != owner) { /* a shared span: the filler's from now on */
            span_list_remove(c, span);
            cm_pagemap_set_owner(span, owner);
            span_list_add(c, span);
        }
        if (span->free_objects == NULL && span->bump >= span->limit)
            span_list_remove(c, span);
        if (given_back || (run != NULL && 2 * (size_t)(run->end - run->next) >=
                                                   (size_t)count * cm_classes[size_class].size))
            break; /* a run of half the ask or more is enough: the rest would be carved */
    }
    c->objects_out += n;
    cm_lock_release(&c->lock);
    *head = list;
    return n;
}

unsigned cm_central_fill(unsigned size_class, unsigned count, void **head, unsigned owner)
{
    return fill(size_class, count, head, owner, NULL);
}

/* cm_central_fill for a thread cache with an empty run: what the fill would carve from its
 * first span, when it takes nothing else before, becomes *run instead (its objects counted
 * out, as carved ones, and in the count returned); the other spans' objects come as a list. */
unsigned cm_central_fill_fresh(unsigned size_class, unsigned count, void **head, unsigned owner,
                               cm_fresh_run *run)
{
    CM_ASSERT(run->next == run->end);
    return fill(size_class, count, head, owner, run);
}

/* Takes back count objects linked from head (NULL-terminated). A full transfer cache doubles
 * its limit when other threads have been taking its batches since the last tick. */
void cm_central_flush(unsigned size_class, void *head, unsigned count)
{
    central *c = &centrals[size_class];
    cm_lock_acquire(&c->lock);
    if (count == cm_classes[size_class].batch) {
        unsigned limit = transfer_limit(c, size_class);
        if (c->transfer_count == limit && c->shared_takes > 0) {
            unsigned most = limit_when_shared(size_class);
            c->transfer_limit = limit = 2 * limit < most ? 2 * limit : most;
        }
        if (c->transfer_count < limit) {
            transfer_flusher[size_class][c->transfer_count] = &thread_tag;
            transfer[size_class][c->transfer_count++] = head;
            cm_lock_release(&c->lock);
            return;
        }
    }
    span_push_list_locked(c, head);
    cm_lock_release(&c->lock);
}

/* Takes back one object that carries no free mark yet, marking it under the lock: a free
 * that a fork's prepare handler catches waiting here leaves its object allocated in the child
 * (thread_cache.c's free says why). */
void cm_central_give_back(unsigned size_class, void *object)
{
    central *c = &centrals[size_class];
    cm_lock_acquire(&c->lock);
    cm_link_set(object, NULL);
    span_push_list_locked(c, object);
    cm_lock_release(&c->lock);
}

/* Gives back to their spans the batches no thread took during the last interval (those
 * below the low-water mark, at the bottom of the stack). */
static void decay_transfer_caches(void)
{
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++) {
        central *c = &centrals[size_class];
        cm_lock_acquire(&c->lock);
        unsigned idle =
            c->transfer_low_water < c->transfer_count ? c->transfer_low_water : c->transfer_count;
        for (unsigned i = 0; i < idle; i++)
            span_push_list_locked(c, transfer[size_class][i]);
        transfer_remove_locked(c, size_class, 0, idle);
        c->transfer_low_water = c->transfer_count;
        /* no batch changed threads in the interval: the limit halves back toward the start */
        unsigned start = limit_at_start(size_class);
        if (c->shared_takes == 0 && c->transfer_limit > start)
            c->transfer_limit = c->transfer_limit / 2 > start ? c->transfer_limit / 2 : start;
        c->shared_takes = 0;
        cm_lock_release(&c->lock);
    }
}

/* Runs the decay at most once per interval; cheap when not due. now: cm_os_now_ms(), read
 * once by the caller (the allocation miss also times the thread cache's idle lists with it). */
void cm_central_tick(uint64_t now)
{
    if (cm_option.release_delay_ms < 0)
        return;
    uint64_t due = atomic_load_explicit(&next_decay_ms, memory_order_relaxed);
    if (now < due ||
        !atomic_compare_exchange_strong(&next_decay_ms, &due, now + cm_release_interval_ms()))
        return;
    decay_transfer_caches();
}

/* Empties every transfer cache into the spans, so that wholly free spans reach the page heap. */
void cm_central_drain(void)
{
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++) {
        central *c = &centrals[size_class];
        cm_lock_acquire(&c->lock);
        while (c->transfer_count > 0)
            span_push_list_locked(c, transfer[size_class][--c->transfer_count]);
        cm_lock_release(&c->lock);
    }
}

/* Objects of the class out of its spans; *cached_objects gets those in the transfer cache. */
size_t cm_central_objects_out(unsigned size_class, size_t *cached_objects)
{
    central *c = &centrals[size_class];
    cm_lock_acquire(&c->lock);
    size_t out = c->objects_out;
    *cached_objects = (size_t)c->transfer_count * cm_classes[size_class].batch;
    cm_lock_release(&c->lock);
    return out;
}

/* True when object starts one of the objects of a SMALL span of size_class and carries the
 * free mark; any address may be asked about. Here because this is the lowest layer that knows
 * both object lists and which spans hold a class; thread_cache.c uses it too (a call
 * downward). */
bool cm_is_free_object_of(unsigned size_class, const void *object)
{
    cm_span *span = cm_span_of(object);
    if (span == NULL || span->state != CM_SPAN_SMALL || span->size_class != size_class)
        return false;
    size_t offset = (size_t)((const char *)object - (const char *)cm_span_start(span));
    return offset % cm_classes[size_class].size == 0 &&
           offset / cm_classes[size_class].size < cm_classes[size_class].objects &&
           cm_object_is_free(object);
}

/* Takes object off the list at *head if it is there, looking no further than most entries
 * nor past the first that is not a free object of size_class (of any class: 0), since the list
 * may be half-updated (a forked child's left-behind lists). */
bool cm_list_unlink(void **head, void *object, size_t most, unsigned size_class)
{
    void *previous = NULL, *entry = *head;
    for (size_t n = 0; n <= most && entry != NULL; n++) {
        cm_span *span = size_class == 0 ? cm_span_of(entry) : NULL;
        unsigned entry_class = span ? span->size_class : size_class;
        if (entry_class == 0 || !cm_is_free_object_of(entry_class, entry))
            return false;
        void *next = cm_link_next(entry);
        if (entry == object) {
            if (previous == NULL)
                *head = next;
            else
                cm_link_relink(previous, next);
            return true;
        }
        previous = entry;
        entry = next;
    }
    return false;
}

/* True when list holds expected_length objects, each a free object of size_class. */
bool cm_object_list_valid(unsigned size_class, void *list, size_t expected_length)
{
    size_t n = 0;
    for (void *object = list; object != NULL && n <= expected_length;
         object = cm_link_next(object), n++)
        if (!cm_is_free_object_of(size_class, object))
            return false;
    return n == expected_length;
}

/* True when every span on the list from head is a listed SMALL span of the class with room,
 * each object accounted for (used + free + never used == objects per span); adds their used,
 * and to *behind the spans behind the head. */
static bool span_list_valid(unsigned size_class, const cm_span *head, unsigned owner,
                            size_t *listed_used, size_t *behind)
{
    const cm_class_info *info = &cm_classes[size_class];
    for (const cm_span *span = head; span; span = span->next) {
        size_t free_count = 0;
        for (void *o = span->free_objects; o && free_count <= info->objects; o = cm_link_next(o))
            free_count++;
        if (span->state != CM_SPAN_SMALL || span->size_class != size_class || !span->listed ||
            span->listed_owner != owner || (!span->free_objects && span->bump >= span->limit) ||
            span->used + free_count + (size_t)(span->limit - span->bump) / info->size !=
                info->objects ||
            !cm_object_list_valid(size_class, span->free_objects, free_count))
            return false;
        *listed_used += span->used;
        *behind += span != head;
    }
    return true;
}

/* Checks every class: listed spans (shared and each owner's) have room and account for each
 * object, transfer batches are whole batches of the class, and objects_out covers both; the
 * count of spans behind the heads of owners' lists is right. */
bool cm_central_valid(void)
{
    bool ok = true;
    for (unsigned size_class = 1; size_class < cm_class_count && ok; size_class++) {
        central *c = &centrals[size_class];
        const cm_class_info *info = &cm_classes[size_class];
        size_t listed_used = 0, shared_behind = 0, behind = 0;
        cm_lock_acquire(&c->lock);
        ok = span_list_valid(size_class, c->spans, 0, &listed_used, &shared_behind);
        for (unsigned slot = 1; slot < CM_REMOTE_SLOTS && ok; slot++)
            ok = span_list_valid(size_class, owned_spans[slot][size_class], slot, &listed_used,
                                 &behind);
        ok = ok && behind == c->owned_behind;
        for (unsigned i = 0; i < c->transfer_count && ok; i++)
            ok = cm_object_list_valid(size_class, transfer[size_class][i], info->batch);
        /* Objects in transfer batches are also counted in their spans' used. */
        ok = ok && c->objects_out >= listed_used &&
             c->objects_out >= (size_t)c->transfer_count * info->batch;
        cm_lock_release(&c->lock);
    }
    return ok;
}

void cm_central_fork(int phase)
{
    if (phase == CM_FORK_PREPARE) {
        for (unsigned size_class = 1; size_class < CM_CLASSES_MAX; size_class++)
            cm_lock_fork(&centrals[size_class].lock, phase);
    } else {
        for (unsigned size_class = CM_CLASSES_MAX - 1; size_class >= 1; size_class--)
            cm_lock_fork(&centrals[size_class].lock, phase);
    }
}
