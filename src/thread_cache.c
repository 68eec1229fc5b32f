/* thread_cache.c - the front end: one cache of free lists per thread, no locks on a hit.
 *
 * The fast paths (cm_alloc, cm_free in fastpath.h) pop and push the current thread's lists;
 * this file owns everything else: creating a thread's cache on its first slow path, filling an
 * empty list from the central cache, flushing part of a full list before a free's push,
 * keeping the thread within its byte budget, and giving everything back when the thread exits.
 * A slow-path free takes every lock it needs before it marks its object (see
 * cm_thread_cache_free_slow).
 *
 * Sizing: a list's max_length starts at 0 (a class the thread never used costs nothing) and
 * grows by one per miss up to the class's batch, then by a batch per miss up to list_cap()
 * (slow start: a thread that allocates little caches little). The fast paths keep no byte
 * count, so the budget is kept on slow paths: published_size counts each list's bytes as of its
 * own last slow path, and a cache's budget (max_size) bounds it. The budget starts at
 * CM_THREAD_START_BUDGET and grows, in doubling steps claimed from the global pool of
 * CMALLOC_THREAD_CACHE_TOTAL bytes, to at most CMALLOC_THREAD_CACHE_MAX; past it, every list's
 * max_length is halved and what no longer fits is given back; a list left unused for a
 * release delay gives its objects back and starts small again (release_idle_lists). Bytes
 * pushed by fast paths since a list's last slow path are bounded by its max_length: capacity,
 * the sum of max_length * class size, is held within CM_CAPACITY_PER_BUDGET budgets, so what a
 * cache really holds is never more than that.
 * Thread exit: a pthread key destructor gives back what the cache holds for others and keeps
 * its lists for the next thread to start (see "stocked caches"), or flushes it whole and
 * recycles it. Calls made after that (other libraries' destructors) see thread_state == GONE
 * and go to the central cache.
 * A cache whose thread exited without that destructor (its first allocation came in the last
 * round of key destructors, where glibc no longer looks at new values, or no key could be
 * made) is an orphan: the registry is swept for caches whose thread id has left the process,
 * a few per cache created and all of them when stats are read, and orphans are recycled. A
 * thread id says nothing in a process the cache was not made in: a child made by clone() or
 * syscall(SYS_fork) runs no atfork handler, and its main thread goes on with a cache naming its
 * parent's thread; such caches (owner_pid not this process) are never taken for orphans.
 * Fork: in the child the other threads' caches are left behind whole, never flushed or reused
 * (their lists may be half-updated); a free there of a block on one of their lists is its first
 * in the child (cm_thread_cache_take_left_behind).
 * Remote frees (remote.c): each cache opens a mailbox slot at an early allocation miss (the
 * parked slot owning what it has freed so far, when there is one), which the central cache
 * writes as the owner of the spans the cache fills from. A free of another cache's object is
 * pushed on this thread's list like any other while the list has room. What a list gives
 * back (overflow, budget, idle lists, exit) is sent home: the objects of spans another live
 * cache owns posted to that owner's mailbox for the class, a chain of runs per owner, the rest
 * to the central cache as before (a list making room for a free keeps that rest when it is
 * less than a batch; after a list of mostly its own, the next few go unsorted). An allocation
 * miss takes the mailbox of its class, whole, before it asks the central cache: long runs (and
 * more than a list holds, which only posts of long runs may leave there) go back to their spans,
 * the spans that came back whole becoming the class's fresh run and its spares again from their
 * start (with no lock when a run is a whole span by itself), or else the fill that follows
 * asks for up to CM_FILL_BYTES, cutting what came back whole anew (a fresh run, or carved
 * links); short ones (and the 16-byte class's) become the list as they
 * are, and a mailbox with plain posts the inbox (see "inboxes" below). An idle list's
 * mailbox goes to the central cache with it. Exit and the orphan sweep close the mailboxes,
 * give back what they held and park the slot, with its spans, for the next cache that frees
 * their objects, or else the next to open one (parked_lock, inside registry_lock).
 * Local lists: a free that finds its list full, of an object of a span the cache's slot owns,
 * goes onto that span's own list instead of flushing a batch (see "local lists" below); an
 * allocation miss takes those lists back whole before it looks at the mailbox. Outboxes: such
 * a free of an object of the owner the class's last sorted list mostly went to goes onto an
 * outbox for that owner, posted whole (see "outboxes" below).
 * Fresh runs: a fill that would carve a span's never-used objects hands them over as a range
 * instead, which the fast path takes from once the list is empty (see "fresh runs" below).
 * Lock: registry_lock guards the list of live caches, the blank and left-behind caches and
 * budget handover; it is the outermost lock (internal.h). The caches themselves are touched
 * only by their thread; stats read published_size, which the slow paths update for the list
 * they touch and store atomically.
 */
#include "internal.h"

#include <stdatomic.h>
#include <string.h>

enum { THREAD_NEW = 0, THREAD_LIVE, THREAD_GONE };

/* Every list empty with max_length 0 and start_limit 0: always the slow path; max_size 0 tells
 * it from a live cache, and its own_slot is no span's owner. */
static cm_thread_cache empty_cache = {.own_slot = CM_NO_OWN_SLOT};
_Static_assert(CM_REMOTE_SLOTS <= CM_NO_OWN_SLOT, "no slot is CM_NO_OWN_SLOT");
CM_THREAD_LOCAL cm_thread_cache *cm_thread_cache_current = &empty_cache;
static CM_THREAD_LOCAL uint8_t thread_state;

static cm_lock registry_lock = CM_LOCK_INIT;
static cm_thread_cache *registry;     /* live caches */
static cm_thread_cache *blank_caches; /* exited threads' caches with no lists or budget,
                                         for the next ones made; linked through next */
static cm_thread_cache *left_behind;  /* a forked child's: the other threads' caches, kept
                                         whole and never reused (cm_thread_cache_fork) */
static size_t live_caches;
static cm_thread_cache *sweep_next;      /* the registry entry the orphan sweep looks at next */
static uint64_t registrations;           /* caches registered so far: each gets the next number */
static _Atomic int64_t unclaimed_budget; /* of CMALLOC_THREAD_CACHE_TOTAL; may dip below 0 */
static pthread_key_t exit_key;
static bool have_exit_key; /* pthread_key_create can fail: all keys taken */

static void grow(cm_thread_cache *cache, unsigned size_class);
static void send_home(cm_thread_cache *cache, unsigned size_class, void *list, uint32_t count,
                      bool keep_own);
static void send_others_home(cm_thread_cache *cache, unsigned size_class);
static cm_thread_cache *cache_for_thread(void);
static bool over_budget(const cm_thread_cache *cache, size_t pending);
static void scavenge(cm_thread_cache *cache, size_t pending);
static void halve_lists(cm_thread_cache *cache);
static bool fits_after_growing(cm_thread_cache *cache, size_t pending);

static uint32_t list_cap(unsigned size_class)
{
    uint32_t batch = cm_classes[size_class].batch;
    uint32_t by_bytes = (uint32_t)(CM_LIST_BYTES_MAX / cm_classes[size_class].size);
    uint32_t cap = by_bytes < CM_LIST_OBJECTS_MAX ? by_bytes : CM_LIST_OBJECTS_MAX;
    return cap > batch ? cap : batch;
}

/* The most objects a class's mailbox may hold once chain is posted to it (beyond that the post
 * goes central): as many as its word counts, within the mailbox's bound in bytes
 * (CM_REMOTE_MAILBOX_BYTES), when the chain's runs are long (CM_RUN_LONG objects on average, in a
 * class whose runs carry headers; a plain chain has none), else a list's worth. An owner's take
 * that does not fit its list gives the runs back to their spans by their headers (take_mailbox):
 * cheap when they are long, one cold line a run when they are short, which a list's worth never
 * costs, as a mailbox that small becomes the list as it is. Held to a list's worth always,
 * xmalloc_bench at 2 and 4 pairs found the owner's mailbox full on 14% and 32% of its posts (a
 * batch of 4,096 objects is a 64-byte list's cap): each went to the central cache under the
 * class's lock, which the owner's fills take too, and the next few lists after it went there
 * unsorted, so the consumers slept on that lock (58% of their context switches, `perf record -e
 * sched:sched_switch --call-graph dwarf`). Past it for long runs: 64.8M, 66.5M and 46.7M frees/s
 * at 2, 4 and 8 pairs against 46.6M, 40.5M and 32.4M, the rest level (`scripts/bench-ab.sh --reps
 * 7 --rows xmalloc1,xmalloc2,xmalloc4,xmalloc8,xthr2,larson2,mstress2,rpm1,rpm2,larson8,
 * mstress8,rpm8,churn8`; xmalloc1 and larson2 again over 11 runs: 82.4M and 73.4M against 80.3M
 * and 71.6M). */
static uint32_t mailbox_most(unsigned size_class, const cm_remote_chain *chain)
{
    bool long_runs = cm_class_has_run_headers(size_class) && cm_remote_chain_runs_long(chain);
    return long_runs ? CM_REMOTE_COUNT_MOST : list_cap(size_class);
}

/* The most objects one fill asks for: a batch, or CM_FILL_BYTES of small
 * objects (the runs a mailbox gives back leave spans to carve, and each fill is a lock and a
 * drain of the carving's stores: at 32 objects of 64 B per fill, producer/consumer spent a
 * third of its time on fills). */
static uint32_t fill_most(unsigned size_class)
{
    uint32_t batch = cm_classes[size_class].batch;
    uint32_t by_bytes = (uint32_t)(CM_FILL_BYTES / cm_classes[size_class].size);
    return by_bytes > batch ? by_bytes : batch;
}

/* Claims up to want bytes of the global budget; returns what it got. */
static size_t claim_budget(size_t want)
{
    int64_t before = atomic_fetch_sub(&unclaimed_budget, (int64_t)want);
    if (before >= (int64_t)want)
        return want;
    size_t got = before > 0 ? (size_t)before : 0;
    atomic_fetch_add(&unclaimed_budget, (int64_t)(want - got));
    return got;
}

