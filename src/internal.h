/* internal.h - cross-file prototypes, grouped by the file that defines them, in layer order.
 * The two fast paths (cm_alloc, cm_free) are in fastpath.h, which only the entry points
 * include (api.c, whose slow paths they call, does not).
 *
 * Lock order (outer first); fork handlers take them in this order too, after glibc's stdio
 * list lock (os.c):
 *   pools -> a THREAD_SAFE pool -> thread-cache registry -> parked slots
 *   -> central cache[1..n] -> page heap
 *   -> span structs -> pagemap -> metadata
 * check.c's quarantine lock is never held while taking another; fork takes it before the
 * registry.
 * prof.c's and guard.c's locks are taken alone too; fork takes them after the pools' locks.
 * init.c's fork-hook lock is taken alone (adding a hook), and by fork first (init.c).
 */
#ifndef CM_INTERNAL_H
#define CM_INTERNAL_H

/* The two bottom layers have headers of their own, which their files include alone: error.c's
 * callers include its header through this one, and so do the inline list functions below that
 * call it, so error.c and os.c must not include this file back. */
#include "os.h"
#include "error.h"
#include <stdbool.h>

/* Everything declared here is internal to the library: hidden, so references are direct
 * (PC-relative) rather than through the GOT. Exported entry points say CM_EXPORT. */
#pragma GCC visibility push(hidden)

/* The library's work at exit, as destructor priorities: a larger one runs first (and every
 * prioritized one after the unprioritized destructors of the same program or library), so the
 * order is the same whatever order the objects were linked in, shared or static. The profile
 * is written before the stats report, which names its file. */
#define CM_EXIT_PROFILE 103 /* prof.c: the profile at exit, then the leak report */
#define CM_EXIT_STATS   102 /* stats.c: the stats report */
#define CM_EXIT_CHECK   101 /* check.c: the last check of the quarantine */

/* options.c */
typedef struct cm_option_values {
    size_t mmap_threshold;     /* larger requests go straight to mmap */
    size_t mmap_threshold_max; /* how far frees of mapped blocks may raise the threshold */
    size_t thread_cache_max;   /* budget of one thread's cache */
    size_t thread_cache_total; /* budget of all thread caches together */
    int64_t release_delay_ms;  /* free spans idle this long go back to the OS; -1 never */
    bool background_release;   /* a helper thread releases idle spans with no allocator call */
    size_t stats_at_exit;      /* at exit: 0 nothing, 1 the stats report, CM_STATS_JSON JSON */
    const char *stats_file;    /* where that report goes (%p, %e expanded), or NULL: stderr */
    bool check;                /* debug mode: canaries, fill patterns, quarantine (check.c) */
    bool verbose;              /* print the options in force at start */
    bool prof;                 /* sampling heap profiler on (prof.c) */
    size_t prof_rate;          /* mean bytes allocated between two samples */
    bool prof_leaks;           /* print the live samples by stack at exit */
    const char *prof_dump;     /* path for the profile written at exit, or NULL */
    const char *prof_signal;   /* signal name or number that asks for a profile, or NULL */
    size_t guard_rate;         /* one small allocation in this many is guarded (guard.c); 0 off */
    size_t guard_slots;        /* guarded allocations live or quarantined at once, at most */
    bool guard_markers;        /* kernel guard markers (Linux 6.13+): slots opened in runs */
} cm_option_values;
#define CM_STATS_JSON 2 /* CMALLOC_STATS=json */
extern cm_option_values cm_option;
void cm_options_init(char **environment);
void cm_options_announce(void);
void cm_options_print(int fd);
/* Option number index (0, 1, ... until false): its upper-case name, value, and keyword when
 * the value is the option's keyword value (else NULL); a text option's text is its keyword. */
bool cm_option_at(unsigned index, const char **name, int64_t *value, const char **keyword);
/* How often the caches look for what has been idle a release delay (when release is on). */
static inline uint64_t cm_release_interval_ms(void)
{
    return cm_option.release_delay_ms > CM_RELEASE_CHECK_MIN_MS
               ? (uint64_t)cm_option.release_delay_ms
               : CM_RELEASE_CHECK_MIN_MS;
}

/* metadata.c: internal memory that never comes from malloc (zeroed, never freed) */
void *cm_metadata_alloc(size_t size);
size_t cm_metadata_bytes(void);
void cm_metadata_fork(int phase);

