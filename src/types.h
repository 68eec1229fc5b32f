/* types.h - constants and the structs shared between cmalloc's layers.
 *
 * Every field says what it holds; invariants are written as equations next to the struct and
 * checked by the tests through the layer's *_valid() or counters.
 */
#ifndef CM_TYPES_H
#define CM_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "policy.h"

/* ---- sizes ------------------------------------------------------------------------------- */
#define CM_PAGE_SHIFT     13 /* pages are 8 KiB */
#define CM_PAGE_SIZE      ((size_t)1 << CM_PAGE_SHIFT)
#define CM_ALIGNMENT      16                  /* every pointer handed out */
#define CM_CACHE_LINE     64
#define CM_FALSE_SHARING  128                 /* two lines, fetched in pairs by the prefetcher */
#define CM_MAX_SMALL      ((size_t)256 << 10) /* largest size served by a size class */
#define CM_CLASSES_MAX    100                 /* table capacity; class 0 means "not small" */
#define CM_SMALL_STEP_MAX 1152                /* below this, class lookup in 16 B steps */
#define CM_HEAP_LISTS     128                 /* page heap: exact lists for 1..128 pages */
#define CM_ADDRESS_BITS   48                  /* user-space virtual addresses */
/* No user address space has room for more: larger requests fail at once. */
#define CM_REQUEST_MAX    ((size_t)1 << (CM_ADDRESS_BITS - 1))

/* ---- locks (the only lock type; see os.c for the platform side) --------------------------- */
typedef pthread_mutex_t cm_lock;
#define CM_LOCK_INIT PTHREAD_MUTEX_INITIALIZER

/* ---- size classes -------------------------------------------------------------------------- */
typedef struct cm_class_info {
    uint32_t size;              /* object size in bytes, a multiple of 16 */
    uint32_t pages;             /* pages per span */
    uint32_t objects;           /* objects per span: pages * CM_PAGE_SIZE / size */
    uint32_t batch;             /* objects per fill/flush between thread and central cache */
    uint32_t transfer_capacity; /* batches its transfer cache holds at first (central_cache.c) */
    uint32_t start_limit;       /* an offset into a span starts an object iff
                                   offset * divisor_magic < start_limit (size_class.c) */
    uint64_t divisor_magic;     /* UINT64_MAX / size + 1 */
} cm_class_info;                /* 32 bytes: indexing is a shift */
_Static_assert(sizeof(cm_class_info) == 32, "cm_class_info is indexed by a shift");

/* ---- spans ---------------------------------------------------------------------------------
 * A span is a run of whole pages. Its state says who owns it:
 *   FREE   in the page heap's free lists;          pagemap holds its first and last page
 *   SMALL  carved into objects of one size class;  pagemap holds every page
 *   LARGE  one allocation from the page heap;      pagemap holds its first and last page
 *   MAPPED one allocation straight from mmap;      pagemap holds its first page
 *   DEAD   span struct waiting for reuse
 * A pagemap entry may be stale (a page inside a span, or a dead span): a lookup is trusted only
 * when page - span->page < span->pages and the state is not DEAD.
 *
 * SMALL span invariant:  used + |free_objects| + (limit - bump) / size == objects of the class.
 * The objects on local_free, and those of a thread cache's fresh run, count as used: to the
 * central cache they are in a thread cache.
 */
enum { CM_SPAN_DEAD = 0, CM_SPAN_FREE, CM_SPAN_SMALL, CM_SPAN_LARGE, CM_SPAN_MAPPED };