/* The never-used objects left in size_class's fresh run. */
static uint32_t run_objects(const cm_thread_cache *cache, unsigned size_class)
{
    const cm_fresh_run *run = &cache->runs[size_class];
    if (run->next == run->end) /* no division for the many classes without a run */
        return 0;
    return (uint32_t)((size_t)(run->end - run->next) / cm_classes[size_class].size);
}

/* Objects of size_class the cache holds beside its list: on local lists, in the outbox, the
 * fresh run, the inbox and the spares. */
static uint32_t held_beside_list(const cm_thread_cache *cache, unsigned size_class)
{
    return cache->local_objects[size_class] + cache->outboxes[size_class].chain.count +
           run_objects(cache, size_class) + cache->runs[size_class].inbox_count +
           cache->spares[size_class].count * cm_classes[size_class].objects;
}

/* Whether the cache holds nothing of size_class, counts nothing of it as published and its
 * outbox collects for none: what release_all and halve_lists do for a class is then nothing,
 * and a thread uses few of the 97. Passing those by took a churn_bench thread's exit from
 * 35.4k to 32.2k instructions at 889cab7 (the exit halved its lists then), of 119.5k and
 * 116.5k in its whole life (`valgrind --tool=callgrind --trace-children=yes env
 * LD_PRELOAD=<lib> build/bench/churn_bench --objects 256 --max-size 4096 --threads 1 --seconds
 * 3`, totals over the threads it ran). */
static bool holds_none_of(const cm_thread_cache *cache, unsigned size_class)
{
    return cm_free_list_length(&cache->lists[size_class]) == 0 &&
           cache->published_length[size_class] == 0 &&
           cache->local_published_objects[size_class] == 0 &&
           held_beside_list(cache, size_class) == 0 &&
           cache->outbox_slot[size_class] == CM_NO_OWN_SLOT;
}

/* Counts list size_class's bytes as they are now in the cache's published size (the other
 * lists count as of their own last slow path); its local lists, outbox, fresh run and inbox
 * count in local_published. */
static void publish(cm_thread_cache *cache, unsigned size_class)
{
    const size_t size = cm_classes[size_class].size;
    uint32_t length = cm_free_list_length(&cache->lists[size_class]);
    size_t bytes = cache->published_size +
                   ((size_t)length - cache->published_length[size_class]) * size;
    cache->published_length[size_class] = length;
    __atomic_store_n(&cache->published_size, bytes, __ATOMIC_RELAXED);
    uint32_t local = held_beside_list(cache, size_class);
    bytes = cache->local_published +
            ((size_t)local - cache->local_published_objects[size_class]) * size;
    cache->local_published_objects[size_class] = local;
    __atomic_store_n(&cache->local_published, bytes, __ATOMIC_RELAXED);
}

/* The list keeps its objects: max_length is at least their number. */
static void set_max_length(cm_thread_cache *cache, unsigned size_class, uint32_t max_length)
{
    cm_free_list *list = &cache->lists[size_class];
    uint32_t length = cm_free_list_length(list);
    CM_ASSERT(length <= max_length);
    cache->capacity = cache->capacity - (size_t)list->max_length * cm_classes[size_class].size +
                      (size_t)max_length * cm_classes[size_class].size;
    list->max_length = max_length;
    list->room = (int32_t)(max_length - length);
}

/* An empty list takes count objects linked from head, growing to hold them if it must. */
static void fill_list_with(cm_thread_cache *cache, unsigned size_class, void *head, uint32_t count)
{
    cm_free_list *list = &cache->lists[size_class];
    CM_ASSERT(list->head == NULL);
    if (count > list->max_length)
        set_max_length(cache, size_class, count);
    list->head = head;
    list->room = (int32_t)(list->max_length - count);
}

/* Flushes count objects from the head of a list to the central cache, in whole batches where
 * it can (a full batch lands in the transfer cache, ready for another thread). keep_own (a
 * list making room for a free, count at most a batch) may put back what was not sent to
 * other owners (send_home). */
static void release_objects(cm_thread_cache *cache, unsigned size_class, uint32_t count,
                            bool keep_own)
{
    cm_free_list *list = &cache->lists[size_class];
    const uint32_t batch = cm_classes[size_class].batch;
    list->room += (int32_t)count;
    while (count > 0) {
        uint32_t n = count < batch ? count : batch;
        void *head = list->head, *last = head;
        for (uint32_t i = 1; i < n; i++)
            last = cm_link_next_checked(last);
        list->head = cm_link_next_checked(last);
        cm_link_set(last, NULL);
        send_home(cache, size_class, head, n, keep_own);
        count -= n;
    }
}

/* ---- fresh runs: never-used objects handed out in address order, no link written ----------
 * A fill that would carve a span's never-used objects into an empty list (the bump pointer of
 * a span with no given-back objects) hands them to the cache as a range instead
 * (cm_central_fill_fresh): carving wrote a link and a mark into every object and the pop read
 * the link back, where the fast path's miss now steps a pointer (fastpath.h's cm_alloc). The
 * list comes first: what the thread freed is handed out again before the run. A span that came
 * back whole in the class's mailbox becomes the run too, or waits as one of the class's spares
 * (spares: a stack of up to cm_spare_most spans, CM_SPARE_BYTES) until the runs before it are
 * spent (take_mailbox, take_spare; central_cache.c, "spans handed back whole"): its objects
 * were handed out before, and a run hands each out with its mark cleared. A run's and a
 * spare's objects are out of their span as a list's are; the cache counts them with its local
 * lists (local_published), not against its budget: a run is one fill's worth, the spares at
 * most CM_SPARE_BYTES. Exit, the orphan sweep, an idle class and cmalloc_release give what is
 * left of a run back, carved, the spares whole, and the class's inbox with them (see
 * "inboxes" below).
 * Invariant: next == end, or next starts an object of a SMALL span of the class and end lies
 * a whole number of objects above it, at or below the span's bump pointer (checked against its
 * limit: the bump pointer moves under the class's lock); the spares are count whole spans of
 * the class, each counted out and on no list, linked from top through their first words. */

/* Whether start begins a SMALL span of the class that is out whole (cm_span_out_whole), as a
 * spare is. */
static bool spare_valid(unsigned size_class, const char *start)
{
    const cm_span *span = cm_span_of(start);
    return span != NULL && span->state == CM_SPAN_SMALL && span->size_class == size_class &&
           start == cm_span_start(span) && cm_span_out_whole(span, &cm_classes[size_class]);
}

/* The newest of the class's spares, taken off its stack; NULL when it has none. Its link is
 * memory the program could reach through a dangling pointer: the next span is checked before
 * it is used, and a link that leads to no whole span of the class is reported. */
static char *spare_pop(cm_thread_cache *cache, unsigned size_class)
{
    cm_spare_spans *spares = &cache->spares[size_class];
    char *start = spares->top;
    if (start == NULL)
        return NULL;
    char *next = cm_link_next_checked(start);
    spares->count--;
    if ((next == NULL) != (spares->count == 0) || (next != NULL && !spare_valid(size_class, next)))
        cm_report_corrupt_list(start);
    spares->top = next;
    return start;
}

static void run_give_back(cm_thread_cache *cache, unsigned size_class)
{
    cm_fresh_run *run = &cache->runs[size_class];
    if (run->inbox != NULL) {
        cm_central_flush(size_class, run->inbox, run->inbox_count);
        run->inbox = NULL;
        run->inbox_count = 0;
    }
    for (char *spare; (spare = spare_pop(cache, size_class)) != NULL;)
        cm_central_take_span(spare);
    uint32_t count = run_objects(cache, size_class);
    if (count == 0)
        return;
    void *head = cm_link_carved(run->next, cm_classes[size_class].size, count, NULL);
    run->next = run->end = NULL;
    cm_central_flush(size_class, head, count);
}

static bool run_valid(const cm_thread_cache *cache, unsigned size_class)
{
    const cm_fresh_run *run = &cache->runs[size_class];
    if ((run->inbox == NULL) != (run->inbox_count == 0) ||
        !cm_object_list_valid(size_class, run->inbox, run->inbox_count))
        return false;
    const cm_spare_spans *spares = &cache->spares[size_class];
    const char *spare = spares->top;
    for (uint32_t i = 0; i < spares->count; i++, spare = cm_link_next(spare))
        if (spare == NULL || !spare_valid(size_class, spare))
            return false;
    if (spare != NULL || spares->count > cm_spare_most(size_class))
        return false;
    if (run->next == run->end)
        return true;
    const cm_span *span = cm_span_of(run->next);
    const size_t size = cm_classes[size_class].size;
    return span != NULL && span->state == CM_SPAN_SMALL && span->size_class == size_class &&
           run->next < run->end && run->end <= span->limit &&
           (size_t)(run->next - (char *)cm_span_start(span)) % size == 0 &&
           (size_t)(run->end - run->next) % size == 0;
}

/* ---- local lists: what a full list has no room for, of spans the thread owns --------------
 * A free that finds its list full, of an object whose span the pagemap gives to the thread's
 * slot, pushes the object onto that span's local list (fastpath.h's cm_free_to_own_span)
 * instead of flushing a batch of the list to the central cache: no lock, no sort by owner, no
 * walk, and the objects stay with their span. The thread holds the list (span->local_holder,
 * claimed from NULL with a compare-and-swap by its first push): the pagemap's owner of a span
 * may change while a thread still has objects there, and a held list is never pushed to by
 * another thread. A span is held exactly while its local list has objects, and then it is on
 * its class's queue (newest first). An allocation miss takes whole local lists first, spliced
 * by their last objects, up to a fill's worth, and lets go of their spans. A free that would
 * bring back a span's last object gives the list back to the central cache, and the span to
 * the page heap (keeping a few such spans whole for the next miss measured no faster). Exit,
 * the orphan sweep, an idle class and cmalloc_release give the lists back. Their objects count
 * as used to the central cache; the cache counts them (local_objects) for stats but not
 * against its budget: a local list holds no page that a live object of its span does not hold
 * already, and a span with none goes home.
 * Invariant: local_objects[c] == the sum of local_count over the queue of class c, whose
 * spans are held by the cache, of class c, with 0 < local_count < used + 1. */