/* size_class.c */
extern cm_class_info cm_classes[CM_CLASSES_MAX];
extern unsigned cm_class_count;
/* Request size -> class, in 16-byte steps up to CM_SMALL_STEP_MAX, in 128-byte steps above. */
typedef struct cm_class_lookup {
    uint8_t small[CM_SMALL_STEP_MAX / 16 + 1];
    uint8_t medium[CM_MAX_SMALL / 128 + 1];
} cm_class_lookup;
extern cm_class_lookup cm_class_table;
/* The table the malloc fast path reads: cm_class_table, or while sampling (prof.c) one of all
 * 0s, "not small", which sends every allocation to the slow path at no cost to the fast path. */
extern const cm_class_lookup *cm_fast_path_classes;
void cm_size_class_init(void);
/* For each alignment above CM_ALIGNMENT up to a page (row k: 2^(CM_ALIGNED_MIN_SHIFT + k)
 * bytes), the first class from each class up whose size is a multiple of it, so that all its
 * objects are aligned (spans start on page boundaries); 0 where no class is (and for class
 * 0). */
#define CM_ALIGNED_MIN_SHIFT 5 /* row 0's alignment, 32 B */
#define CM_ALIGNED_ROWS      (CM_PAGE_SHIFT - CM_ALIGNED_MIN_SHIFT + 1)
_Static_assert(((size_t)1 << CM_ALIGNED_MIN_SHIFT) == 2 * CM_ALIGNMENT,
               "row 0 of cm_aligned_classes is the first alignment above CM_ALIGNMENT");
extern uint8_t cm_aligned_classes[CM_ALIGNED_ROWS][CM_CLASSES_MAX];
/* alignment: a power of two from 2 * CM_ALIGNMENT to CM_PAGE_SIZE. */
static inline unsigned cm_aligned_class(size_t alignment, size_t size_class)
{
    return cm_aligned_classes[__builtin_ctzl(alignment) - CM_ALIGNED_MIN_SHIFT][size_class];
}
/* Whether size has a class (is at most CM_MAX_SMALL), and which in table; the smaller sizes
 * are tested first, as the malloc fast path wants. */
static inline bool cm_class_lookup_in(const cm_class_lookup *table, size_t size, size_t *size_class)
{
    if (CM_LIKELY(size <= CM_SMALL_STEP_MAX)) {
        *size_class = table->small[(size + 15) >> 4];
        return true;
    }
    if (size > CM_MAX_SMALL)
        return false;
    *size_class = table->medium[(size + 127) >> 7];
    return true;
}
static inline bool cm_small_class(size_t size, size_t *size_class)
{
    return cm_class_lookup_in(&cm_class_table, size, size_class);
}
static inline unsigned cm_size_class(size_t size) /* size <= CM_MAX_SMALL */
{
    size_t size_class = 0; /* kept when size is not small, which callers rule out */
    cm_small_class(size, &size_class);
    return (unsigned)size_class;
}

/* pagemap.c: page number -> span and size class, two levels over 48-bit addresses, lock-free
 * reads. The class byte beside each span pointer lets free find a small object's class without
 * touching the span; it sits beside the page's distance from its span's start, which free's
 * object-start test needs too, so that free reads one line of the leaf, not two. */
#define CM_PAGEMAP_LEAF_BITS    18
#define CM_PAGEMAP_LEAF_ENTRIES ((size_t)1 << CM_PAGEMAP_LEAF_BITS)
#define CM_PAGEMAP_ROOT_BITS    (CM_ADDRESS_BITS - CM_PAGE_SHIFT - CM_PAGEMAP_LEAF_BITS)
/* A leaf's entries in the kernel's pages, numbered classes first, then spans; each written
 * page is counted (pagemap.c). */
#define CM_PAGEMAP_CLASSES_PER_PAGE (CM_SYSTEM_PAGE / sizeof(cm_page_class))
#define CM_PAGEMAP_SPANS_PER_PAGE   (CM_SYSTEM_PAGE / sizeof(cm_span *))
#define CM_PAGEMAP_CLASS_PAGES      (CM_PAGEMAP_LEAF_ENTRIES / CM_PAGEMAP_CLASSES_PER_PAGE)
#define CM_PAGEMAP_ENTRY_PAGES                                                             \
    (CM_PAGEMAP_CLASS_PAGES + CM_PAGEMAP_LEAF_ENTRIES / CM_PAGEMAP_SPANS_PER_PAGE)
typedef struct cm_page_class {
    uint8_t size_class; /* the page's span's size_class, or 0 */
    uint8_t span_pages; /* SMALL: pages from the span's start */
    uint16_t owner; /* SMALL: the slot of the cache that last took objects from the span, or 0
                       (remote.c); written under the class's central lock, read racily as a
                       route */
} cm_page_class;
typedef struct cm_pagemap_leaf {
    cm_page_class classes[CM_PAGEMAP_LEAF_ENTRIES]; /* first: free indexes it with no offset */
    cm_span *spans[CM_PAGEMAP_LEAF_ENTRIES];
    /* the pages of classes and spans written since given back (a bit a page, classes first):
     * what the leaf holds resident */
    uint64_t written[CM_PAGEMAP_ENTRY_PAGES / 64];
} cm_pagemap_leaf;
extern cm_pagemap_leaf *cm_pagemap_root[1u << CM_PAGEMAP_ROOT_BITS];
/* Whether entry page number of leaf was written since it was last given back (else it holds
 * zeros); racy outside the page heap's lock, as the entries are. */
