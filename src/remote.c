/* remote.c - the thread caches' mailboxes: where frees of another thread's objects go, with no
 * lock.
 *
 * Every live thread cache holds a slot, a number from 1 to CM_REMOTE_SLOTS - 1 (0: none, when
 * all are taken). The central cache writes the filling cache's slot into the pagemap's owner
 * field of every span it carves objects from (the span's owner is the cache that last took
 * objects from it). A free is pushed on the freeing thread's own list as ever; when that list
 * gives objects back (thread_cache.c's send_home), those of spans another live cache owns are
 * posted here, a chain of runs per owner.
 * A slot has one mailbox word per size class: a stack of the objects posted to it and their
 * count, in one 64-bit word, so a post is one compare-and-swap (the poster links its chain's
 * bottom to the top it read) and the owner's take is one compare-and-swap that hands over the
 * whole stack with its length. A poster cuts what it sends into runs, one span's objects each,
 * and in classes of CM_RUN_MIN_SIZE bytes and up writes each run's length, last object and
 * successor into its first object (internal.h, "runs"): when the runs are long, the owner
 * gives every run back to its span by reading that header alone, and spans that came back
 * whole are handed out again from their start (as the owner's fresh run and its spares, up to
 * CM_SPARE_BYTES, the rest cut again by fills: central_cache.c, "spans handed back whole"); so
 * does a stack of more than a list holds, which only posts of long runs may make
 * (thread_cache.c's mailbox_most); else, and in the 16-byte class, the stack becomes the
 * owner's empty list as it is. (The mailboxes were
 * once one stack per slot, of every class, which the owner walked to sort: each object another
 * core had just written cost a cache miss, 35% of xmalloc_bench's time under `perf record`;
 * then a stack per class always used as the list, whose pops chased those same links: 59%.)
 * Plain posts: a freeing thread whose frees of an owner's objects come in no order cuts a run
 * at almost every object, and its outbox's runs were a slow path for every free (88
 * instructions a call under the order book's pipeline, `valgrind --tool=callgrind
 * --trace-children=yes env LD_PRELOAD=build/libcmalloc.so build/orderbook replay ORDERS
 * --pipeline`, ORDERS from `build/orderbook gen --messages 500000 --seed 1`), for an owner
 * that takes such a mailbox as a list anyway. So an outbox whose
 * post held short runs (fewer than CM_RUN_LONG objects a run on average) gathers its next
 * CM_PLAIN_POSTS posts as plain chains (thread_cache.c, "outboxes"), with no runs and no
 * headers, and measures its runs again after. A plain post sets its word's plain bit, which
 * stays until the owner's take: a stack with a plain post in it has no headers to read, and
 * its owner takes it as its inbox, or gives it to the central cache as a list. In classes with
 * room for run headers a plain post carries ahead links instead (internal.h), which the
 * poster writes walking its chain, still in its own cache, before the post: the owner's pops
 * prefetch by them (thread_cache.c, "inboxes").
 * Word: top << 16 | plain << 19 | count << 1 | open. top is the stack's first object (below
 * 2^48, as every address the pagemap covers, and a multiple of 16, so bits 16-19 are free:
 * the count's top three bits and the plain bit), count at most CM_REMOTE_COUNT_MOST (18 bits),
 * open set while the slot has an owner; a closed word refuses posts and keeps what it holds
 * for whoever closed it.
 * Ownership is a route, not an account: objects in mailboxes count as out of their spans
 * (span->used) as objects in thread caches do, so any cache may take any of them and a stale
 * route (a slot reused by a new thread, a span refilled by another) costs nothing but a detour.
 * A slot is FREE (every word closed and empty, may be opened), OPEN (a live cache's, or being
 * closed by its cache's exit) or LEFT (a forked child's slot of a thread that did not survive
 * the fork: closed for good, its objects kept whole, never reused, for
 * cm_remote_take_left_behind).
 * Invariants: every object in a mailbox carries the free mark and counts as used in its span;
 * a word's stack holds exactly its count of objects of its class and ends in NULL, and (a LEFT
 * slot's and a plain word's excepted) its runs' headers add up to that count; bytes is at
 * most CM_REMOTE_MAILBOX_BYTES plus one post (posts above it are refused), so an owner that
 * stops allocating strands a bounded amount; only the owner (or, once closed, the closer) takes,
 * so takes and pushes need no ABA guard (pushes only add on top, and what is below the top a
 * taker read stays as it was).
 * No lock: slots are claimed with a compare-and-swap of their state.
 */