static void local_enqueue(cm_thread_cache *cache, unsigned size_class, cm_span *span)
{
    span->local_prev = NULL;
    span->local_next = cache->local_spans[size_class];
    if (span->local_next != NULL)
        span->local_next->local_prev = span;
    cache->local_spans[size_class] = span;
}

/* Takes the span between prev and next off the class's queue, without reading the span. */
static void local_unlink(cm_thread_cache *cache, unsigned size_class, cm_span *prev, cm_span *next)
{
    if (prev != NULL)
        prev->local_next = next;
    else
        cache->local_spans[size_class] = next;
    if (next != NULL)
        next->local_prev = prev;
}

/* Gives back a held span's list (with object, not yet marked, first) to the central cache. */
static void local_give_back(cm_thread_cache *cache, unsigned size_class, cm_span *span,
                            void *object)
{
    cm_span *prev = span->local_prev, *next = span->local_next;
    bool queued = span->local_count > 0;
    cache->local_objects[size_class] -= span->local_count;
    cm_central_take_local(span, object);
    if (queued)
        local_unlink(cache, size_class, prev, next);
}

static void local_give_back_class(cm_thread_cache *cache, unsigned size_class)
{
    while (cache->local_spans[size_class] != NULL)
        local_give_back(cache, size_class, cache->local_spans[size_class], NULL);
}

/* The fast path's local push could not be made (cm_free_to_own_span): the span is not held by
 * this thread yet, or object is its last one out. object starts an object of span and carries
 * no free mark; the budget is kept first (counting what the fast paths pushed onto the list
 * since its last slow path), and object is marked only where it is put: no object is marked
 * and in no list while its thread waits on a lock (cm_thread_cache_free_slow pushes it before
 * its budget's locks). */
void cm_thread_cache_free_local(cm_span *span, void *object)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    const unsigned size_class = span->size_class;
    cm_thread_cache *none = NULL;
    if (__atomic_load_n(&span->local_holder, __ATOMIC_RELAXED) != cache &&
        !__atomic_compare_exchange_n(&span->local_holder, &none, cache, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED)) {
        cm_thread_cache_free_slow(object, size_class); /* another thread's list is there */
        return;
    }
    publish(cache, size_class); /* the fast paths' pushes since its last slow path too */
    if (over_budget(cache, 0))
        scavenge(cache, 0);
    if (span->local_count + 1 >= __atomic_load_n(&span->used, __ATOMIC_RELAXED)) {
        local_give_back(cache, size_class, span, object); /* every object is back */
        publish(cache, size_class);
        return;
    }
    if (span->local_count == 0) {
        span->local_last = object;
        local_enqueue(cache, size_class, span);
    }
    cm_link_set(object, span->local_free);
    span->local_free = object;
    span->local_count++;
    cache->local_objects[size_class]++;
    publish(cache, size_class);
}

/* On an allocation miss: whole local lists of the class, newest first, up to a fill's worth
 * (a list never over its cap), become the list; their spans are let go. True when one did.
 * A local list of many objects is in the order they were freed, random in a program that
 * frees in random order: its span's lines are fetched first (cm_span_prefetch_objects), as
 * a central fill does; docs/PERFORMANCE.md has the numbers. */
static bool take_local(cm_thread_cache *cache, unsigned size_class)
{
    const uint32_t most = fill_most(size_class), cap = list_cap(size_class);
    const uint32_t many = cm_classes[size_class].objects / CM_PREFETCH_DIVISOR;
    uint32_t count = 0;
    void *head = NULL;
    cm_span *span;
    while (count < most && (span = cache->local_spans[size_class]) != NULL &&
           (count == 0 || count + span->local_count <= cap)) {
        uint32_t taken;
        local_unlink(cache, size_class, NULL, span->local_next);
        if (span->local_count >= many)
            cm_span_prefetch_objects(span, &cm_classes[size_class]);
        head = cm_span_local_detach(span, head, &taken);
        count += taken;
    }
    if (head == NULL)
        return false;
    cache->local_objects[size_class] -= count;
    fill_list_with(cache, size_class, head, count);
    return true;
}

/* The class's local lists are sound (the invariant above), each ending at its local_last. The
 * walk ends after local_objects spans, as each holds one object at least: a queue that loops
 * fails. */
static bool local_lists_valid(const cm_thread_cache *cache, unsigned size_class)
{
    uint32_t spans = 0, objects = 0;
    const cm_span *prev = NULL;
    for (const cm_span *span = cache->local_spans[size_class]; span != NULL;
         prev = span, span = span->local_next) {
        if (++spans > cache->local_objects[size_class] || span->local_prev != prev ||
            span->state != CM_SPAN_SMALL || span->size_class != size_class ||
            span->local_holder != cache || span->local_count == 0 ||
            span->local_count > span->used ||
            !cm_object_list_valid(size_class, span->local_free, span->local_count) ||
            cm_span_of(span->local_free) != span || cm_span_of(span->local_last) != span ||
            cm_link_next(span->local_last) != NULL)
            return false;
        objects += span->local_count;
    }
    return objects == cache->local_objects[size_class];
}

/* ---- outboxes: what a full list has no room for, of another owner's spans -----------------
 * A class's outbox collects for one owner (outbox_slot): a free that finds its list full, of
 * an object whose span that owner holds, goes onto the outbox (fastpath.h's
 * cm_free_to_outbox) as a chain of runs, one span each, with the runs' headers a post needs
 * (remote.c), and the outbox is posted to the owner's mailbox once it holds CM_OUTBOX_BYTES
 * (CM_OUTBOX_OBJECTS objects in classes up to CM_OUTBOX_OBJECTS_SIZE: outbox_most):
 * one compare-and-swap for them all, no walk of a list and no read of the pagemap again, as
 * send_home would. send_home says which owner: after a list it sorted went mostly (more than
 * half its objects) to one owner, and the post was taken, the class's outbox collects for
 * that owner; after a list mostly kept (its own objects, no owner, or a post refused), for
 * none. A refused post (the owner gone, or its mailbox full) sends the outbox to the central
 * cache, and it collects for none. So an outbox serves a thread that frees what one other
 * thread keeps allocating (a consumer), and a thread that frees what an exiting thread left
 * it (larson's successors) finds the owner's slot closed. The outbox is the thread's alone;
 * its objects carry the free mark and count as used in their spans, as a list's do; they
 * count for stats with the local lists (published when the outbox is posted and on the
 * class's other slow paths: a run's start does not, as a free in no order starts one at every
 * object), not against the budget: an outbox holds at most CM_OUTBOX_BYTES, or
 * CM_OUTBOX_OBJECTS objects of at most CM_OUTBOX_OBJECTS_SIZE, or one object.
 * Exit, the orphan sweep, an idle class and cmalloc_release post or give back every outbox.
 * Frees in no order start a run at almost every object, each a slow path: after a post whose
 * runs were short (fewer than CM_RUN_LONG objects on average), the next CM_PLAIN_POSTS chains
 * are plain (remote.c, "plain posts"), pushed by the fast path whatever their span, and the
 * one after measures the runs again.
 * A post ends where a run does, in the classes whose mailboxes go back to their spans
 * (CM_RUN_SPAN_OBJECTS or more objects a span: take_mailbox): a full outbox whose newest run's
 * span goes on takes up to twice as many objects (most doubled until the post) while its runs
 * are long (CM_RUN_LONG objects on average), so that the runs of a consumer that frees a
 * span's objects together are whole spans, which their owner hands out again with no lock
 * (central_cache.c's take_whole_spans).
 * Invariant: an outbox collecting for no owner is empty; one collecting holds count objects
 * of its class on a NULL-terminated chain from top, count <= most, most outbox_most or twice
 * it. */
static uint32_t outbox_most(unsigned size_class)
{
    const size_t size = cm_classes[size_class].size;
    size_t most = CM_OUTBOX_BYTES / size;
    if (most < CM_OUTBOX_OBJECTS && size <= CM_OUTBOX_OBJECTS_SIZE)
        most = CM_OUTBOX_OBJECTS;
    return most > 0 ? (uint32_t)most : 1;
}

static void outbox_empty(cm_outbox *box, unsigned size_class)
{
    memset(&box->chain, 0, sizeof box->chain);
    box->most = outbox_most(size_class);
}

/* Posts the class's outbox to its owner; refused, the outbox goes to the central cache and
 * collects for none from now on. The chains that follow are plain while the runs are short. */
static void outbox_post(cm_thread_cache *cache, unsigned size_class)
{
    cm_outbox *box = &cache->outboxes[size_class];
    const cm_remote_chain *chain = &box->chain;
    if (chain->plain)
        box->plain_posts--;
    else if (chain->count > 0)
        box->plain_posts = cm_remote_chain_runs_long(chain) ? 0 : CM_PLAIN_POSTS;
    if (box->chain.count > 0 &&
        !cm_remote_post(cache->outbox_slot[size_class], size_class, &box->chain,
                        mailbox_most(size_class, &box->chain))) {
        cm_link_relink(box->chain.bottom_last, NULL);
        cm_central_flush(size_class, box->chain.top, box->chain.count);
        cache->outbox_slot[size_class] = CM_NO_OWN_SLOT;
    }
    outbox_empty(box, size_class);
    publish(cache, size_class);
}

/* The class's outbox collects for slot from now on (CM_NO_OWN_SLOT: none); what it held for
 * another goes there first. */
static void outbox_collect_for(cm_thread_cache *cache, unsigned size_class, unsigned slot)
{
    if (cache->outbox_slot[size_class] == slot)
        return;
    if (cache->outbox_slot[size_class] != CM_NO_OWN_SLOT)
        outbox_post(cache, size_class);
    cache->outbox_slot[size_class] = (uint16_t)slot;
    outbox_empty(&cache->outboxes[size_class], size_class);
    cache->outboxes[size_class].plain_posts = 0; /* a new owner's runs are measured first */
}