static inline bool cm_pagemap_written(const cm_pagemap_leaf *leaf, size_t number)
{
    return (__atomic_load_n(&leaf->written[number / 64], __ATOMIC_RELAXED) >> (number % 64)) & 1;
}
bool cm_pagemap_ensure(uintptr_t page, size_t pages);
void cm_pagemap_set(uintptr_t page, cm_span *span);
void cm_pagemap_set_range(uintptr_t page, size_t pages, cm_span *span);
size_t cm_pagemap_release_unused(void);
size_t cm_pagemap_bytes(void);
size_t cm_pagemap_written_pages(const cm_pagemap_leaf *leaf);
void cm_pagemap_fork(int phase);
void cm_pagemap_set_owner(const cm_span *span, unsigned owner);
/* The leaf that holds every SMALL span, while one does (pagemap.c, "the hot leaf"): its root
 * index, or CM_PAGEMAP_NO_HOT before the first SMALL span and once a second leaf holds one;
 * the leaf itself never changes once set. */
#define CM_PAGEMAP_NO_HOT (~(uintptr_t)0)
extern uintptr_t cm_pagemap_hot_index;
extern cm_pagemap_leaf *cm_pagemap_hot_leaf;
static inline cm_pagemap_leaf *cm_pagemap_leaf_of(const void *address)
{
    uintptr_t index = (uintptr_t)address >> (CM_PAGE_SHIFT + CM_PAGEMAP_LEAF_BITS);
    if (CM_LIKELY(index == __atomic_load_n(&cm_pagemap_hot_index, __ATOMIC_ACQUIRE))) {
        cm_pagemap_leaf *leaf = cm_pagemap_hot_leaf;
        if (leaf == NULL) /* never: it is set before the index that names it */
            __builtin_unreachable();
        return leaf;
    }
    if (CM_UNLIKELY((uintptr_t)address >> CM_ADDRESS_BITS))
        return NULL;
    return cm_pagemap_root[index];
}
static inline size_t cm_pagemap_index(const void *address)
{
    return ((uintptr_t)address >> CM_PAGE_SHIFT) & (CM_PAGEMAP_LEAF_ENTRIES - 1);
}
/* The first page of the SMALL span holding address, from the pagemap's class entry. */
static inline uintptr_t cm_pagemap_span_page(const void *address)
{
    return ((uintptr_t)address >> CM_PAGE_SHIFT) -
           cm_pagemap_leaf_of(address)->classes[cm_pagemap_index(address)].span_pages;
}
/* The class of the SMALL span holding address (0: none, or an address the pagemap does not
 * cover), from the pagemap alone. */
static inline unsigned cm_pagemap_class_of(const void *address)
{
    cm_pagemap_leaf *leaf = cm_pagemap_leaf_of(address);
    return leaf ? leaf->classes[cm_pagemap_index(address)].size_class : 0;
}
/* The slot that frees of the SMALL span holding address go to: a route, read racily (fills
 * rewrite it under their class's lock). */
static inline unsigned cm_pagemap_owner(const void *address)
{
    return __atomic_load_n(&cm_pagemap_leaf_of(address)->classes[cm_pagemap_index(address)].owner,
                           __ATOMIC_RELAXED);
}
static inline cm_span *cm_pagemap_lookup(const void *address)
{
    cm_pagemap_leaf *leaf = cm_pagemap_leaf_of(address);
    return leaf ? leaf->spans[cm_pagemap_index(address)] : NULL;
}
/* The span that really holds address, or NULL: rejects stale pagemap entries. */
static inline cm_span *cm_span_of(const void *address)
{
    cm_span *span = cm_pagemap_lookup(address);
    if (span && ((uintptr_t)address >> CM_PAGE_SHIFT) - span->page < span->pages &&
        span->state != CM_SPAN_DEAD)
        return span;
    return NULL;
}
static inline void *cm_span_start(const cm_span *span)
{
    return (void *)(span->page << CM_PAGE_SHIFT);
}
/* Whether a SMALL span of info's class is out whole to one holder (a run or a spare that came
 * back whole, central_cache.c): every object counted out, none given back, none left to carve,
 * on no list, so that no other thread reaches it. used and bump are read as a lock-free take
 * reads them (the class's lock writes them). */