typedef struct cm_span {
    /* first line: the span itself and what the central cache's fills and lists touch */
    uintptr_t page;       /* first page number: address >> CM_PAGE_SHIFT */
    size_t pages;         /* length in pages */
    struct cm_span *next; /* FREE: page heap list; SMALL: central list of spans with room */
    struct cm_span *prev;
    void *free_objects;    /* SMALL: objects given back, linked through their first word */
    char *bump;            /* SMALL: next never-used object; carving is lazy to keep RSS low */
    char *limit;           /* SMALL: end of the last whole object */
    uint8_t size_class;    /* SMALL: its class; 0 for every other state */
    uint8_t state;         /* CM_SPAN_* */
    uint8_t released;      /* FREE: pages were given back to the OS (madvise); SMALL: they
                              were when it was cut, so its pages past the bump pointer's are
                              not resident */
    uint8_t listed;        /* SMALL: on its central cache's list of spans with room */
    uint16_t listed_owner; /* SMALL, listed: the slot whose list it is on (0: the class's
                              shared list) */
    /* second line: all that a free onto the local list reads and writes */
    uint32_t used __attribute__((aligned(CM_CACHE_LINE))); /* SMALL: objects out of the span
                                                              (in caches or with the program) */
    /* SMALL: the local list, objects its holder's thread freed when its own list was full
     * (thread_cache.c, "local lists"). Only the holder touches the list and the queue links;
     * local_holder is claimed from NULL with a compare-and-swap and given back under the
     * class's central lock. */
    uint32_t local_count;                    /* objects on it */
    struct cm_thread_cache *local_holder;
    void *local_free;                        /* linked and marked as every free list */
    void *local_last;                        /* its last object: the first one pushed */
    struct cm_span *local_next, *local_prev; /* the holder's queue of the class, while listed */
    uint64_t free_since_ms;                  /* FREE: when it became free, for release by age */
} cm_span;
_Static_assert(sizeof(cm_span) == 2 * CM_CACHE_LINE, "two lines: a free reads the second only");

/* ---- thread cache -------------------------------------------------------------------------
 * One per thread. Invariants, outside a slow path: 0 <= lists[c].room <= lists[c].max_length,
 * capacity == sum over classes of lists[c].max_length * class size, published_size <= max_size
 * and capacity <= CM_CAPACITY_PER_BUDGET * max_size (thread_cache.c): the bytes a cache holds
 * are bounded with no byte count on the fast paths. local_objects[c] == the sum of local_count
 * over the spans of local_spans[c], each held by the cache.
 */
typedef struct cm_free_list {
    void *head;           /* objects linked through their first word */
    int32_t room;         /* max_length - objects on the list: the pushes left before it is full
                             (free's fast path takes one first and gives it back if there was
                             none, so it may be -1 for a moment: a signed count) */
    uint32_t max_length;  /* grows with use (slow start), a free beyond it flushes a batch */
    uint64_t start_magic; /* the class's divisor_magic and start_limit, copied here so that */
    uint64_t start_limit; /* free's object-start test reads the line it pushes to; 0 in the
                             shared empty cache, where every free then fails the test */
} cm_free_list;
_Static_assert(sizeof(cm_free_list) == 32, "the fast paths index the lists by a shift");
_Static_assert(CM_ALIGNMENT >= 2 * sizeof(uintptr_t), "a free object holds a link and a free mark");

/* Whole spans of a class that came back to their owner in a mailbox take beyond its fresh run,
 * kept for the runs after it (thread_cache.c, "fresh runs"; central_cache.c, "spans handed
 * back whole"): a stack through each span's first word (an encoded link), of at most
 * cm_spare_most(class) spans. Zeroed to start. */
typedef struct cm_spare_spans {
    char *top;      /* the newest span's start; NULL: none */
    uint32_t count; /* spans on the stack */
} cm_spare_spans;

/* What a freeing thread gathers for one owner: objects prepended one by one, cut into runs of
 * one span each (internal.h, "runs"; remote.c). Zeroed to start. A post links the oldest run, the
 * chain's bottom, to what the mailbox holds: its last object's link and its head's header. A
 * plain chain (set before its first object) is not cut into runs and carries no headers: the
 * mailbox it goes to is a list to its owner (remote.c, "plain posts"). */
typedef struct cm_remote_chain {
    void *top;          /* the newest object: the chain's first and the newest run's head */
    void *run_last;     /* the newest run's last object */
    void *run_next;     /* what run_last links to: the previous run's head, or NULL */
    uintptr_t run_span; /* the newest run's span, as a key no other span has (0: none) */
    uint32_t run_start; /* count when the newest run began: it holds count - run_start */
    uint32_t count;     /* objects in all runs */
    uint32_t runs;      /* runs, the newest included (0 in a plain chain) */
    bool plain;         /* no runs: only top, count and bottom_last are kept */
    void *bottom_head;  /* the oldest run's head, set once that run is finished */
    void *bottom_last;  /* the oldest run's last object: the first one added */
} cm_remote_chain;

/* A class's outbox (thread_cache.c, "outboxes"): frees of one owner's objects gathered as a
 * chain, posted to its mailbox once it holds most. */
typedef struct cm_outbox {
    cm_remote_chain chain; /* run_span keys runs by span address */
    uint32_t most;         /* objects it takes before it is posted (0 in a new cache) */
    uint32_t plain_posts;  /* posts to gather as plain chains before runs are measured again */
} cm_outbox;