/* The fast path's outbox push could not be made (cm_free_to_outbox): object (of span, of
 * size_class, not marked) starts a new run or a new chain, or the outbox is full and is posted
 * first. When that post is refused, object goes the way of a full list's free. Whatever may
 * wait on a lock comes before the object is marked and put (cm_thread_cache_free_local). */
void cm_thread_cache_free_remote(const cm_span *span, void *object, unsigned size_class)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    cm_outbox *box = &cache->outboxes[size_class];
    const uint32_t most = outbox_most(size_class);
    const bool run_goes_on = cm_classes[size_class].objects >= CM_RUN_SPAN_OBJECTS &&
                             !box->chain.plain && box->chain.count > 0 &&
                             box->chain.run_span == (uintptr_t)span &&
                             box->chain.count >= CM_RUN_LONG * box->chain.runs;
    if (run_goes_on && box->most == most)
        box->most = 2 * most; /* the post ends with the run's span, up to twice its size */
    else if (box->chain.count >= box->most || (box->chain.count >= most && !run_goes_on))
        outbox_post(cache, size_class);
    if (cache->outbox_slot[size_class] == CM_NO_OWN_SLOT) {
        cm_thread_cache_free_slow(object, size_class);
        return;
    }
    if (box->chain.count == 0) /* set here, not at empty: the fast path skips a first object */
        box->chain.plain = box->plain_posts > 0;
    cm_link_set(object, NULL);
    cm_remote_chain_add(&box->chain, size_class, object, (uintptr_t)span);
}

static bool outbox_valid(const cm_thread_cache *cache, unsigned size_class)
{
    const cm_outbox *box = &cache->outboxes[size_class];
    if (cache->outbox_slot[size_class] == CM_NO_OWN_SLOT)
        return box->chain.count == 0;
    const uint32_t most = outbox_most(size_class);
    return (box->most == most || box->most == 2 * most) && box->chain.count <= box->most &&
           (!box->chain.plain || (box->plain_posts > 0 && box->chain.runs == 0)) &&
           cm_object_list_valid(size_class, box->chain.top, box->chain.count);
}

/* Everything the cache holds goes back: its local lists, its outboxes and its lists, or with
 * keep_lists only what other caches own of its lists. */
static void release_all(cm_thread_cache *cache, bool keep_lists)
{
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++) {
        if (holds_none_of(cache, size_class))
            continue;
        local_give_back_class(cache, size_class);
        run_give_back(cache, size_class);
        if (keep_lists)
            send_others_home(cache, size_class);
        else
            release_objects(cache, size_class, cm_free_list_length(&cache->lists[size_class]),
                            false);
        outbox_collect_for(cache, size_class, CM_NO_OWN_SLOT);
        publish(cache, size_class);
    }
}

/* Takes a cache off the registry; it goes on the list *to. */
static void unlink_registered(cm_thread_cache *cache, cm_thread_cache **to)
{
    if (sweep_next == cache)
        sweep_next = cache->next;
    if (cache->prev)
        cache->prev->next = cache->next;
    else
        registry = cache->next;
    if (cache->next)
        cache->next->prev = cache->prev;
    cache->next = *to;
    *to = cache;
    cache->registration = 0;
    live_caches--;
}

/* Takes a cache off the registry and gives its budget back; it goes on the list *to. */
static void unregister_to(cm_thread_cache *cache, cm_thread_cache **to)
{
    unlink_registered(cache, to);
    atomic_fetch_add(&unclaimed_budget, (int64_t)cache->max_size);
}

static void unregister(cm_thread_cache *cache)
{
    unregister_to(cache, &blank_caches);
}

/* ---- remote frees (remote.c has the mailboxes) -------------------------------------------- */
/* What slot's mailbox holds for size_class goes to the central cache: in classes with run
 * headers, each run to its span without a walk (but a plain stack, as a list). */
static void give_back_mailbox(unsigned slot, unsigned size_class)
{
    uint32_t count;
    bool plain;
    void *list = cm_remote_take(slot, size_class, &count, &plain);
    if (count > 0 && !plain && cm_class_has_run_headers(size_class))
        cm_central_take_runs(size_class, list, count, NULL, NULL, 0);
    else if (count > 0)
        cm_central_flush(size_class, list, count);
}

/* Everything others freed to this cache goes to the central cache. */
static void flush_remote(cm_thread_cache *cache)
{
    if (cache->slot != 0)
        for (unsigned size_class = cm_remote_next_posted(cache->slot, 1);
             size_class < cm_class_count;
             size_class = cm_remote_next_posted(cache->slot, size_class + 1))
            give_back_mailbox(cache->slot, size_class);
}

/* ---- parked slots: an exited cache's slot and spans, for the next cache to start ----------
 * A stack, newest on top, under parked_lock (taken inside registry_lock, outside the central
 * caches' locks). A slot parked longer than a release delay, or pushed out by a newer one, is
 * shared out: its spans go to the shared lists and the slot is free for anyone. */
static cm_lock parked_lock = CM_LOCK_INIT;
static unsigned parked_slots[CM_PARKED_SLOTS];
static uint64_t parked_since_ms[CM_PARKED_SLOTS];
static _Atomic unsigned parked_count;

/* Takes the parked slot at index at off the stack; returns it. */
static unsigned unstack_parked_locked(unsigned at)
{
    unsigned count = atomic_load_explicit(&parked_count, memory_order_relaxed);
    unsigned slot = parked_slots[at];
    memmove(parked_slots + at, parked_slots + at + 1, (count - at - 1) * sizeof parked_slots[0]);
    memmove(parked_since_ms + at, parked_since_ms + at + 1,
            (count - at - 1) * sizeof parked_since_ms[0]);
    atomic_store_explicit(&parked_count, count - 1, memory_order_relaxed);
    return slot;
}

static void share_out_oldest_locked(void)
{
    unsigned slot = unstack_parked_locked(0);
    cm_central_disown(slot);
    cm_remote_release(slot);
}

static void share_out_expired_locked(uint64_t now)
{
    while (atomic_load_explicit(&parked_count, memory_order_relaxed) > 0 &&
           cm_option.release_delay_ms >= 0 &&
           now - parked_since_ms[0] >= (uint64_t)cm_option.release_delay_ms)
        share_out_oldest_locked();
}

/* Shares out the slots parked longer than a release delay; cheap when none is parked. */
static void share_out_expired(uint64_t now)
{
    if (atomic_load_explicit(&parked_count, memory_order_relaxed) == 0)
        return;
    cm_lock_acquire(&parked_lock);
    share_out_expired_locked(now);
    cm_lock_release(&parked_lock);
}

/* slot's mailboxes are closed and given back: it waits, with its spans, for a new cache. */
static void park_slot(unsigned slot)
{
    uint64_t now = cm_os_now_ms();
    cm_lock_acquire(&parked_lock);
    share_out_expired_locked(now);
    if (atomic_load_explicit(&parked_count, memory_order_relaxed) == CM_PARKED_SLOTS)
        share_out_oldest_locked();
    unsigned count = atomic_load_explicit(&parked_count, memory_order_relaxed);
    cm_remote_park(slot);
    cm_central_park(slot);
    parked_slots[count] = slot;
    parked_since_ms[count] = now;
    atomic_store_explicit(&parked_count, count + 1, memory_order_relaxed);
    cm_lock_release(&parked_lock);
}

/* A parked slot taken off the stack for a new cache to open: wanted when it is parked, else
 * the newest, or 0 (none parked, or wanted not parked and newest_else false). */
static unsigned unpark_slot(unsigned wanted, bool newest_else)
{
    unsigned slot = 0;
    cm_lock_acquire(&parked_lock);
    share_out_expired_locked(cm_os_now_ms());
    unsigned count = atomic_load_explicit(&parked_count, memory_order_relaxed), at = count;
    while (at > 0 && parked_slots[at - 1] != wanted)
        at--;
    if (at == 0 && newest_else)
        at = count;
    if (at > 0)
        slot = unstack_parked_locked(at - 1);
    cm_lock_release(&parked_lock);
    return slot;
}

/* The slot owning what the cache has freed so far (0: nothing, or no owner): what its thread
 * freed first, or else its lists' (a stocked cache's are its last thread's). */
static unsigned slot_freed_into(const cm_thread_cache *cache)
{
    if (cache->first_freed_owner != 0)
        return cache->first_freed_owner;
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++)
        if (cache->lists[size_class].head != NULL)
            return cm_pagemap_owner(cache->lists[size_class].head);
    return 0;
}

/* A cache opens its slot on an allocation miss, not at its start: a thread that replaces one
 * that exited and carries on with its data (larson's and mstress's lanes, a worker pool's) has
 * freed some of it by then, and the parked slot that owns it is the one to take over. When
 * that slot's thread is still on its way out (the new thread was started before it exited),
 * the cache fills without a slot for up to CM_SLOT_WAIT_MISSES misses, waiting for it to be
 * parked. Taking the newest parked slot at the start instead gave a third of larson's threads
 * another lane's slot and pages. */
static void open_slot_on_miss(cm_thread_cache *cache)
{
    if (CM_LIKELY(cache->slot_misses >= CM_SLOT_WAIT_MISSES))
        return; /* open, or given up on */
    unsigned wanted = slot_freed_into(cache);
    bool last_try = ++cache->slot_misses >= CM_SLOT_WAIT_MISSES;
    unsigned parked = unpark_slot(wanted, wanted == 0 || last_try);
    if (parked == 0 && wanted != 0 && !last_try && cm_remote_slot_open(wanted))
        return; /* its thread is exiting: try again on the next miss */
    cache->slot_misses = CM_SLOT_WAIT_MISSES;
    cache->slot = cm_remote_open(parked);
    if (cache->slot != 0) {
        cm_central_own(cache->slot);
        cache->own_slot = (uint16_t)cache->slot;
    }
}

/* The cache's thread is gone: its mailboxes closed and what they held given back, and the slot
 * parked with its spans for the next cache to start; frees of its spans' objects go the
 * central way meanwhile, onto the parked slot's lists. */