static inline bool cm_span_out_whole(const cm_span *span, const cm_class_info *info)
{
    return __atomic_load_n(&span->used, __ATOMIC_RELAXED) == info->objects &&
           __atomic_load_n(&span->bump, __ATOMIC_RELAXED) == span->limit && !span->listed &&
           span->free_objects == NULL;
}

/* page_heap.c: spans of pages, and the span structs themselves */
cm_span *cm_span_new(void);
void cm_span_delete(cm_span *span);
cm_span *cm_page_heap_alloc(size_t pages, size_t align_pages, unsigned size_class);
cm_span *cm_page_heap_alloc_with_room(size_t pages, size_t room);
void cm_page_heap_free(cm_span *span);
void cm_page_heap_free_released(cm_span *span);
bool cm_page_heap_resize(cm_span *span, size_t pages);
size_t cm_page_heap_release(bool everything);
size_t cm_page_heap_unmap_free(void);
void cm_page_heap_set_mapped(cm_span *span);
void cm_page_heap_forget_mapped(cm_span *span);
void cm_page_heap_counters(size_t *free_bytes, size_t *released_bytes, size_t *large_bytes,
                           size_t *large_count);
bool cm_page_heap_valid(void);
void cm_page_heap_fork(int phase);

/* central_cache.c */
unsigned cm_central_fill(unsigned size_class, unsigned count, void **head, unsigned owner);
unsigned cm_central_fill_fresh(unsigned size_class, unsigned count, void **head, unsigned owner,
                               cm_fresh_run *run);
void cm_central_flush(unsigned size_class, void *head, unsigned count);
void cm_central_give_back(unsigned size_class, void *object);
void cm_central_take_runs(unsigned size_class, void *run, uint32_t count, cm_fresh_run *fresh,
                          cm_spare_spans *spares, unsigned owner);
void cm_central_take_span(char *start);
void cm_central_take_local(cm_span *span, void *object);
void cm_central_own(unsigned slot);
void cm_central_park(unsigned slot);
void cm_central_share(unsigned slot, unsigned size_class);
void cm_central_disown(unsigned slot);
void cm_central_drain(void);
void cm_central_tick(uint64_t now);
size_t cm_central_objects_out(unsigned size_class, size_t *cached_objects);
bool cm_object_list_valid(unsigned size_class, void *list, size_t expected_length);
bool cm_is_free_object_of(unsigned size_class, const void *object);
bool cm_list_unlink(void **head, void *object, size_t most, unsigned size_class);
bool cm_central_valid(void);
void cm_central_fork(int phase);

/* remote.c: the owners' mailboxes, a stack per slot and size class */
unsigned cm_remote_open(unsigned parked);
void cm_remote_chain_add(cm_remote_chain *chain, unsigned size_class, void *object,
                         uintptr_t span_key);
/* Whether chain's runs hold CM_RUN_LONG objects or more on average (a plain chain has none). */
static inline bool cm_remote_chain_runs_long(const cm_remote_chain *chain)
{
    return !chain->plain && chain->count >= (uint64_t)CM_RUN_LONG * chain->runs;
}
#define CM_REMOTE_COUNT_MOST 0x3ffffu /* the most objects a mailbox word counts (18 bits) */
bool cm_remote_post(unsigned slot, unsigned size_class, cm_remote_chain *chain, uint32_t most);
bool cm_remote_runs_long(unsigned size_class, void *list, uint32_t count);
void *cm_remote_take(unsigned slot, unsigned size_class, uint32_t *count, bool *plain);
unsigned cm_remote_next_posted(unsigned slot, unsigned from);
void cm_remote_close(unsigned slot);
bool cm_remote_slot_open(unsigned slot);
void cm_remote_park(unsigned slot);
void cm_remote_release(unsigned slot);
size_t cm_remote_bytes(void);
void cm_remote_leave_behind(unsigned slot);
void cm_remote_fork_child(unsigned forking);
bool cm_remote_take_left_behind(void *object, unsigned size_class, unsigned own);
bool cm_remote_valid(unsigned own);

/* thread_cache.c */
extern CM_THREAD_LOCAL cm_thread_cache *cm_thread_cache_current;
void *cm_thread_cache_alloc_slow(unsigned size_class);
void *cm_thread_cache_inbox_pop(cm_fresh_run *run);
void cm_thread_cache_free_slow(void *object, unsigned size_class);
void cm_thread_cache_free_local(cm_span *span, void *object);
void cm_thread_cache_free_remote(const cm_span *span, void *object, unsigned size_class);
void cm_thread_cache_flush_current(void);
size_t cm_thread_cache_bytes(size_t *caches);
size_t cm_thread_cache_objects(unsigned size_class);
bool cm_thread_cache_valid(void);
void cm_thread_cache_init(void);
void cm_thread_cache_fork(int phase);
void cm_thread_cache_fork_owner(void);
bool cm_thread_cache_take_left_behind(void *object, unsigned size_class);
/* The latest free of each thread through guard.c's and check.c's locked paths, for a forked
 * child's second free of a block another thread had just freed (see thread_cache.c). */