/* What malloc takes from once a class's list is empty, before its slow path: the fresh run
 * (thread_cache.c, "fresh runs"), never-used objects a fill cut from a span's bump pointer, or
 * a span that came back whole, handed out in address order from next up to end, with no link
 * written (empty when next == end, both NULL in a new cache); then the inbox (thread_cache.c,
 * "inboxes"), a mailbox of plain posts taken whole, popped with a prefetch of the object
 * CM_POST_AHEAD further on. As long as a list: runs[c] lies at a fixed distance from
 * lists[c]. */
typedef struct cm_fresh_run {
    char *next;
    char *end;
    uint32_t size;         /* the class's, kept here: the fast path reads no class table for it */
    uint32_t inbox_count;  /* objects on the inbox */
    void *inbox;           /* linked and marked as a list; NULL: empty */
} cm_fresh_run;

typedef struct cm_thread_cache {
    cm_free_list lists[CM_CLASSES_MAX]; /* lists[0] is never used: class 0 means "not small" */
    int64_t sample_left;                /* while sampling, bytes the thread's pops may hand out
                                           before a sample point (api.c, prof.c); never below 0 */
    size_t capacity;              /* sum of max_length * class size: what the lists may hold */
    size_t max_size;              /* budget for published_size: grows from a small start, drawn
                                     from a global pool */
    size_t published_size;        /* bytes on the lists as of each list's last slow path, for
                                     stats (atomic) */
    int owner_tid;                /* kernel id of its thread, to find caches whose thread is gone */
    int owner_pid;                /* the process owner_tid is an id in: a child made without
                                     fork's handlers (clone, syscall(SYS_fork)) still has its
                                     parent's, and its caches are never taken for orphans */
    uint64_t registration;        /* its number in the registry while registered, else 0 */
    uint64_t stocked_ms;          /* while stocked (thread_cache.c): when its thread exited */
    struct cm_thread_cache *next; /* registry of live caches (stats, fork) */
    struct cm_thread_cache *prev;
    uint32_t published_length[CM_CLASSES_MAX]; /* each list's length in published_size */
    uint64_t idle_check_ms;                    /* when the slow paths next look for idle lists */
    void *idle_head[CM_CLASSES_MAX];           /* each list's head at the last look, or
                                                  LIST_MISSED (thread_cache.c) */
    uint32_t slot; /* its mailboxes (remote.c), the owner of the spans it fills from; 0: none */
    uint8_t slot_misses; /* allocation misses without a slot (thread_cache.c's
                            open_slot_on_miss); CM_SLOT_WAIT_MISSES once one was opened */
    uint16_t first_freed_owner; /* the owner of the object its thread's first call freed
                                   (0: none, or it allocated first), for open_slot_on_miss */
    uint8_t unsorted[CM_CLASSES_MAX]; /* lists given back whole to the central cache before the
                                         next is sorted by owner (thread_cache.c's send_home) */
    uint16_t own_slot; /* slot while it is nonzero, else CM_NO_OWN_SLOT, which no pagemap owner
                          is: free's test of a span's owner against it needs no test of 0 */
    uint32_t local_objects[CM_CLASSES_MAX]; /* objects on those spans' local lists */
    cm_span *local_spans[CM_CLASSES_MAX];   /* each class's queue of spans with a local list,
                                               newest first */
    size_t local_published;                 /* bytes on the local lists and in the outboxes as
                                               of each class's last slow path, for stats
                                               (atomic) */
    uint32_t local_published_objects[CM_CLASSES_MAX]; /* each class's objects in it (local lists
                                                         and outbox) */
    uint16_t outbox_slot[CM_CLASSES_MAX]; /* the owner each class's outbox collects for;
                                             CM_NO_OWN_SLOT: none */
    cm_outbox outboxes[CM_CLASSES_MAX];
    cm_spare_spans spares[CM_CLASSES_MAX]; /* each class's whole spans kept for the fresh runs
                                              after the current one (thread_cache.c) */
    cm_fresh_run runs[CM_CLASSES_MAX];
} cm_thread_cache;
_Static_assert(sizeof(cm_fresh_run) == sizeof(cm_free_list),
               "malloc finds a class's run at a fixed distance from its list");
#define CM_NO_OWN_SLOT 0xffff

#endif /* CM_TYPES_H */