static void abandon(cm_thread_cache *cache)
{
    if (cache->slot == 0)
        return;
    cm_remote_close(cache->slot);
    flush_remote(cache);
    park_slot(cache->slot);
    cache->slot = 0;
    cache->own_slot = CM_NO_OWN_SLOT;
}

/* A list that went unused for a release delay: its mailbox goes back too, and its spans with
 * room are shared, so that what others free to a class the thread no longer allocates does
 * not wait there. */
static void release_idle_mailbox(cm_thread_cache *cache, unsigned size_class)
{
    if (cache->slot != 0) {
        give_back_mailbox(cache->slot, size_class);
        cm_central_share(cache->slot, size_class);
    }
}

/* ---- inboxes: a mailbox of plain posts, popped with a prefetch ahead -----------------------
 * An allocation miss that takes a mailbox with a plain post in it (remote.c, "plain posts"),
 * in a class whose posts carry ahead links (internal.h), keeps it as the class's inbox rather
 * than making it the list: the fast path pops it once the list and the fresh run are empty
 * (fastpath.h's cm_alloc), and each pop prefetches the object CM_POST_AHEAD further on. Such a
 * mailbox holds what other threads freed in no order, on other cores: a list's pop waits on
 * each object's link in turn, a transfer from another core at every allocation (99% of
 * malloc's samples, malloc 73% of all, under `perf record -e cpu-clock` of a producer/consumer
 * pinned to two cores whose consumer frees in random order, `build/bench/xmalloc_bench
 * --threads 1 --pin 1 --shuffle 1 --seconds 2`, at e201be6). Kept apart from the list, the
 * prefetch costs the list's pops nothing, and no prefetch is made of a word 2 the program
 * wrote. As a fresh run: what the thread frees meanwhile is handed out first, its objects
 * count with the local lists (local_published), not against the budget (it holds at most a
 * list's cap: take_mailbox), it goes back with the run (run_give_back), and a fork's child
 * searches a left-behind cache's too.
 * Invariant: inbox_count objects of the class from inbox, marked, NULL-terminated; both zero
 * when empty; only filled when empty. */

/* Takes the head off an inbox that has one, for the program. A call from the fast path, not
 * inlined there: the link check's report made malloc's every hit set up a stack frame (the
 * fast-path budget's pair 73 -> 75 instructions). */
void *cm_thread_cache_inbox_pop(cm_fresh_run *run)
{
    void *object = run->inbox;
    __builtin_prefetch(cm_ahead_of(object), 1, 3);
    run->inbox = cm_link_next_checked(object);
    run->inbox_count--;
    cm_object_hand_out(object);
    return object;
}

/* On an allocation miss (the class's list, run and inbox empty): the newest whole span a
 * mailbox take kept (central_cache.c's take_whole_spans) becomes the fresh run, with no lock. */
static bool take_spare(cm_thread_cache *cache, unsigned size_class)
{
    char *start = spare_pop(cache, size_class);
    if (start == NULL)
        return false;
    cm_fresh_run_start(&cache->runs[size_class], start, cm_classes[size_class].objects,
                       cm_classes[size_class].size);
    return true;
}

/* On an allocation miss (the class's list, run, inbox and spares empty): the mailbox of the
 * class, whole. When it holds more than a list may, or its runs are long (CM_RUN_LONG objects
 * on average, by their headers) in a class whose spans hold CM_RUN_SPAN_OBJECTS or more, they
 * go back to their spans, and the spans that came back whole become the class's fresh run and
 * its spares (central_cache.c, "spans handed back whole"), or else the fill that
 * follows carves what came back;
 * else (and in the 16-byte class) it becomes the list as it is (the list grows to hold it; the
 * budget is kept after the pop, as after a fill). A stack with a plain post in it (remote.c)
 * has no headers: it becomes the inbox (the list in the 16-byte class), or goes to the central
 * cache when it holds more than a list may (a post of long runs onto it). True when it became
 * the list or the inbox, or a span the run. */
static bool take_mailbox(cm_thread_cache *cache, unsigned size_class)
{
    uint32_t count;
    bool plain;
    void *mail =
        cache->slot != 0 ? cm_remote_take(cache->slot, size_class, &count, &plain) : NULL;
    if (mail == NULL)
        return false;
    CM_ASSERT(cm_object_list_valid(size_class, mail, count));
    if (!plain && cm_class_has_run_headers(size_class) &&
        (count > list_cap(size_class) ||
         (cm_classes[size_class].objects >= CM_RUN_SPAN_OBJECTS &&
          cm_remote_runs_long(size_class, mail, count)))) {
        cm_fresh_run *run = &cache->runs[size_class];
        cm_central_take_runs(size_class, mail, count, run, &cache->spares[size_class],
                             cache->slot);
        return run->next != run->end;
    }
    if (count > list_cap(size_class)) { /* a long-run post onto a plain one: no headers */
        cm_central_flush(size_class, mail, count);
        return false;
    }
    if (plain && cm_class_has_run_headers(size_class)) {
        cm_fresh_run *run = &cache->runs[size_class];
        CM_ASSERT(run->inbox == NULL);
        run->inbox = mail;
        run->inbox_count = count;
        return true;
    }
    fill_list_with(cache, size_class, mail, count);
    return true;
}

/* Posts the objects of a NULL-terminated list of size_class that spans of other live caches
 * own to their owners, a chain of runs each (up to CM_REMOTE_DESTINATIONS of them); returns
 * the rest (the cache's own, those of no owner and those a post refused), *kept of them, the
 * last in *kept_last. *most_to: the owner that took more than half of count, if one did. */
static void *post_others(cm_thread_cache *cache, unsigned size_class, void *list, uint32_t count,
                         uint32_t *kept, void **kept_last, unsigned *most_to)
{
    struct {
        cm_remote_chain chain;
        unsigned slot; /* 0 while unused */
    } homes[CM_REMOTE_DESTINATIONS] = {0};
    void *rest = NULL, *rest_last = NULL;
    uint32_t rest_count = 0;
    while (list != NULL) {
        void *object = list;
        list = cm_link_next_checked(object);
        unsigned owner = cm_pagemap_owner(object), i = 0;
        while (i < CM_REMOTE_DESTINATIONS && homes[i].slot != owner && homes[i].slot != 0)
            i++;
        if (owner == 0 || owner == cache->slot || i == CM_REMOTE_DESTINATIONS) {
            if (rest_last != NULL) /* in the list's order: a kept list stays in it */
                cm_link_relink(rest_last, object);
            else
                rest = object;
            rest_last = object;
            rest_count++;
            continue;
        }
        homes[i].slot = owner;
        cm_remote_chain_add(&homes[i].chain, size_class, object, cm_pagemap_span_page(object));
    }
    if (rest_last != NULL)
        cm_link_relink(rest_last, NULL);
    *most_to = CM_NO_OWN_SLOT;
    for (unsigned i = 0; i < CM_REMOTE_DESTINATIONS && homes[i].slot != 0; i++) {
        cm_remote_chain *chain = &homes[i].chain;
        if (!cm_remote_post(homes[i].slot, size_class, chain, mailbox_most(size_class, chain))) {
            cm_link_relink(chain->bottom_last, rest); /* its owner is gone or has enough */
            if (rest == NULL)
                rest_last = chain->bottom_last;
            rest = chain->top;
            rest_count += chain->count;
        } else if (2 * chain->count > count) {
            *most_to = homes[i].slot;
        }
    }
    CM_ASSERT(rest_count <= count);
    *kept = rest_count;
    *kept_last = rest_last;
    return rest;
}

/* What a list gives back (a NULL-terminated list of count objects of size_class) goes home:
 * the objects of spans another live cache owns posted to it, one chain of runs per owner, the
 * rest to the central cache as before. So a remote free costs the freeing thread a push onto
 * its own list, as a local one does, and its share of one compare-and-swap when that list
 * overflows. A list that was mostly the thread's own objects has the next CM_UNSORTED_LISTS
 * of the class go to the central cache whole, unsorted: a thread that frees what it allocates
 * (larson, the rpmalloc-style row) does not pay the sort's pagemap reads on every list. */
static void send_home(cm_thread_cache *cache, unsigned size_class, void *list, uint32_t count,
                      bool keep_own)
{
    if (cache->unsorted[size_class] > 0) { /* the last sorted list was mostly its own */
        cache->unsorted[size_class]--;
        cm_central_flush(size_class, list, count);
        return;
    }
    uint32_t kept;
    void *central_last;
    unsigned most_to; /* the owner that took most of the list */
    void *central = post_others(cache, size_class, list, count, &kept, &central_last, &most_to);
    if (2 * kept > count) /* mostly its own, no live owner's or refused: next few unsorted */
        cache->unsorted[size_class] = CM_UNSORTED_LISTS;
    if (2 * kept > count || most_to != CM_NO_OWN_SLOT) /* "outboxes" above */
        outbox_collect_for(cache, size_class, most_to);
    if (keep_own && kept > 0 && kept < count && kept < cm_classes[size_class].batch) {
        /* Part of a batch would reach the central cache, which only takes whole ones into its
         * transfer cache and walks the rest onto their spans under the lock: it stays on the
         * list instead, to leave in a whole batch of the cache's own objects later. */
        cm_free_list *own = &cache->lists[size_class];
        cm_link_relink(central_last, own->head);
        own->head = central;
        own->room -= (int32_t)kept;
        return;
    }
    if (kept > 0)
        cm_central_flush(size_class, central, kept);
}

/* A list kept (stocked caches) whose head is of another owner's span sends home what other
 * live caches own, and keeps the rest. A list headed by the cache's own object or one of no
 * owner is kept as it is, unwalked: what others own further down waits with it, until the
 * next thread takes it or the stock gives it back. */
