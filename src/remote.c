/* remote.c - the owner middle end's mailboxes (MIDDLE=owner): where a free of another thread's
 * object goes, with no lock.
 *
 * Every live thread cache holds a slot, a number from 1 to CM_REMOTE_SLOTS - 1 (0: none, when
 * all are taken). The central cache writes the filling cache's slot into the pagemap's owner
 * field of every span it carves objects from (the span's owner is the cache that last took
 * objects from it). A free is pushed on the freeing thread's own list as ever; when that list
 * gives objects back (thread_cache.c's send_home), those of spans another live cache owns go
 * onto the freeing thread's outgoing batch for that owner, and a batch big enough is posted
 * here with one compare-and-swap. The owner takes its whole mailbox with one exchange on its
 * allocation miss, before it asks the central cache.
 * Ownership is a route, not an account: objects in batches and mailboxes count as out of their
 * spans (span->used) as objects in thread caches do, so any cache may take any of them and a
 * stale route (a slot reused by a new thread, a span refilled by another) costs nothing but a
 * detour.
 *
 * A mailbox's head is NULL (open, empty), the top object of a stack of posted batches (open),
 * or CLOSED (no owner: posters keep their batch and free it the central way). A slot is FREE
 * (head CLOSED, may be opened), OPEN (a live cache's), or LEFT (a forked child's slot of a
 * thread that did not survive the fork: closed for good, its objects kept whole on left, never
 * reused, for cm_remote_take_left_behind).
 * Invariants: every object in a mailbox or on left carries the free mark and counts as used in
 * its span; bytes is at most CM_REMOTE_MAILBOX_BYTES plus one batch (posts above it are
 * refused), so an owner that stops allocating strands a bounded amount; only the owner takes,
 * so a take and the pushes need no ABA guard (pushes only add on top).
 * No lock: slots are claimed with a compare-and-swap of their state.
 */
#include "internal.h"

#include <stdatomic.h>

enum { SLOT_FREE = 0, SLOT_OPEN, SLOT_LEFT };

typedef struct mailbox {
    _Atomic(void *) head;
    _Atomic size_t bytes; /* posted since the owner's last take (a bound, not an exact count) */
    _Atomic uint8_t state;
    void *left; /* SLOT_LEFT: what the mailbox held at the fork */
} __attribute__((aligned(CM_FALSE_SHARING))) mailbox;

static char closed_mark;
#define CLOSED ((void *)&closed_mark)

static mailbox boxes[CM_REMOTE_SLOTS] = {[0 ... CM_REMOTE_SLOTS - 1] = {.head = CLOSED}};
static _Atomic unsigned next_try = 1; /* where the next claim starts looking */
static unsigned forked_slot;          /* a forked child's: the forking thread's slot */

unsigned cm_remote_open(void)
{
    unsigned start = atomic_load_explicit(&next_try, memory_order_relaxed);
    for (unsigned i = 0; i < CM_REMOTE_SLOTS - 1; i++) {
        unsigned slot = 1 + (start - 1 + i) % (CM_REMOTE_SLOTS - 1);
        uint8_t expected = SLOT_FREE;
        if (atomic_compare_exchange_strong(&boxes[slot].state, &expected, SLOT_OPEN)) {
            atomic_store_explicit(&boxes[slot].bytes, 0, memory_order_relaxed);
            atomic_store_explicit(&boxes[slot].head, NULL, memory_order_release);
            atomic_store_explicit(&next_try, slot + 1 < CM_REMOTE_SLOTS ? slot + 1 : 1,
                                  memory_order_relaxed);
            return slot;
        }
    }
    return 0;
}

/* Whether slot has an owner now (a route to it is worth a batch). */
bool cm_remote_is_open(unsigned slot)
{
    return atomic_load_explicit(&boxes[slot].state, memory_order_relaxed) == SLOT_OPEN;
}

/* Posts the batch first..last (linked, marked, bytes in all) to slot's owner; false when the
 * slot has no owner or its mailbox is over its bound: the caller keeps the batch. */
static bool push(mailbox *box, void *first, void *last)
{
    void *top = atomic_load_explicit(&box->head, memory_order_relaxed);
    do {
        if (top == CLOSED)
            return false;
        cm_link_relink(last, top);
    } while (!atomic_compare_exchange_weak_explicit(&box->head, &top, first, memory_order_release,
                                                    memory_order_relaxed));
    return true;
}