#define CM_LATEST_FREES 64
typedef struct cm_latest_free {
    uintptr_t thread;
    const void *block;
    bool left_behind; /* in a forked child: the note of a thread the fork left behind */
} cm_latest_free;
void cm_latest_free_note(cm_latest_free table[CM_LATEST_FREES], const void *block);
void cm_latest_free_fork_child(cm_latest_free table[CM_LATEST_FREES]);
bool cm_latest_free_take(cm_latest_free table[CM_LATEST_FREES], const void *block);

/* alloc.c: the allocator beneath the modes (routing, large and mapped spans, bad pointers) */
void *cm_alloc_unchecked(size_t size);
void *cm_alloc_for_realloc(size_t size);
void *cm_alloc_aligned_unchecked(size_t alignment, size_t size);
void cm_free_unchecked(void *p, const char *caller);
size_t cm_usable_size_unchecked(const void *p, const char *caller);
bool cm_is_object_start(const void *p);
bool cm_alloc_is_zeroed(const void *p, size_t size);
void *cm_realloc_in_place(void *p, size_t size, size_t *old_size);
size_t cm_mapped_live_bytes(size_t *count);

/* The calls a block was made by, whose free must release it (free for the malloc family, delete
 * for new, delete[] for new[]): the debug mode records it, and reports a block freed by another
 * family's call. The fast paths never read it: every block of that mode takes the slow paths. */
typedef enum cm_family { CM_BY_MALLOC, CM_BY_NEW, CM_BY_NEW_ARRAY } cm_family;

/* check.c: the CMALLOC_CHECK=1 debug mode. prof.c's stack table and printers are handed down
 * at init (stacks are ids into it; boundary: a return address inside cmalloc, the frames up to
 * and including its frame are cmalloc's). */
typedef uint32_t (*cm_stack_capture)(uintptr_t boundary);
typedef void (*cm_stack_printer)(uint32_t stack, int fd);
typedef void (*cm_caller_printer)(uintptr_t boundary, int fd);
void cm_check_init(cm_stack_capture capture, cm_stack_printer print_stack,
                   cm_caller_printer print_caller);
void *cm_check_alloc(size_t size, cm_family family);
void *cm_check_alloc_aligned(size_t alignment, size_t size, cm_family family);
bool cm_check_free(void *p, size_t size, cm_family family, const char *caller);
bool cm_check_shrink(void *p, size_t size);
bool cm_check_usable_size(const void *p, size_t *size);
size_t cm_check_quarantined_bytes(void);
void cm_check_fork(int phase);

/* guard.c: CMALLOC_GUARD_RATE, objects on their own page before a PROT_NONE guard */
#define CM_GUARD_MAX_SIZE 4096 /* larger requests are never guarded */
typedef void (*cm_context_printer)(const void *signal_context, int fd);
bool cm_guard_init(cm_stack_printer print_stack, cm_context_printer print_access);
void *cm_guard_alloc(size_t size, uint32_t stack);
bool cm_guard_owns(const void *p);
void cm_guard_free(void *p, const char *caller, uint32_t stack);
size_t cm_guard_usable_size(const void *p, const char *caller);
size_t cm_guard_bytes(size_t *live);
uint64_t cm_guard_openings(size_t *slots_per_opening);
void cm_guard_fork(int phase);

/* prof.c: the sampling heap profiler and the sampling decision for guard.c. cm_sampling is
 * set at init when either is on; the hooks in api.c test it on slow paths only. */
extern int cm_sampling;
/* Bytes each size class's allocation takes off a thread's sample_left; all 0 when sampling is
 * off. */
extern uint32_t cm_sample_charge[CM_CLASSES_MAX];
void cm_prof_init(void);
void cm_prof_start(void);
void *cm_sample_alloc(size_t size);
bool cm_sample_free(void *p, const char *caller);
bool cm_sample_realloc_moves(const void *p, size_t *old_size);
void cm_prof_stack_print(uint32_t stack, int fd);
void cm_prof_stats_print(int fd);
size_t cm_prof_stashed_pages(void);
void cm_prof_release_stash(void);
void cm_prof_fork(int phase);