static void send_others_home(cm_thread_cache *cache, unsigned size_class)
{
    cm_free_list *list = &cache->lists[size_class];
    uint32_t count = cm_free_list_length(list), kept;
    void *last;
    unsigned most_to;
    if (count == 0)
        return;
    unsigned head_owner = cm_pagemap_owner(list->head);
    if (head_owner == 0 || head_owner == cache->slot)
        return;
    list->head = post_others(cache, size_class, list->head, count, &kept, &last, &most_to);
    list->room += (int32_t)(count - kept);
}

static bool remote_valid(cm_thread_cache *cache)
{
    return cm_remote_valid(cache->slot);
}

static size_t mailbox_bytes(void)
{
    return cm_remote_bytes();
}

static unsigned owner_slot(const cm_thread_cache *cache)
{
    return cache->slot;
}

/* Forked child: a cache left behind closes its mailboxes for good, keeping what they held; its
 * spans with room go to the shared lists (the central caches' locks are the child's again). */
static void leave_slot_behind(cm_thread_cache *cache)
{
    if (cache->slot != 0) {
        cm_remote_leave_behind(cache->slot);
        cm_central_disown(cache->slot);
    }
}

static void fork_parked(int phase)
{
    cm_lock_fork(&parked_lock, phase);
}

static void fork_child_slot(void)
{
    cm_remote_fork_child(thread_state == THREAD_LIVE ? cm_thread_cache_current->slot : 0);
}

static bool take_left_behind_remote(void *object, unsigned size_class)
{
    return cm_remote_take_left_behind(
        object, size_class, thread_state == THREAD_LIVE ? cm_thread_cache_current->slot : 0);
}

/* ---- stocked caches: an exited thread's lists, for the next thread to start with ----------
 * A thread that replaces one that exited (a pool that resizes, a thread per request, a test
 * runner) allocates much as its predecessor did: it would fill each class's list again from
 * the central cache, one object more per miss (slow start), while the predecessor's exit had
 * just walked the same objects back there under each class's lock. So an exiting thread gives
 * back its local lists, outboxes and mailboxes and parks its slot as before, sends home the
 * lists headed by another owner's objects (send_others_home), and keeps the rest of its lists,
 * trimmed to at most CM_STOCKED_BYTES (trim_for_stock): the cache is stocked (at most
 * CM_STOCKED_CACHES of them, newest first, under registry_lock; past that it is flushed), and
 * the next cache created is the newest stocked one, lists, budget and all. Its slot it opens as
 * a new cache does, on a miss: the parked one that owns what its thread freed first, or else
 * what its lists hold (its last thread's). A stocked cache's objects stay marked free and count
 * as used in their spans, as on a live list; stats count them with the thread caches; the
 * budget stays claimed. One unused for a release delay (looked at when a cache is created and
 * with the parked slots, on allocation misses), one whose budget is over
 * CMALLOC_THREAD_CACHE_MAX, and every one at cmalloc_release, gives its lists and budget back
 * and becomes a blank, a struct for the next cache made. Stocked caches are whole and
 * untouched outside registry_lock: a forked child keeps them as they are. */
static cm_thread_cache *stocked;       /* newest first, linked through next */
static _Atomic unsigned stocked_count; /* written under registry_lock */

/* Caller holds registry_lock. False when the stock is full. */
static bool stock_locked(cm_thread_cache *cache, uint64_t now)
{
    unsigned count = atomic_load_explicit(&stocked_count, memory_order_relaxed);
    if (count == CM_STOCKED_CACHES)
        return false;
    unlink_registered(cache, &stocked);
    cache->stocked_ms = now;
    atomic_store_explicit(&stocked_count, count + 1, memory_order_relaxed);
    return true;
}

/* Takes the stocked cache at *at off the stock. Caller holds registry_lock. */
static void unstock_locked(cm_thread_cache **at)
{
    *at = (*at)->next;
    atomic_store_explicit(&stocked_count,
                          atomic_load_explicit(&stocked_count, memory_order_relaxed) - 1,
                          memory_order_relaxed);
}

/* As unstock_locked, and the cache gives its lists and budget back: a blank to start a cache
 * from. */
static void unstock_flushed_locked(cm_thread_cache **at)
{
    cm_thread_cache *cache = *at;
    unstock_locked(at);
    release_all(cache, false);
    atomic_fetch_add(&unclaimed_budget, (int64_t)cache->max_size);
}

/* Gives back the lists of the caches stocked longer than a release delay (every one: all),
 * which become blanks; cheap when none is stocked. */
static void release_stock(uint64_t now, bool all)
{
    if (atomic_load_explicit(&stocked_count, memory_order_relaxed) == 0)
        return;
    bool by_age = cm_option.release_delay_ms >= 0;
    cm_lock_acquire(&registry_lock);
    cm_thread_cache **at = &stocked;
    while (*at != NULL) {
        cm_thread_cache *cache = *at;
        if (!all && (!by_age || now - cache->stocked_ms < (uint64_t)cm_option.release_delay_ms)) {
            at = &cache->next;
            continue;
        }
        unstock_flushed_locked(at);
        cache->next = blank_caches;
        blank_caches = cache;
    }
    cm_lock_release(&registry_lock);
}

/* The stock holds stocked_count caches, each unregistered, with no slot, local list or
 * outbox, and within CM_STOCKED_BYTES. */
static bool stock_valid(void)
{
    unsigned count = 0;
    bool valid = true;
    cm_lock_acquire(&registry_lock);
    for (const cm_thread_cache *cache = stocked; cache != NULL && valid; cache = cache->next)
        valid = ++count <= CM_STOCKED_CACHES && cache->registration == 0 && cache->slot == 0 &&
                cache->local_published == 0 && cache->published_size <= CM_STOCKED_BYTES;
    valid = valid && count == atomic_load_explicit(&stocked_count, memory_order_relaxed);
    cm_lock_release(&registry_lock);
    return valid;
}

/* Bytes on the stocked caches' lists; caller holds registry_lock. */
static size_t stocked_bytes_locked(void)
{
    size_t bytes = 0;
    for (const cm_thread_cache *cache = stocked; cache != NULL; cache = cache->next)
        bytes += cache->published_size;
    return bytes;
}

/* A cache going into the stock keeps at most CM_STOCKED_BYTES on its lists: they give back
 * from the largest class down, each whole or as much as is still over (a large object gives
 * back the most bytes for the walk and the flush it costs, and the small classes, which serve
 * the most allocations a byte, stay), then every list's max_length is halved, to no fewer than
 * it holds, once and again until they add up to CM_STOCKED_CAPACITY (halve_lists halves and
 * gives back what no longer fits; here nothing more goes back). Halving every list until the
 * bytes fitted (two or three times for an mstress thread) walked half of every list each time
 * and left the next thread lists an eighth as long to grow back one miss at a time: an mstress
 * leg of 10,000 calls took 1,408K instructions, 88K of them its thread's exit and 177K its
 * allocation misses; 1,296K, 58K and 108K so (docs/PERFORMANCE.md has the commands). */
static void trim_for_stock(cm_thread_cache *cache)
{
    for (unsigned size_class = cm_class_count - 1;
         size_class >= 1 && cache->published_size > CM_STOCKED_BYTES; size_class--) {
        uint32_t length = cm_free_list_length(&cache->lists[size_class]);
        if (length == 0)
            continue;
        const size_t size = cm_classes[size_class].size,
                     over = cache->published_size - CM_STOCKED_BYTES;
        release_objects(cache, size_class,
                        over >= length * size ? length : (uint32_t)((over + size - 1) / size),
                        false);
        publish(cache, size_class);
    }
    size_t before;
    do {
        before = cache->capacity;
        for (unsigned size_class = 1; size_class < cm_class_count; size_class++) {
            const cm_free_list *list = &cache->lists[size_class];
            uint32_t length = cm_free_list_length(list), half = list->max_length / 2;
            if (list->max_length > 0)
                set_max_length(cache, size_class, length > half ? length : half);
        }
    } while (cache->capacity > CM_STOCKED_CAPACITY && cache->capacity < before);
}

static void thread_exit(void *arg)
{
    cm_thread_cache *cache = arg;
    cm_thread_cache_current = &empty_cache;
    thread_state = THREAD_GONE;
    release_all(cache, true); /* publishes every list: published_size is exact */
    bool keep = atomic_load_explicit(&stocked_count, memory_order_relaxed) < CM_STOCKED_CACHES;
    if (keep && over_budget(cache, 0)) /* the fast paths' pushes since the last slow path */
        scavenge(cache, 0);
    if (keep)
        trim_for_stock(cache);
    else
        release_all(cache, false);
    abandon(cache);
    uint64_t now = cm_os_now_ms();
    cm_lock_acquire(&registry_lock);
    if (!keep || !stock_locked(cache, now)) {
        if (keep) /* the stock filled up meanwhile */
            release_all(cache, false);
        unregister(cache);
    }
    cm_lock_release(&registry_lock);
}

/* Recycles the caches whose thread is gone among count registry entries, starting where the
 * last sweep stopped. The liveness test is a system call, made without registry_lock, which
 * every thread start and exit takes (held across the calls, it made churning threads queue on
 * it: `strace -f -c build/bench/churn_bench --objects 256 --max-size 4096 --threads 8
 * --seconds 0.5` under LD_PRELOAD counted 6,358 futex calls, 586 since). An entry found dead is
 * recycled only if it still holds the registration it had when it was picked: meanwhile its
 * thread's own destructor may have recycled it and a new thread taken it. A dead thread's
 * lists are safe to walk: nobody touches them any more. Caller holds no lock. */
static void sweep_orphans(int pid, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        cm_lock_acquire(&registry_lock);
        cm_thread_cache *cache = sweep_next ? sweep_next : registry;
        uint64_t registration = 0;
        int tid = 0, owner_pid = 0;
        if (cache != NULL) {
            sweep_next = cache->next;
            registration = cache->registration;
            tid = cache->owner_tid;
            owner_pid = cache->owner_pid;
        }
        cm_lock_release(&registry_lock);
        if (cache == NULL)
            return;
        if (cache == cm_thread_cache_current || owner_pid != pid || cm_os_thread_alive(pid, tid))
            continue;
        cm_lock_acquire(&registry_lock);
        if (cache->registration == registration) { /* caches are never unmapped: safe to read */
            release_all(cache, false);
            abandon(cache);
            unregister(cache);
        }
        cm_lock_release(&registry_lock);
    }
}