#include "internal.h"

#include <stdatomic.h>

enum { SLOT_FREE = 0, SLOT_OPEN, SLOT_LEFT, SLOT_PARKED };

#define WORD_OPEN      ((uint64_t)1)
#define WORD_PLAIN     ((uint64_t)1 << 19)
#define WORD_TOP_SHIFT 16
#define WORD_LOW_BITS  20 /* count, plain and open; top << 16 has its low 4 bits 0 */
#define WORD_TOP_BITS  (~(((uint64_t)1 << WORD_LOW_BITS) - 1))
_Static_assert(CM_ALIGNMENT >= 16 && CM_ADDRESS_BITS + WORD_TOP_SHIFT <= 64,
               "a stack's top, shifted, has bits 16-19 free and fits the word");
_Static_assert(((uint64_t)CM_REMOTE_COUNT_MOST << 1 | WORD_PLAIN | WORD_OPEN) <
                   (uint64_t)1 << WORD_LOW_BITS,
               "count, plain and open lie below the top's bits");

typedef struct mailbox {
    _Atomic int64_t bytes; /* posted since the owner's takes (a bound, not an exact count: a post
                              adds after its compare-and-swap, so a take may run ahead of it) */
    _Atomic uint8_t state;
    _Atomic uint64_t words[CM_CLASSES_MAX];
} __attribute__((aligned(CM_FALSE_SHARING))) mailbox;

static mailbox boxes[CM_REMOTE_SLOTS];     /* all FREE: every word 0, closed and empty */
static _Atomic unsigned next_try = 1;      /* where the next claim starts looking */
static _Atomic unsigned slots_touched = 1; /* 1 + the highest slot ever opened: the walks of every
                                            slot stop there, leaving the rest of boxes untouched */
static unsigned forked_slot;               /* a forked child's: the forking thread's slot */

static inline uint64_t word_of(void *top, uint32_t count, uint64_t open)
{
    return (uint64_t)(uintptr_t)top << WORD_TOP_SHIFT | (uint64_t)count << 1 | open;
}
static inline void *word_top(uint64_t word)
{
    return (void *)(uintptr_t)((word & WORD_TOP_BITS) >> WORD_TOP_SHIFT);
}
static inline uint32_t word_count(uint64_t word)
{
    return (uint32_t)(word >> 1) & CM_REMOTE_COUNT_MOST;
}

/* Opens slot if it is in state from: its words open and empty. */
static bool claim(unsigned slot, uint8_t from)
{
    mailbox *box = &boxes[slot];
    if (!atomic_compare_exchange_strong(&box->state, &from, SLOT_OPEN))
        return false;
    unsigned touched = atomic_load_explicit(&slots_touched, memory_order_relaxed);
    while (touched <= slot && !atomic_compare_exchange_weak(&slots_touched, &touched, slot + 1))
        ;
    atomic_store_explicit(&box->bytes, 0, memory_order_relaxed);
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++)
        atomic_store_explicit(&box->words[size_class], WORD_OPEN, memory_order_release);
    return true;
}

/* A slot for a new cache: parked (cm_remote_park) when nonzero, else a free one; 0 when all
 * are taken. */
unsigned cm_remote_open(unsigned parked)
{
    if (parked != 0 && claim(parked, SLOT_PARKED))
        return parked;
    unsigned start = atomic_load_explicit(&next_try, memory_order_relaxed);
    for (unsigned i = 0; i < CM_REMOTE_SLOTS - 1; i++) {
        unsigned slot = 1 + (start - 1 + i) % (CM_REMOTE_SLOTS - 1);
        if (claim(slot, SLOT_FREE)) {
            atomic_store_explicit(&next_try, slot + 1 < CM_REMOTE_SLOTS ? slot + 1 : 1,
                                  memory_order_relaxed);
            return slot;
        }
    }
    return 0;
}

/* Whether slot belongs to a live cache (or a parked one's thread is exiting). */
bool cm_remote_slot_open(unsigned slot)
{
    return atomic_load_explicit(&boxes[slot].state, memory_order_relaxed) == SLOT_OPEN;
}