/* api.c: the entry points' slow paths, where a call's mode is decided (fastpath.h calls in) */
void *cm_alloc_slow_by(size_t size, cm_family family);
void *cm_alloc_slow(size_t size); /* cm_alloc_slow_by for the malloc family */
#define CM_UNSIZED SIZE_MAX       /* the size of a free that was told none */
void cm_free_slow(void *p, size_t size, cm_family family, const char *caller);
void cm_free_list_full(void *p);
size_t cm_usable_size(const void *p, const char *caller);

/* stats.c: also cmalloc_stats_get, cmalloc_stats_print, cmalloc_release (see cmalloc.h) */
bool cm_heap_check(void);

/* stats_exit.c: the report at exit */
void cm_stats_exit_init(void);

/* background.c */
void cm_background_start(void);

/* init.c */
extern int cm_initialized;
void cm_init(void);
/* A fork handler of a file above init.c (pool.c), which init.c cannot call by name. */
typedef void (*cm_fork_hook)(int phase);
void cm_fork_hook_add(cm_fork_hook hook);
static inline bool cm_is_initialized(void) /* acquire: options and tables are visible after */
{
    return __atomic_load_n(&cm_initialized, __ATOMIC_ACQUIRE);
}

/* compound.c: the calls made of others, on the fast paths */
void *cm_alloc_aligned(size_t alignment, size_t size);
void *cm_alloc_aligned_by(size_t alignment, size_t size, cm_family family); /* new's */
void *cm_calloc(size_t count, size_t size);
void *cm_realloc(void *p, size_t size);
size_t cm_malloc_usable_size(const void *p);
void cm_free_sized(void *p, size_t alignment, size_t size, const char *caller);

/* pool.c and arena.c: also the public cmalloc_pool_* and cmalloc_arena_* (see cmalloc.h) */
struct cmalloc_pool;
bool cm_pool_valid(const struct cmalloc_pool *pool);

/* ---- free-list links and free marks --------------------------------------------------------
 * A free object's first word links it to the next one, stored as
 *     next ^ (address of the word) ^ cm_list_key          (key: random per process)
 * so a use-after-free write or an overflow into a free object cannot point the allocator at
 * an address of its choosing, and a decoded link that is not 16-byte aligned is reported as
 * corruption where the list is popped (cm_link_next_checked). Its second word is its free
 * mark, address ^ cm_free_key (another secret), written by the same cm_link_set and cleared
 * by cm_object_hand_out wherever an object goes to the program. So every small object that is
 * free, wherever it sits (a thread cache, a transfer batch, a span's list), carries the mark,
 * and free finds a double free with one compare; program data matches it only by guessing a
 * 60-bit secret (the key less its four fixed bits, below). The fast paths compare one byte of
 * the mark only (cm_object_may_be_free) and send a match to the slow path, which compares the
 * word: a byte load is served from whatever single store last wrote that byte, where a word
 * load over the program's narrower stores still in flight waits for them to reach the cache
 * (a 16-byte block written as bytes at 0 and 15 and freed at once: 114.0M -> 171.0M
 * malloc-free pairs/s, docs/PERFORMANCE.md). A free object has every byte of its mark, so a
 * byte that differs proves the object live. The byte is the mark's lowest (first in memory:
 * little-endian), whose low four bits are CM_FREE_MARK_LOW (the key's, set by init.c, over an
 * address's four zero bits): never 0, which a handed-out object's second word is. Every list
 * of objects uses these functions and nothing else. The keys and the report of a corrupted
 * list are error.c's (error.h). */
#define CM_FREE_MARK_LOW 0xb
_Static_assert(CM_FREE_MARK_LOW != 0 && CM_FREE_MARK_LOW < CM_ALIGNMENT, "a mark's low byte");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "a mark's low byte comes first");
static inline uintptr_t cm_free_mark_keyed(const void *object, uintptr_t free_key)
{
    return (uintptr_t)object ^ free_key;
}
static inline uintptr_t cm_free_mark(const void *object)
{
    return cm_free_mark_keyed(object, cm_free_key);
}
static inline bool cm_object_is_free(const void *object)
{
    return ((const uintptr_t *)object)[1] == cm_free_mark(object);
}
/* False if object is surely live (a byte of its mark differs); true if it may be free. */
static inline bool cm_object_may_be_free(const void *object, uintptr_t mark)
{
    return ((const uint8_t *)object)[sizeof(uintptr_t)] == (uint8_t)mark;
}
static inline void cm_object_hand_out(void *object)
{
    ((uintptr_t *)object)[1] = 0;
}
/* A fresh run (thread_cache.c, "fresh runs") of count objects of size from first on: the
 * never-used objects a fill cut, or a span that came back whole (central_cache.c). */