static CM_NOINLINE cm_thread_cache *create(void)
{
    int pid = cm_os_process_id();
    cm_lock_acquire(&registry_lock);
    size_t live = live_caches;
    cm_lock_release(&registry_lock);
    if (live >= CM_SWEEP_LIVE_MIN)
        sweep_orphans(pid, CM_SWEEP_PER_CREATE);
    if (atomic_load_explicit(&stocked_count, memory_order_relaxed) > 0)
        release_stock(cm_os_now_ms(), false); /* a stale one is not taken */
    cm_lock_acquire(&registry_lock);
    cm_thread_cache *cache = stocked;
    bool warm = cache != NULL && cache->max_size <= cm_option.thread_cache_max;
    if (warm) {
        unstock_locked(&stocked);
    } else if (cache != NULL) { /* its budget is over the option, lowered since */
        unstock_flushed_locked(&stocked);
    } else if ((cache = blank_caches) != NULL) {
        blank_caches = cache->next;
    }
    cm_lock_release(&registry_lock);
    if (warm) {
        /* Its lists, their sizes and its budget stay; its exit left no slot, local list or
         * outbox. What follows is the state of a thread's start. */
        cache->slot_misses = 0;
        cache->first_freed_owner = 0;
        cache->idle_check_ms = 0;
        memset(cache->idle_head, 0, sizeof cache->idle_head);
        memset(cache->unsorted, 0, sizeof cache->unsorted);
    } else {
        if (cache == NULL && (cache = cm_metadata_alloc(sizeof *cache)) == NULL)
            return NULL;
        memset(cache, 0, sizeof *cache);
        cache->own_slot = CM_NO_OWN_SLOT;
        for (unsigned size_class = 1; size_class < cm_class_count; size_class++) {
            cache->lists[size_class].start_magic = cm_classes[size_class].divisor_magic;
            cache->lists[size_class].start_limit = cm_classes[size_class].start_limit;
            cache->outbox_slot[size_class] = CM_NO_OWN_SLOT;
        }
        cache->max_size = CM_THREAD_START_BUDGET;
        atomic_fetch_sub(&unclaimed_budget, (int64_t)CM_THREAD_START_BUDGET);
    }
    cache->owner_tid = cm_os_thread_id();
    cache->owner_pid = pid;

    cm_lock_acquire(&registry_lock);
    cache->registration = ++registrations;
    cache->prev = NULL; /* a stocked cache was registered before */
    cache->next = registry;
    if (registry)
        registry->prev = cache;
    registry = cache;
    live_caches++;
    cm_lock_release(&registry_lock);

    /* Publish before pthread_setspecific, which may itself call calloc. */
    cm_thread_cache_current = cache;
    thread_state = THREAD_LIVE;
    if (have_exit_key)
        pthread_setspecific(exit_key, cache);
    return cache;
}

/* The calling thread's cache, created on first use; NULL once the thread is exiting, and
 * always in the debug mode (CMALLOC_CHECK), where every object must pass through check.c. */
static cm_thread_cache *cache_for_thread(void)
{
    if (CM_LIKELY(thread_state == THREAD_LIVE))
        return cm_thread_cache_current;
    return thread_state == THREAD_GONE || cm_option.check ? NULL : create();
}

/* pending: bytes about to be pushed, counted as if they were on the lists already. */
static bool over_budget(const cm_thread_cache *cache, size_t pending)
{
    return cache->published_size + pending > cache->max_size ||
           cache->capacity > CM_CAPACITY_PER_BUDGET * cache->max_size;
}

/* Whether pending more bytes fit, once the budget has grown (doubling, from the global pool,
 * up to CMALLOC_THREAD_CACHE_MAX) if they did not. */
static bool fits_after_growing(cm_thread_cache *cache, size_t pending)
{
    if (!over_budget(cache, pending))
        return true;
    if (cache->max_size >= cm_option.thread_cache_max)
        return false;
    size_t room = cm_option.thread_cache_max - cache->max_size;
    cache->max_size += claim_budget(cache->max_size < room ? cache->max_size : room);
    return !over_budget(cache, pending);
}

/* Halves every list's max_length and gives back what no longer fits. */
static void halve_lists(cm_thread_cache *cache)
{
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++) {
        cm_free_list *list = &cache->lists[size_class];
        if (list->max_length == 0 && holds_none_of(cache, size_class))
            continue;
        uint32_t max_length = list->max_length / 2, length = cm_free_list_length(list);
        if (length > max_length)
            release_objects(cache, size_class, length - max_length, false);
        set_max_length(cache, size_class, max_length);
        publish(cache, size_class);
    }
}

/* Over budget (with pending bytes to come): first try to grow the budget, else halve the lists
 * until the pending bytes fit or every list is down to nothing. Works on the calling thread's
 * live cache. */
static void scavenge(cm_thread_cache *cache, size_t pending)
{
    if (fits_after_growing(cache, pending))
        return;
    while (over_budget(cache, pending) && cache->capacity > 0)
        halve_lists(cache);
}

/* What a look records as a list's head when an allocation miss of its class came since: no
 * head is this address, so the list counts as used at the next look even if it is empty at
 * both (a class the thread allocates and misses on is empty at every miss; by its head alone it
 * looked idle, and its mailbox was given back and its spans shared while in use). */
#define LIST_MISSED ((void *)1)

/* A list whose head has not moved since the last look, a release delay ago, and that had no
 * allocation miss since, went unused that long (or came back to where it was): its objects go
 * back to the central cache and it starts small again. Without it a thread keeps what it once
 * freed of a class it no longer uses until it exits or runs over its budget: CPython's thread
 * held one block of each of a dozen 13-213 KiB classes through its run. Looked at from the
 * allocation misses, at most once per release delay (never when release is off); now: the
 * miss's clock reading. */
static void release_idle_lists(cm_thread_cache *cache, uint64_t now)
{
    if (cm_option.release_delay_ms < 0 || now < cache->idle_check_ms)
        return;
    bool first = cache->idle_check_ms == 0;
    cache->idle_check_ms = now + cm_release_interval_ms();
    share_out_expired(now);
    release_stock(now, false);
    if (first) /* a new cache's lists are empty, not idle: a parked slot's spans stay its own */
        return;
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++) {
        cm_free_list *list = &cache->lists[size_class];
        if (list->head != cache->idle_head[size_class]) {
            cache->idle_head[size_class] = list->head;
            continue;
        }
        release_idle_mailbox(cache, size_class); /* an unused class's mail too, list or not */
        local_give_back_class(cache, size_class);
        run_give_back(cache, size_class);
        outbox_collect_for(cache, size_class, CM_NO_OWN_SLOT);
        publish(cache, size_class);
        if (list->head != NULL) {
            release_objects(cache, size_class, cm_free_list_length(list), false);
            set_max_length(cache, size_class, 0);
            publish(cache, size_class);
            cache->idle_head[size_class] = NULL;
        }
    }
}

/* Grows a list's max_length after a miss (slow start), within list_cap(). */
static void grow(cm_thread_cache *cache, unsigned size_class)
{
    const uint32_t batch = cm_classes[size_class].batch;
    uint32_t max_length = cache->lists[size_class].max_length;
    if (max_length < batch)
        set_max_length(cache, size_class, max_length + 1);
    else if (max_length + batch <= list_cap(size_class))
        set_max_length(cache, size_class, max_length + batch);
}

void *cm_thread_cache_alloc_slow(unsigned size_class)
{
    cm_thread_cache *cache = cache_for_thread();
    void *head;
    if (cache == NULL) { /* exiting thread: one object straight from the central cache */
        unsigned n = cm_central_fill(size_class, 1, &head, 0);
        if (n == 0)
            return NULL;
        if (n > 1)
            cm_central_flush(size_class, cm_link_next_checked(head), n - 1);
        cm_object_hand_out(head);
        return head;
    }
    open_slot_on_miss(cache);
    cache->idle_head[size_class] = LIST_MISSED;
    cm_free_list *list = &cache->lists[size_class];
    cm_fresh_run *run = &cache->runs[size_class];
    if (list->head == NULL && run_objects(cache, size_class) == 0 && run->inbox == NULL &&
        !take_local(cache, size_class) && !take_spare(cache, size_class) &&
        !take_mailbox(cache, size_class)) {
        uint64_t now = cm_os_now_ms();
        release_idle_lists(cache, now);
        grow(cache, size_class);
        if (over_budget(cache, 0))
            scavenge(cache, 0);
        uint32_t most = fill_most(size_class);
        uint32_t want = list->max_length < most ? list->max_length : most;
        cm_central_tick(now);
        unsigned n = cm_central_fill_fresh(size_class, want > 0 ? want : 1, &head,
                                           owner_slot(cache), run);
        if (n == 0)
            return NULL;
        if (head != NULL)
            fill_list_with(cache, size_class, head, n - run_objects(cache, size_class));
    }
    void *object;
    if (list->head != NULL)
        object = cm_free_list_pop(list);
    else if (run_objects(cache, size_class) > 0)
        object = cm_fresh_run_take(run);
    else
        object = cm_thread_cache_inbox_pop(run);
    publish(cache, size_class);
    if (over_budget(cache, 0))
        scavenge(cache, 0);
    return object;
}

/* object starts an object of a SMALL span of size_class and carries no free mark.
 * Everything that may wait on a lock (making room in a full list, keeping the budget) is done
 * before object is marked free, and nothing after: a fork's prepare handler holds every
 * allocator lock, and a free it catches waiting must leave the object allocated in the child,
 * where that free never returned. glibc's child frees again the TLS blocks a thread was
 * freeing in pthread_create when another forked (tests/programs/fork_dlopen_tls.c). */