/* The newest run is done: its head gets its header (internal.h, "runs"). */
static void finish_run(cm_remote_chain *chain, unsigned size_class)
{
    if (chain->run_next == NULL)
        chain->bottom_head = chain->top;
    if (cm_class_has_run_headers(size_class))
        cm_run_set_header(chain->top, chain->count - chain->run_start, chain->run_last,
                          chain->run_next);
}

/* Prepends object (a marked object of size_class, of the span span_key names: one key per span
 * in a chain, never 0) to the chain: onto the newest run when it is of the same span, else as
 * a new run's first; a plain chain has no runs. */
void cm_remote_chain_add(cm_remote_chain *chain, unsigned size_class, void *object,
                         uintptr_t span_key)
{
    if (chain->plain) {
        if (chain->count == 0)
            chain->bottom_last = object;
    } else if (chain->count > 0 && span_key == chain->run_span &&
               chain->count - chain->run_start < CM_RUN_MOST) {
        /* onto the newest run: count alone grows */
    } else {
        if (chain->count > 0)
            finish_run(chain, size_class);
        else
            chain->bottom_last = object;
        chain->run_last = object;
        chain->run_next = chain->top;
        chain->run_span = span_key;
        chain->run_start = chain->count;
        chain->runs++;
    }
    cm_link_relink(object, chain->top);
    chain->top = object;
    chain->count++;
}

/* A plain chain's ahead links (internal.h, "ahead links"), written by walking it once: its
 * objects are the poster's own latest frees, still in its cache. */
static void set_ahead_links(void *top)
{
    void *behind[CM_POST_AHEAD] = {NULL}; /* the last CM_POST_AHEAD objects walked, by index */
    unsigned walked = 0;
    for (void *object = top; object != NULL; object = cm_link_next(object), walked++) {
        void **slot = &behind[walked % CM_POST_AHEAD];
        if (*slot != NULL)
            cm_ahead_set(*slot, object);
        *slot = object;
    }
    for (unsigned i = 0; i < CM_POST_AHEAD; i++) /* the last ones: nothing further down */
        if (behind[i] != NULL)
            cm_ahead_set(behind[i], NULL);
}

/* Posts the chain (of marked objects of size_class) to slot's owner; false when the slot has
 * no owner, its mailbox is over its bound or its word would hold more than most objects: the
 * caller keeps the chain, a list from top whose bottom_last's link it sets. A plain chain, or
 * any chain onto a plain word, leaves the word plain. */
bool cm_remote_post(unsigned slot, unsigned size_class, cm_remote_chain *chain, uint32_t most)
{
    CM_ASSERT(most <= CM_REMOTE_COUNT_MOST && chain->count > 0);
    mailbox *box = &boxes[slot];
    if (atomic_load_explicit(&box->bytes, memory_order_relaxed) > (int64_t)CM_REMOTE_MAILBOX_BYTES)
        return false;
    if (!chain->plain)
        finish_run(chain, size_class);
    else if (cm_class_has_run_headers(size_class))
        set_ahead_links(chain->top);
    const uint64_t plain = chain->plain ? WORD_PLAIN : 0;
    _Atomic uint64_t *word = &box->words[size_class];
    uint64_t seen = atomic_load_explicit(word, memory_order_relaxed);
    do {
        if (!(seen & WORD_OPEN) || word_count(seen) + chain->count > most)
            return false;
        cm_link_relink(chain->bottom_last, word_top(seen));
        if (!chain->plain && cm_class_has_run_headers(size_class))
            cm_run_set_next(chain->bottom_head, word_top(seen));
    } while (!atomic_compare_exchange_weak_explicit(
        word, &seen,
        word_of(chain->top, word_count(seen) + chain->count, WORD_OPEN) | plain |
            (seen & WORD_PLAIN),
        memory_order_release, memory_order_relaxed));
    atomic_fetch_add_explicit(&box->bytes, (int64_t)(chain->count * cm_classes[size_class].size),
                              memory_order_relaxed);
    return true;
}