bool cm_remote_post(unsigned slot, void *first, void *last, size_t bytes)
{
    mailbox *box = &boxes[slot];
    if (atomic_load_explicit(&box->bytes, memory_order_relaxed) > CM_REMOTE_MAILBOX_BYTES ||
        !push(box, first, last))
        return false;
    atomic_fetch_add_explicit(&box->bytes, bytes, memory_order_relaxed);
    return true;
}

/* The owner puts back what it took (its slot is open, so this cannot fail). */
static void put_back(unsigned own, void *list, void *last)
{
    if (list != NULL)
        push(&boxes[own], list, last);
}

/* The owner's take: everything posted to its open slot, as one NULL-terminated list. */
void *cm_remote_take(unsigned slot)
{
    mailbox *box = &boxes[slot];
    void *top = atomic_load_explicit(&box->head, memory_order_relaxed);
    if (top == NULL || top == CLOSED) /* closed: only a sweep that took a live cache for gone */
        return NULL;
    atomic_store_explicit(&box->bytes, 0, memory_order_relaxed);
    return atomic_exchange_explicit(&box->head, NULL, memory_order_acquire);
}

/* The owner is gone (thread exit, an orphan's sweep): later posts are refused, and what the
 * mailbox held is returned for the caller to give back. The slot may be opened again. */
void *cm_remote_close(unsigned slot)
{
    mailbox *box = &boxes[slot];
    void *list = atomic_exchange_explicit(&box->head, CLOSED, memory_order_acquire);
    atomic_store_explicit(&box->state, SLOT_FREE, memory_order_release);
    return list;
}

/* In a forked child: the slot of a thread that did not survive closes for good, its objects
 * kept whole (another thread may have freed one just before the fork, which glibc's child
 * frees again: thread_cache.c's cm_thread_cache_take_left_behind). forking: the forking
 * thread's slot. */
void cm_remote_leave_behind(unsigned slot)
{
    boxes[slot].left = atomic_exchange_explicit(&boxes[slot].head, CLOSED, memory_order_acquire);
    atomic_store_explicit(&boxes[slot].state, SLOT_LEFT, memory_order_relaxed);
}

void cm_remote_fork_child(unsigned forking)
{
    forked_slot = forking;
}

/* In a forked child, a free of an object carrying the free mark: true (the object taken out)
 * when it sits in a left-behind mailbox, or in the forking thread's own (own: the caller's
 * slot) where another thread had posted it before the fork. */
bool cm_remote_take_left_behind(void *object, unsigned own)
{
    for (unsigned slot = 1; slot < CM_REMOTE_SLOTS; slot++)
        if (atomic_load_explicit(&boxes[slot].state, memory_order_relaxed) == SLOT_LEFT &&
            cm_list_unlink(&boxes[slot].left, object, SIZE_MAX, 0))
            return true;
    if (own == 0 || own != forked_slot)
        return false;
    /* Only the owner takes: out, search, and what is left posted back. */
    void *list = cm_remote_take(own);
    bool found = cm_list_unlink(&list, object, SIZE_MAX, 0);
    void *last = list;
    for (void *next; last != NULL && (next = cm_link_next_checked(last)) != NULL;)
        last = next;
    put_back(own, list, last);
    return found;
}

/* Checks the caller's own mailbox (own: its slot): open, and every object in it a free object
 * of a SMALL span. Taken out and posted back, as only the owner may walk it. */
bool cm_remote_valid(unsigned own)
{
    if (own == 0)
        return true;
    if (atomic_load_explicit(&boxes[own].state, memory_order_relaxed) != SLOT_OPEN)
        return false;
    void *list = cm_remote_take(own), *last = NULL;
    bool ok = true;
    for (void *object = list; object != NULL && ok; object = cm_link_next(object)) {
        cm_span *span = cm_span_of(object);
        ok = span != NULL && span->state == CM_SPAN_SMALL &&
             cm_is_free_object_of(span->size_class, object);
        last = object;
    }
    if (ok)
        put_back(own, list, last);
    return ok;
}