void cm_thread_cache_free_slow(void *object, unsigned size_class)
{
    bool first_call = thread_state == THREAD_NEW;
    cm_thread_cache *cache = cache_for_thread();
    if (cache == NULL) {
        cm_central_give_back(size_class, object);
        return;
    }
    if (first_call)
        cache->first_freed_owner = (uint16_t)cm_pagemap_owner(object);
    cm_free_list *list = &cache->lists[size_class];
    if (list->room == 0) {
        const uint32_t batch = cm_classes[size_class].batch, length = cm_free_list_length(list);
        release_objects(cache, size_class, length < batch ? length : batch, true);
        if (list->max_length < batch)
            set_max_length(cache, size_class, list->max_length + 1);
    }
    /* The list has room now (a list of none grew to one): the object goes on, and one publish
     * counts it with the fast paths' pushes since the last slow path; a budget then exceeded
     * halves the lists, this one and the object with them. */
    CM_ASSERT(list->room > 0);
    list->room--;
    cm_free_list_push(list, object, cm_free_mark(object));
    publish(cache, size_class);
    if (over_budget(cache, 0))
        scavenge(cache, 0);
}

/* The stock first: what its lists send home to this thread's mailbox goes back with it. */
void cm_thread_cache_flush_current(void)
{
    release_stock(0, true);
    if (thread_state == THREAD_LIVE) {
        release_all(cm_thread_cache_current, false);
        flush_remote(cm_thread_cache_current);
    }
}

static size_t held_objects(const cm_thread_cache *cache, unsigned size_class)
{
    return (size_t)cm_free_list_length(&cache->lists[size_class]) +
           held_beside_list(cache, size_class);
}

static size_t held_bytes(const cm_thread_cache *cache)
{
    size_t bytes = 0;
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++)
        bytes += held_objects(cache, size_class) * cm_classes[size_class].size;
    return bytes;
}

/* Objects of size_class the calling thread's cache holds, on its list and its local lists. */
size_t cm_thread_cache_objects(unsigned size_class)
{
    return held_objects(cm_thread_cache_current, size_class);
}

/* Bytes held by all thread caches: exact for the calling thread's, as of each class's last
 * slow path for the others' (lists and local lists), and what waits in their mailboxes;
 * *caches gets how many caches live. */
size_t cm_thread_cache_bytes(size_t *caches)
{
    size_t bytes = 0;
    cm_lock_acquire(&registry_lock);
    size_t live = live_caches;
    cm_lock_release(&registry_lock);
    sweep_orphans(cm_os_process_id(), live);
    cm_lock_acquire(&registry_lock);
    for (cm_thread_cache *cache = registry; cache; cache = cache->next)
        bytes += cache == cm_thread_cache_current
                     ? held_bytes(cache) /* our own: exact */
                     : __atomic_load_n(&cache->published_size, __ATOMIC_RELAXED) +
                           __atomic_load_n(&cache->local_published, __ATOMIC_RELAXED);
    bytes += stocked_bytes_locked();
    *caches = live_caches;
    cm_lock_release(&registry_lock);
    return bytes + mailbox_bytes();
}

/* Checks the stock and the calling thread's cache: each list holds length objects of its
 * class, no more than its max_length, which is within its cap; capacity and the published size
 * add up and are within the budget; the sampling countdown never runs below 0. */
bool cm_thread_cache_valid(void)
{
    if (!stock_valid())
        return false;
    if (thread_state != THREAD_LIVE)
        return true;
    cm_thread_cache *cache = cm_thread_cache_current;
    size_t capacity = 0, published = 0, local_published = 0;
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++) {
        cm_free_list *list = &cache->lists[size_class];
        if (list->room < 0 || (uint32_t)list->room > list->max_length ||
            !cm_object_list_valid(size_class, list->head, cm_free_list_length(list)) ||
            list->start_magic != cm_classes[size_class].divisor_magic ||
            list->start_limit != cm_classes[size_class].start_limit ||
            list->max_length > list_cap(size_class) + cm_classes[size_class].batch ||
            !local_lists_valid(cache, size_class) || !outbox_valid(cache, size_class) ||
            !run_valid(cache, size_class))
            return false;
        capacity += (size_t)list->max_length * cm_classes[size_class].size;
        published += (size_t)cache->published_length[size_class] * cm_classes[size_class].size;
        local_published +=
            (size_t)cache->local_published_objects[size_class] * cm_classes[size_class].size;
    }
    return capacity == cache->capacity && published == cache->published_size &&
           local_published == cache->local_published &&
           remote_valid(cache) && !over_budget(cache, 0) && cache->sample_left >= 0 &&
           cache->max_size <= cm_option.thread_cache_max + CM_THREAD_START_BUDGET;
}

void cm_thread_cache_init(void)
{
    atomic_store(&unclaimed_budget, (int64_t)cm_option.thread_cache_total);
    have_exit_key = pthread_key_create(&exit_key, thread_exit) == 0;
}

/* In the child only the forking thread survives. The others' caches leave the registry but
 * are not flushed: a thread may have been inside a lock-free fast path at the moment of fork,
 * leaving its lists half-updated, so their objects stay out of reach (at most one cache
 * budget per thread). They are kept whole on left_behind, never reused, for
 * cm_thread_cache_take_left_behind. */
void cm_thread_cache_fork(int phase)
{
    if (phase == CM_FORK_PREPARE) {
        cm_lock_fork(&registry_lock, phase);
        fork_parked(phase);
    } else {
        fork_parked(phase);
        cm_lock_fork(&registry_lock, phase);
    }
    if (phase != CM_FORK_CHILD)
        return;
    cm_thread_cache *cache = registry;
    while (cache != NULL) {
        cm_thread_cache *next = cache->next;
        if (cache != cm_thread_cache_current) {
            unregister_to(cache, &left_behind);
            leave_slot_behind(cache);
        }
        cache = next;
    }
    fork_child_slot();
}

/* A free of an object that carries the free mark, in a forked child: true (and the object
 * handed out again, so that the free goes on as an ordinary one) when it sits on a list of a
 * cache the fork left behind. glibc's child frees again what a parent thread had freed just
 * before the fork: the dlopen'd modules' TLS blocks of a stack that thread was reusing in
 * pthread_create, whose table it clears only after freeing them all
 * (tests/programs/fork_dlopen_tls.c). The object was out of reach in the child, so this free
 * is its first there. The walk trusts no link: a thread may have stopped inside a fast path,
 * so it ends at the first entry that is not a free object of the class. */
bool cm_thread_cache_take_left_behind(void *object, unsigned size_class)
{
    if (__atomic_load_n(&left_behind, __ATOMIC_RELAXED) == NULL)
        return false;
    bool found = false;
    cm_span *span = cm_span_of(object); /* a local list's objects are its span's */
    cm_lock_acquire(&registry_lock);
    for (cm_thread_cache *cache = left_behind; cache != NULL && !found; cache = cache->next) {
        found = cm_list_unlink(&cache->lists[size_class].head, object,
                               cache->lists[size_class].max_length, size_class);
        if (!found && span != NULL && span->local_holder == cache &&
            (found = cm_list_unlink(&span->local_free, object, span->local_count, size_class)))
            span->local_count--;
        cm_remote_chain *outbox = &cache->outboxes[size_class].chain;
        if (!found && (found = cm_list_unlink(&outbox->top, object, outbox->count, size_class)))
            outbox->count--;
        cm_fresh_run *run = &cache->runs[size_class];
        if (!found && (found = cm_list_unlink(&run->inbox, object, run->inbox_count, size_class)))
            run->inbox_count--;
    }
    found = found || take_left_behind_remote(object, size_class);
    cm_lock_release(&registry_lock);
    if (found)
        cm_object_hand_out(object);
    return found;
}

/* The latest free of each thread through a path that takes a lock (guard.c, check.c; one
 * table each, guarded by its lock). glibc's window of fork_dlopen_tls.c is open there too: a
 * thread's free returned, but its TLS table still holds the block when another thread forks,
 * and the child frees it again. The child cannot tell that from a program's double free by the
 * block alone, so each free notes its block under its thread (identified by the address of
 * its thread-local state, which a forked child keeps for the thread it goes on with); in the
 * child the other threads' notes are kept, once each, and a second free of a noted block is
 * taken as its first there. A thread's note is overwritten by its next free (and by another
 * thread's hashing alike): what is lost is reported as before. */
static size_t latest_free_index(uintptr_t thread)
{
    return (size_t)(((thread >> 12) * 0x9e3779b97f4a7c15ull) >> 32) % CM_LATEST_FREES;
}

void cm_latest_free_note(cm_latest_free table[CM_LATEST_FREES], const void *block)
{
    uintptr_t thread = (uintptr_t)&thread_state;
    table[latest_free_index(thread)] =
        (cm_latest_free){.thread = thread, .block = block, .left_behind = false};
}

/* In the child: every note but the forking thread's is a thread's the fork left behind (the
 * forking thread's free returned before it forked, so freeing that block again is the
 * program's double free). */
void cm_latest_free_fork_child(cm_latest_free table[CM_LATEST_FREES])
{
    for (size_t i = 0; i < CM_LATEST_FREES; i++) {
        table[i].left_behind =
            table[i].block != NULL && table[i].thread != (uintptr_t)&thread_state;
        if (!table[i].left_behind)
            table[i].block = NULL;
    }
}

/* A free of a block already freed: true, and the note dropped, when it was the latest free of
 * a thread the fork left behind (the table's lock held). */
bool cm_latest_free_take(cm_latest_free table[CM_LATEST_FREES], const void *block)
{
    for (size_t i = 0; i < CM_LATEST_FREES; i++) {
        if (table[i].left_behind && table[i].block == block) {
            table[i] = (cm_latest_free){.block = NULL};
            return true;
        }
    }
    return false;
}

/* In a forked child, always (also when fork took no lock): the thread's cache must carry the
 * child thread's own ids, or a later sweep would take it for an orphan (or, with the parent's
 * pid, never recycle it). */
void cm_thread_cache_fork_owner(void)
{
    if (thread_state == THREAD_LIVE) {
        cm_thread_cache_current->owner_tid = cm_os_thread_id();
        cm_thread_cache_current->owner_pid = cm_os_process_id();
    }
}