/* The first class from `from` on whose word in slot's mailbox holds objects, else
 * cm_class_count: a thread's exit visits the words that hold something, not a call for each
 * of the classes (97 calls were 3K of a thread's 98K instructions in `valgrind
 * --tool=callgrind --trace-children=yes env LD_PRELOAD=build/libcmalloc.so
 * build/bench/churn_bench --objects 256 --max-size 4096 --threads 1`, built without rdtscp,
 * which valgrind lacks). A post after the scan passed its word is the taker's to find later,
 * as after a take. */
unsigned cm_remote_next_posted(unsigned slot, unsigned from)
{
    const mailbox *box = &boxes[slot];
    for (unsigned size_class = from; size_class < cm_class_count; size_class++)
        if (word_count(atomic_load_explicit(&box->words[size_class], memory_order_relaxed)) != 0)
            return size_class;
    return cm_class_count;
}

/* Everything posted to slot for size_class, as a NULL-terminated list of *count objects (NULL
 * and 0 when there is none); *plain: whether a plain post is among them (then the list has no
 * run headers to read). Only the slot's owner may take, or once closed, its closer. */
void *cm_remote_take(unsigned slot, unsigned size_class, uint32_t *count, bool *plain)
{
    mailbox *box = &boxes[slot];
    _Atomic uint64_t *word = &box->words[size_class];
    uint64_t seen = atomic_load_explicit(word, memory_order_relaxed);
    *count = 0;
    *plain = false;
    if (word_count(seen) == 0)
        return NULL;
    while (!atomic_compare_exchange_weak_explicit(word, &seen, seen & WORD_OPEN,
                                                  memory_order_acquire, memory_order_relaxed))
        ;
    *count = word_count(seen);
    *plain = (seen & WORD_PLAIN) != 0;
    atomic_fetch_sub_explicit(&box->bytes, (int64_t)(*count * cm_classes[size_class].size),
                              memory_order_relaxed);
    return word_top(seen);
}

/* The owner is gone (thread exit, an orphan's sweep): every word refuses posts from now on and
 * keeps what it holds, for the caller to take; cm_remote_release then frees the slot. */
void cm_remote_close(unsigned slot)
{
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++)
        atomic_fetch_and_explicit(&boxes[slot].words[size_class], ~WORD_OPEN, memory_order_acq_rel);
}

/* A closed slot whose words were all taken waits for cm_remote_open(slot) alone. */
void cm_remote_park(unsigned slot)
{
    atomic_store_explicit(&boxes[slot].state, SLOT_PARKED, memory_order_release);
}

/* A closed slot whose words were all taken (or a parked one) may be opened again by anyone. */
void cm_remote_release(unsigned slot)
{
    atomic_store_explicit(&boxes[slot].state, SLOT_FREE, memory_order_release);
}

/* Bytes waiting in every mailbox, for the stats (a bound: see mailbox.bytes). */
size_t cm_remote_bytes(void)
{
    int64_t bytes = 0;
    unsigned touched = atomic_load_explicit(&slots_touched, memory_order_relaxed);
    for (unsigned slot = 1; slot < touched; slot++)
        bytes += atomic_load_explicit(&boxes[slot].bytes, memory_order_relaxed);
    return bytes > 0 ? (size_t)bytes : 0;
}

/* In a forked child: the slot of a thread that did not survive closes for good, its objects
 * kept whole (another thread may have freed one just before the fork, which glibc's child
 * frees again: thread_cache.c's cm_thread_cache_take_left_behind). */
void cm_remote_leave_behind(unsigned slot)
{
    cm_remote_close(slot);
    atomic_store_explicit(&boxes[slot].state, SLOT_LEFT, memory_order_relaxed);
}

/* forking: the forking thread's slot, in the child. */
void cm_remote_fork_child(unsigned forking)
{
    forked_slot = forking;
}

/* Takes object out of word's stack, which no one else changes meanwhile; keeps open as it is. */
static bool unlink_from(_Atomic uint64_t *word, void *object, unsigned size_class)
{
    uint64_t seen = atomic_load_explicit(word, memory_order_acquire);
    void *top = word_top(seen);
    if (!cm_list_unlink(&top, object, word_count(seen), size_class))
        return false;
    atomic_store_explicit(word,
                          word_of(top, word_count(seen) - 1, seen & WORD_OPEN) |
                              (seen & WORD_PLAIN),
                          memory_order_release);
    return true;
}