static inline void cm_fresh_run_start(cm_fresh_run *run, char *first, uint32_t count,
                                      size_t size)
{
    run->next = first;
    run->end = first + (size_t)count * size;
    run->size = (uint32_t)size;
}
/* The most whole spans of size_class a cache keeps for its next fresh runs (cm_spare_spans):
 * CM_SPARE_BYTES of them, and at least one. */
static inline uint32_t cm_spare_most(unsigned size_class)
{
    uint32_t most =
        (uint32_t)(CM_SPARE_BYTES / ((size_t)cm_classes[size_class].pages << CM_PAGE_SHIFT));
    return most > 0 ? most : 1;
}
/* The next object of a fresh run (thread_cache.c, "fresh runs"), handed out; NULL when the run
 * is empty. */
static inline void *cm_fresh_run_take(cm_fresh_run *run)
{
    char *object = run->next;
    if (object == run->end)
        return NULL;
    run->next = object + run->size;
    cm_object_hand_out(object);
    return object;
}
/* Moves an object that is on a list (so carries the mark already) to another. */
static inline uintptr_t cm_link_word(const void *object, const void *next, uintptr_t list_key)
{
    return (uintptr_t)next ^ ((uintptr_t)object ^ list_key);
}
static inline void cm_link_relink(void *object, void *next)
{
    *(uintptr_t *)object = cm_link_word(object, next, cm_list_key);
}
static inline void cm_link_set_marked(void *object, void *next, uintptr_t mark)
{
    cm_link_relink(object, next);
    ((uintptr_t *)object)[1] = mark;
}
static inline void cm_link_set(void *object, void *next)
{
    cm_link_set_marked(object, next, cm_free_mark(object));
}
/* Links count objects of size bytes from first on, each to the one before it and the first to
 * next, and marks them free: returns the last, the new list's head. The keys are read once:
 * cm_link_set in a loop reads them again after every store, which might have changed them. */
static inline void *cm_link_carved(char *first, size_t size, uint32_t count, void *next)
{
    const uintptr_t list_key = cm_list_key, free_key = cm_free_key;
    for (char *object = first, *end = first + (size_t)count * size; object != end;
         object += size) {
        ((uintptr_t *)object)[0] = cm_link_word(object, next, list_key);
        ((uintptr_t *)object)[1] = cm_free_mark_keyed(object, free_key);
        next = object;
    }
    return next;
}
static inline void *cm_link_next(const void *object)
{
    uintptr_t slot_key = (uintptr_t)object ^ cm_list_key;
    /* An empty asm keeps the compiler from reassociating the xors: this half of the key does not
     * wait on the load, so only one xor does (a malloc+free loop is bound by that latency). */
    __asm__("" : "+r"(slot_key));
    return (void *)(*(const uintptr_t *)object ^ slot_key);
}
static inline void *cm_link_next_checked(const void *object)
{
    void *next = cm_link_next(object);
    if (CM_UNLIKELY((uintptr_t)next & (CM_ALIGNMENT - 1)))
        cm_report_corrupt_list(object);
    return next;
}
/* Puts a freed object (mark: its cm_free_mark) at the head of a thread-cache list; the caller
 * has taken the room for it. */
static inline void cm_free_list_push(cm_free_list *list, void *object, uintptr_t mark)
{
    cm_link_set_marked(object, list->head, mark);
    list->head = object;
}
/* Takes the head off a thread-cache list that has one, for the program. */
static inline void *cm_free_list_pop(cm_free_list *list)
{
    void *object = list->head;
    list->head = cm_link_next_checked(object);
    cm_object_hand_out(object);
    list->room++;
    return object;
}
static inline uint32_t cm_free_list_length(const cm_free_list *list)
{
    return list->max_length - (uint32_t)list->room;
}
/* Fetches the lines holding the links of span's first CM_PREFETCH_LINES objects, all at once,
 * before a list of many of its free objects is walked or popped (a fill from its given-back
 * objects, central_cache.c; its local list taken whole, thread_cache.c). Both lists are in the
 * order the objects came back, which is random in a program that frees in random order, and
 * whoever walks or pops them reads each link from the object before: one cache miss after the
 * other, where these fetches overlap. Given-back lists, 524,288 objects of 24 B allocated, then
 * freed in random order (`LD_PRELOAD=<build> build/bench/pool_bench --count 524288 --size 24
 * --free-order random`): 16.1M objects/s with the fetch against 9.7M without (commit 4642fdc);
 * local lists, docs/PERFORMANCE.md. Loads, not prefetch instructions: a core may drop the
 * prefetches its miss buffers have no room for, and with them a pop after a local list's fill
 * still waited on memory for 16% of the objects on the AMD EPYC the benchmarks run on (24-26 ns
 * a pop on average, 7-9 ns with loads; PERFORMANCE.md, "The span's lines fetched with loads");
 * a load is never dropped, and the chase after them starts once they are in. They stop at the
 * bump pointer: the pages past it may not be resident, and every free object is below it. The
 * bump pointer moves under the class's lock, which a local list's taker does not hold: read
 * atomically, as the carving writes it; a stale value is lower, never higher (it only grows
 * while the span is SMALL). */