/* In a forked child, a free of an object of size_class carrying the free mark: true (the
 * object taken out) when it sits in a left-behind mailbox, or in the forking thread's own (own:
 * the caller's slot) where another thread had posted it before the fork. The caller holds the
 * thread caches' registry lock. */
bool cm_remote_take_left_behind(void *object, unsigned size_class, unsigned own)
{
    unsigned touched = atomic_load_explicit(&slots_touched, memory_order_relaxed);
    for (unsigned slot = 1; slot < touched; slot++)
        if (atomic_load_explicit(&boxes[slot].state, memory_order_relaxed) == SLOT_LEFT &&
            unlink_from(&boxes[slot].words[size_class], object, size_class))
            return true;
    if (own == 0 || own != forked_slot)
        return false;
    /* Only the owner takes: out, search, and what is left posted back (in runs again: the
     * unlink may have cut one), or, over the mailbox's bound, to the central cache. */
    uint32_t count;
    bool plain; /* unused: what is left is cut into runs again below */
    void *list = cm_remote_take(own, size_class, &count, &plain);
    bool found = cm_list_unlink(&list, object, count, size_class);
    cm_remote_chain chain = {0};
    for (void *next; list != NULL; list = next) {
        next = cm_link_next_checked(list);
        cm_remote_chain_add(&chain, size_class, list, cm_pagemap_span_page(list));
    }
    if (chain.count > 0 && !cm_remote_post(own, size_class, &chain, CM_REMOTE_COUNT_MOST)) {
        cm_link_relink(chain.bottom_last, NULL);
        cm_central_flush(size_class, chain.top, chain.count);
    }
    return found;
}

/* Whether the runs of a mailbox's stack of count objects of size_class hold CM_RUN_LONG objects
 * or more on average, judged by the headers of its first CM_RUN_SAMPLE runs: a stack of short
 * runs (frees in no order) has a header every object or two, each a line another core wrote
 * last, and walking them all was 8% of the order book pipeline's samples (`perf record -e
 * cpu-clock build/orderbook replay ORDERS --pipeline`, 500,000 messages). False when a header
 * leads out of the class's spans (cm_central_take_runs checks the rest). */
bool cm_remote_runs_long(unsigned size_class, void *list, uint32_t count)
{
    uint32_t runs = 0, seen = 0;
    for (void *run = list; run != NULL && seen < count && runs < CM_RUN_SAMPLE; runs++) {
        if (cm_pagemap_class_of(run) != size_class)
            return false;
        uint32_t n;
        void *last;
        run = cm_run_header(run, &n, &last);
        seen += n > 0 ? n : 1;
    }
    return seen >= CM_RUN_LONG * runs;
}

/* True when the runs of a valid list of count objects of size_class have headers that add
 * up: each names its last object, in its head's span, and the next run's head. */
static bool runs_valid(unsigned size_class, void *list, uint32_t count)
{
    if (!cm_class_has_run_headers(size_class))
        return true;
    uint32_t seen = 0;
    for (void *run = list; run != NULL;) {
        uint32_t n;
        void *last, *next = cm_run_header(run, &n, &last), *object = run;
        for (uint32_t i = 1; i < n && object != NULL; i++)
            object = cm_link_next(object);
        if (n == 0 || n > count - seen || object != last || cm_link_next(last) != next ||
            cm_pagemap_span_page(last) != cm_pagemap_span_page(run))
            return false;
        seen += n;
        run = next;
    }
    return seen == count;
}

/* Checks the caller's own mailbox (own: its slot): open, every word open, its stack its count
 * of free objects of its class in runs whose headers add up. Only the owner takes, so the
 * stacks below the tops read here stay as they are while they are walked. */
bool cm_remote_valid(unsigned own)
{
    if (own == 0)
        return true;
    mailbox *box = &boxes[own];
    if (atomic_load_explicit(&box->state, memory_order_relaxed) != SLOT_OPEN)
        return false;
    for (unsigned size_class = 1; size_class < cm_class_count; size_class++) {
        uint64_t word = atomic_load_explicit(&box->words[size_class], memory_order_acquire);
        if (!(word & WORD_OPEN) ||
            !cm_object_list_valid(size_class, word_top(word), word_count(word)) ||
            (!(word & WORD_PLAIN) && !runs_valid(size_class, word_top(word), word_count(word))))
            return false;
    }
    return true;
}