static inline void cm_span_prefetch_objects(const cm_span *span, const cm_class_info *info)
{
    const char *start = cm_span_start(span);
    const size_t step = info->size < CM_CACHE_LINE ? CM_CACHE_LINE : info->size;
    size_t end = (size_t)(__atomic_load_n(&span->bump, __ATOMIC_RELAXED) - start);
    if (end > CM_PREFETCH_LINES * step)
        end = CM_PREFETCH_LINES * step;
    for (size_t at = 0; at < end; at += step)
        cm_fetch_line(start + at);
}
/* Takes a held span's local list (thread_cache.c, "local lists") whole, its last object linked
 * to rest, and lets go of the span: returns the list's head (*count objects). */
static inline void *cm_span_local_detach(cm_span *span, void *rest, uint32_t *count)
{
    void *head = span->local_free;
    cm_link_relink(span->local_last, rest);
    *count = span->local_count;
    span->local_free = span->local_last = NULL;
    span->local_count = 0;
    __atomic_store_n(&span->local_holder, NULL, __ATOMIC_RELEASE);
    return head;
}

/* ---- runs ----------------------------------------------------------------------------------
 * A run is a list of free objects of one span posted together to an owner's mailbox
 * (remote.c); the runs of a mailbox are linked into one list (a run's last object links to the
 * next run's head), so the mailbox is still a plain list to whoever walks it. In classes of at
 * least CM_RUN_MIN_SIZE bytes a run's first object, its head, carries after its link and free
 * mark the run's length and last object (word 2) and the next run's head (word 3), encoded as
 * links are: the owner gives a run back to its span by reading its head only
 * (central_cache.c's cm_central_take_runs), not by walking objects another core wrote last. */
#define CM_RUN_MIN_SIZE 32
#define CM_RUN_MOST     0xffffu /* objects in a run: 16 bits of word 2 */
static inline bool cm_class_has_run_headers(unsigned size_class)
{
    return cm_classes[size_class].size >= CM_RUN_MIN_SIZE;
}
static inline void cm_run_set_next(void *head, void *next)
{
    uintptr_t *word = (uintptr_t *)head + 3;
    *word = (uintptr_t)next ^ ((uintptr_t)word ^ cm_list_key);
}
static inline void cm_run_set_header(void *head, uint32_t count, void *last, void *next)
{
    uintptr_t *word = (uintptr_t *)head + 2;
    *word = ((uintptr_t)last << 16 | count) ^ ((uintptr_t)word ^ cm_list_key);
    cm_run_set_next(head, next);
}
/* The next run's head; *count and *last get the run's length and last object, unchecked. */
static inline void *cm_run_header(const void *head, uint32_t *count, void **last)
{
    const uintptr_t *word = (const uintptr_t *)head + 2;
    uintptr_t length_last = word[0] ^ ((uintptr_t)&word[0] ^ cm_list_key);
    *count = (uint32_t)(length_last & CM_RUN_MOST);
    *last = (void *)(length_last >> 16);
    return (void *)(word[1] ^ ((uintptr_t)&word[1] ^ cm_list_key));
}

/* ---- ahead links ---------------------------------------------------------------------------
 * A plain post (remote.c) has no run headers, so in classes of CM_RUN_MIN_SIZE bytes and up
 * word 2 of each of its objects is free for another link, encoded as links are: the object
 * CM_POST_AHEAD further down the post (NULL for its last ones). Its owner takes such a mailbox
 * as its inbox (thread_cache.c, "inboxes") and each pop prefetches the object ahead: the lines
 * of objects another core freed last arrive CM_POST_AHEAD allocations before they are handed
 * out, where a list's pop waits on each one's link in turn. Only a hint: a word 2 that is not
 * an ahead link (an earlier post's run header in the same stack) prefetches some other line,
 * and nothing reads it as a pointer. */
static inline void cm_ahead_set(void *object, const void *ahead)
{
    uintptr_t *word = (uintptr_t *)object + 2;
    *word = (uintptr_t)ahead ^ ((uintptr_t)word ^ cm_list_key);
}
static inline const void *cm_ahead_of(const void *object)
{
    const uintptr_t *word = (const uintptr_t *)object + 2;
    return (const void *)(*word ^ ((uintptr_t)word ^ cm_list_key));
}

#pragma GCC visibility pop

#endif /* CM_INTERNAL_H */
