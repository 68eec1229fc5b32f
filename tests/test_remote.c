/* test_remote.c - frees of another thread's blocks: nothing is lost when the allocating thread
 * exits first or the freeing one exits with frees pending, nor in rounds of threads freeing
 * each other's blocks as they come and go, a second free of a block another thread freed is
 * reported, and the heap checks hold throughout. The blocks come back to the thread that
 * allocated them (its mailbox, not the central cache), in runs whose spans, when whole, go back
 * to the page heap on the owner's next miss (runs of a block or two become its list as they
 * are); a run header overwritten is reported; a list making room keeps what it does not send
 * home rather than hand the central cache a part batch, and lists of mostly a thread's own
 * objects are not sorted by owner; a thread's first few blocks of a class take no span for it;
 * a live thread's spans are filled by it alone, go with its slot to the next thread to start,
 * and to anyone once they have waited a release delay; and a forked child may free again what
 * another thread had freed before the fork, wherever it waits (that thread's list or the
 * forking thread's mailbox: glibc's child does, tests/programs/fork_dlopen_tls.c). A thread
 * freeing many of one owner's blocks gathers them past its full list in an outbox posted
 * whole, which a refused post sends to the central cache; frees in no order go out as plain
 * chains, which the owner takes as a list (or, past a list's cap, gives to the central cache);
 * a block in an outbox freed again is reported, and a child may free again what waits in a
 * left-behind one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "cmalloc.h"
#include "internal.h"
#include "helpers.h"

#define BLOCKS 300
#define SIZE   48

static void *blocks[BLOCKS];

static void *free_blocks(void *arg)
{
    (void)arg;
    for (int i = 0; i < BLOCKS; i++)
        free(blocks[i]);
    return NULL;
}

static void on_another_thread(void *(*body)(void *), void *arg)
{
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, body, arg), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
}

/* A thread that must outlive a fork stays: it says it is ready, then waits until it may go. */
static void ready_then_stay(_Atomic int *ready, _Atomic int *may_go)
{
    atomic_store(ready, 1);
    while (!atomic_load(may_go))
        cm_os_yield();
}

/* Starts body on a thread and waits until it says it is ready. */
static pthread_t start_until_ready(void *(*body)(void *), void *arg, _Atomic int *ready)
{
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, body, arg), 0);
    while (!atomic_load(ready))
        cm_os_yield();
    return thread;
}

/* Posts a list taken from slot's mailbox back to it, cut into runs again. */
static void post_back(unsigned slot, unsigned size_class, void *list, uint32_t count)
{
    cm_remote_chain chain = {0};
    for (void *next; list != NULL; list = next) {
        next = cm_link_next(list);
        cm_remote_chain_add(&chain, size_class, list, cm_pagemap_span_page(list));
    }
    assert_int_equal(chain.count, count);
    if (count > 0)
        assert_true(cm_remote_post(slot, size_class, &chain, CM_REMOTE_COUNT_MOST));
}

/* Objects waiting in the calling thread's mailbox for size_class, counted and put back. */
static uint32_t mailbox_count(unsigned size_class)
{
    unsigned slot = cm_thread_cache_current->slot;
    uint32_t count;
    bool plain;
    void *mail = cm_remote_take(slot, size_class, &count, &plain);
    post_back(slot, size_class, mail, count);
    return count;
}

/* Whether the calling thread's next allocation of size_class comes without a miss: from its
 * list, or from its fresh run (thread_cache.c). */
static bool serves_without_a_miss(unsigned size_class)
{
    const cm_thread_cache *cache = cm_thread_cache_current;
    return cache->lists[size_class].head != NULL ||
           cache->runs[size_class].next != cache->runs[size_class].end;
}

/* Whether it comes without a fill from the central cache: as above, or from its local lists. */
static bool serves_without_a_fill(unsigned size_class)
{
    return serves_without_a_miss(size_class) ||
           cm_thread_cache_current->local_objects[size_class] > 0;
}

/* Allocates count blocks of size with this thread's list of their class empty before and
 * after, so that the blocks come from fills and the next allocation misses; what the list
 * held and what the fills brought beyond the blocks go to keep (4096 at most): returns how
 * many, for the caller to free. */
static unsigned allocate_before_a_miss(size_t size, void **out, int count, void **keep)
{
    unsigned c = cm_size_class(size), kept = 0;
    while (serves_without_a_miss(c) && kept < 4096)
        keep[kept++] = malloc(size);
    for (int i = 0; i < count; i++)
        out[i] = malloc(size);
    while (serves_without_a_miss(c) && kept < 4096)
        keep[kept++] = malloc(size);
    return kept;
}

/* Objects of the class out of its spans beyond those in the transfer cache, once the calling
 * thread gave back all it holds: the program's blocks and other threads' caches. */
static size_t held_out(unsigned size_class)
{
    cm_thread_cache_flush_current();
    cm_central_drain();
    size_t cached, out = cm_central_objects_out(size_class, &cached);
    return out - cached;
}

/* Another thread frees this thread's blocks and exits with some of those frees still pending
 * (fewer than a batch): none is lost, and every one is in this thread's
 * mailbox when the other has exited, and this thread's next allocation takes from it. */
static void remote_frees_come_back(void **state)
{
    (void)state;
    unsigned c = cm_size_class(SIZE);
    size_t before = held_out(c);
    void *keep[4096];
    unsigned kept = allocate_before_a_miss(SIZE, blocks, BLOCKS, keep);
    on_another_thread(free_blocks, NULL);
    /* Every block is in this thread's mailbox: taken out, counted, put back. */
    unsigned slot = cm_thread_cache_current->slot, found = 0;
    assert_true(slot != 0);
    uint32_t count;
    bool plain;
    void *mail = cm_remote_take(slot, c, &count, &plain);
    assert_false(plain); /* freed in order: runs */
    for (void *p = mail; p != NULL; p = cm_link_next(p), found++) {
        bool ours = false;
        for (int j = 0; j < BLOCKS && !ours; j++)
            ours = p == blocks[j];
        if (!ours)
            fail_msg("%p in the mailbox is not one of the freed blocks", p);
    }
    assert_int_equal(found, BLOCKS);
    assert_int_equal(count, BLOCKS);
    post_back(slot, c, mail, count);
    assert_true(cm_heap_check()); /* the runs' headers add up */
    /* The next allocation's miss takes them (to their spans) before it fills. */
    size_t cached, out = cm_central_objects_out(c, &cached);
    void *first = malloc(SIZE);
    assert_int_equal(mailbox_count(c), 0);
    assert_true(cm_central_objects_out(c, &cached) < out);
    free(first);
    assert_true(cm_heap_check());
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_int_equal(held_out(c), before);
}

/* Another thread frees this thread's blocks of three classes and exits: each class's frees
 * wait in this thread's mailbox, and a flush of the thread's cache (as its exit makes) takes
 * every one of those words, the classes between them passed by. */
#define FLUSH_CLASSES 3
static const size_t flush_sizes[FLUSH_CLASSES] = {48, 256, 1024};
static void *flush_blocks[FLUSH_CLASSES][BLOCKS];

static void *free_flush_blocks(void *arg)
{
    (void)arg;
    for (int k = 0; k < FLUSH_CLASSES; k++)
        for (int i = 0; i < BLOCKS; i++)
            free(flush_blocks[k][i]);
    return NULL;
}

static void a_flush_takes_every_class_its_mailbox_holds(void **state)
{
    (void)state;
    static void *keep[FLUSH_CLASSES][4096];
    unsigned kept[FLUSH_CLASSES], c[FLUSH_CLASSES];
    size_t before[FLUSH_CLASSES];
    for (int k = 0; k < FLUSH_CLASSES; k++) {
        c[k] = cm_size_class(flush_sizes[k]);
        before[k] = held_out(c[k]);
        kept[k] = allocate_before_a_miss(flush_sizes[k], flush_blocks[k], BLOCKS, keep[k]);
    }
    on_another_thread(free_flush_blocks, NULL);
    for (int k = 0; k < FLUSH_CLASSES; k++)
        if (mailbox_count(c[k]) == 0)
            fail_msg("no block of %zu bytes came back to the mailbox", flush_sizes[k]);
    cm_thread_cache_flush_current();
    for (int k = 0; k < FLUSH_CLASSES; k++)
        assert_int_equal(mailbox_count(c[k]), 0);
    assert_true(cm_heap_check());
    for (int k = 0; k < FLUSH_CLASSES; k++) {
        for (unsigned i = 0; i < kept[k]; i++)
            free(keep[k][i]);
        assert_int_equal(held_out(c[k]), before[k]);
    }
}

/* The allocating thread exits before another frees its blocks (of several classes): its
 * mailbox is closed by then, and those frees must still reach the central cache. */
static void *allocate_blocks(void *arg)
{
    (void)arg;
    for (int i = 0; i < BLOCKS; i++)
        blocks[i] = malloc((size_t)(16 + (i % 7) * 200));
    return NULL;
}

static void owner_gone_before_the_frees(void **state)
{
    (void)state;
    size_t before[7];
    for (int k = 0; k < 7; k++)
        before[k] = held_out(cm_size_class((size_t)(16 + k * 200)));
    on_another_thread(allocate_blocks, NULL);
    for (int i = 0; i < BLOCKS; i++)
        free(blocks[i]);
    assert_true(cm_heap_check());
    for (int k = 0; k < 7; k++)
        assert_int_equal(held_out(cm_size_class((size_t)(16 + k * 200))), before[k]);
}

/* Rounds of threads, each freeing the blocks its neighbour allocated while the neighbour is
 * still allocating, or exiting, or gone (mailboxes closed and slots reused as threads come and
 * go): after every round the heap checks hold, and from the second on no more objects are out
 * of their spans than after the first (a loss would grow it). 200 rounds of 4 threads. */
#define RING        4
#define RING_EACH   1500
#define RING_ROUNDS 200
static void *ring[RING][RING_EACH];
static pthread_barrier_t ring_barrier;

static void *ring_thread(void *arg)
{
    unsigned me = (unsigned)(uintptr_t)arg, seed = me * 2654435761u + 1;
    for (int i = 0; i < RING_EACH; i++) {
        seed = seed * 1103515245u + 12345u;
        ring[me][i] = malloc(16 + (seed >> 16) % 2048);
    }
    pthread_barrier_wait(&ring_barrier);
    for (int i = 0; i < RING_EACH; i++)
        free(ring[(me + 1) % RING][i]);
    return NULL;
}

static size_t held_out_all(void)
{
    size_t total = 0;
    for (unsigned c = 1; c < cm_class_count; c++)
        total += held_out(c);
    return total;
}

static void rounds_of_threads_lose_nothing(void **state)
{
    (void)state;
    size_t before = 0; /* after the first round: glibc keeps a few blocks for thread reuse */
    for (int round = 0; round < RING_ROUNDS; round++) {
        pthread_t threads[RING];
        pthread_barrier_init(&ring_barrier, NULL, RING);
        for (uintptr_t t = 0; t < RING; t++)
            assert_int_equal(pthread_create(&threads[t], NULL, ring_thread, (void *)t), 0);
        for (int t = 0; t < RING; t++)
            pthread_join(threads[t], NULL);
        pthread_barrier_destroy(&ring_barrier);
        assert_true(cm_heap_check());
        size_t now = held_out_all();
        if (round == 0)
            before = now;
        else if (now != before)
            fail_msg("round %d: %zu objects out of their spans, %zu before", round, now, before);
    }
}

/* A second free by the thread that freed another thread's block first is reported. */
static void *free_twice(void *arg)
{
    free(arg);
    announce(arg);
    free(arg);
    return NULL;
}

static void free_remote_twice(void *arg)
{
    (void)arg;
    on_another_thread(free_twice, malloc(SIZE));
}

static void a_remote_double_free_is_reported(void **state)
{
    (void)state;
    child_spec spec = {.body = free_remote_twice};
    expect_report(&spec, "cmalloc: double free %p in free()");
}

#define MANY_SIZE 1024
#define MANY      ((int)((CM_REMOTE_MAILBOX_BYTES + CM_LIST_BYTES_MAX) / MANY_SIZE) + 1000)
static void *many[MANY];

typedef struct block_set {
    void **blocks;
    int count;
} block_set;

static void *free_block_set(void *arg)
{
    const block_set *set = arg;
    for (int i = 0; i < set->count; i++)
        free(set->blocks[i]);
    return NULL;
}

/* Allocates count blocks of size here and has another thread free them; returns how many of
 * them then wait in this thread's mailbox for their class. */
static uint32_t freed_by_another(void **blocks, int count, size_t size)
{
    for (int i = 0; i < count; i++)
        blocks[i] = malloc(size);
    block_set set = {.blocks = blocks, .count = count};
    on_another_thread(free_block_set, &set);
    return mailbox_count(cm_size_class(size));
}

/* Allocates blocks of size until a miss has taken the class's mailbox, then frees them. */
static void take_the_mailbox(void **blocks, int count, size_t size)
{
    unsigned c = cm_size_class(size);
    int taken = 0;
    while (taken < count && mailbox_count(c) > 0)
        blocks[taken++] = malloc(size);
    assert_int_equal(mailbox_count(c), 0);
    assert_true(cm_heap_check());
    while (taken > 0)
        free(blocks[--taken]);
}

/* Another thread frees far more of this thread's blocks of one class than its mailbox's bound:
 * the mailbox takes more than the list may hold but no more than its bound and one post (the
 * rest goes the central way), the owner's allocations then take it back without their list
 * growing past its cap (the runs go to their spans: the heap check holds every list to its
 * cap), and none is lost. */
static void a_mailbox_holds_no_more_than_its_bound(void **state)
{
    (void)state;
    unsigned c = cm_size_class(MANY_SIZE);
    size_t before = held_out(c);
    uint32_t waiting = freed_by_another(many, MANY, MANY_SIZE);
    printf("mailbox bound: %u of %d blocks of %d B wait in the owner's mailbox\n", waiting, MANY,
           MANY_SIZE);
    assert_true(waiting > CM_LIST_BYTES_MAX / MANY_SIZE); /* more than a list holds */
    assert_true(waiting < MANY);
    assert_true((size_t)waiting * MANY_SIZE <= CM_REMOTE_MAILBOX_BYTES + CM_LIST_BYTES_MAX);
    assert_true(cm_heap_check());
    take_the_mailbox(many, MANY, MANY_SIZE);
    assert_int_equal(held_out(c), before);
}

/* A mailbox word counts past 15 bits: of 40,000 64-byte blocks of this thread's (2.5 MiB,
 * under the mailbox's bound) freed by another thread in the order they were allocated, more
 * than 32,767 wait in its mailbox (at 15 bits the posts past that went to the central cache);
 * the owner's allocations take them back and none is lost. */
#define PAST_15_BITS 40000
static void *past_15_bits[PAST_15_BITS];

_Static_assert((size_t)PAST_15_BITS * 64 < CM_REMOTE_MAILBOX_BYTES, "they fit the bound");

static void a_mailbox_counts_past_15_bits(void **state)
{
    (void)state;
    unsigned c = cm_size_class(64);
    size_t before = held_out(c);
    uint32_t waiting = freed_by_another(past_15_bits, PAST_15_BITS, 64);
    printf("past 15 bits: %u of %d blocks wait in the owner's mailbox\n", waiting, PAST_15_BITS);
    assert_true(waiting > 0x7fff);
    assert_true(cm_heap_check());
    take_the_mailbox(past_15_bits, PAST_15_BITS, 64);
    assert_int_equal(held_out(c), before);
}

/* What others free to a class this thread no longer allocates does not wait in its mailbox
 * for ever: the idle-list check, a release delay on, gives it to the central cache. */
static void an_idle_class_mailbox_is_given_back(void **state)
{
    (void)state;
    int64_t delay = cm_option.release_delay_ms;
    cm_option.release_delay_ms = 20;
    unsigned c = cm_size_class(SIZE), other = cm_size_class(3000);
    size_t before = held_out(c);
    for (int i = 0; i < BLOCKS; i++)
        blocks[i] = malloc(SIZE);
    on_another_thread(free_blocks, NULL);
    assert_true(mailbox_count(c) > 0);
    void *held[256];
    for (int round = 0; round < 100 && mailbox_count(c) > 0; round++) {
        cm_os_sleep_ms(25);
        unsigned n = 0; /* through the other class's list to a fill, which runs the check */
        while (n < 255 && serves_without_a_fill(other))
            held[n++] = malloc(3000);
        held[n++] = malloc(3000);
        while (n > 0)
            free(held[--n]);
    }
    cm_option.release_delay_ms = delay;
    assert_int_equal(mailbox_count(c), 0);
    assert_true(cm_heap_check());
    assert_int_equal(held_out(c), before);
}

/* A thread frees the main thread's blocks and stays: some wait on its list, the rest were
 * posted to the main thread's mailbox. A child forked then frees every one of them again: its
 * first free there, as glibc's child does with what a parent thread freed; a second one is a
 * double free as ever. */
#define HANDED 600
static void *handed[HANDED];
static _Atomic int handed_over, children_done;

/* What a forked child frees again (free_again): again_count blocks from again_blocks. */
static void **again_blocks;
static uint32_t again_count;

/* In a child: frees the blocks, each for the first time there, and checks the heap; with an
 * argument, frees the first one a second time. */
static void free_again(void *arg)
{
    for (uint32_t i = 0; i < again_count; i++)
        free(again_blocks[i]);
    if (!cm_heap_check())
        _exit(5);
    if (arg != NULL)
        free(again_blocks[0]);
}

/* A child forked now frees count blocks again with no report (what: the blocks, for the
 * failure's message); with twice, another frees the first one twice and is told of a double
 * free. */
static void expect_first_frees_in_a_child(void **blocks, uint32_t count, bool twice,
                                          const char *what)
{
    again_blocks = blocks;
    again_count = count;
    static child_result result;
    child_spec spec = {.body = free_again};
    run_child(&spec, &result);
    char how[96];
    if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0)
        fail_msg("a child's free of %s: %s\n%s", what,
                 describe_status(result.status, how, sizeof how), result.output);
    if (twice) {
        char expected[96];
        snprintf(expected, sizeof expected, "cmalloc: double free %p in free()", blocks[0]);
        expect_death(free_again, "twice", expected);
    }
}

static void *free_handed_and_stay(void *arg)
{
    (void)arg;
    for (int i = 0; i < HANDED; i++)
        free(handed[i]);
    ready_then_stay(&handed_over, &children_done);
    return NULL;
}

static void a_child_may_free_again_what_another_thread_sent_home(void **state)
{
    (void)state;
    for (int i = 0; i < HANDED; i++)
        handed[i] = malloc(SIZE);
    pthread_t thread = start_until_ready(free_handed_and_stay, NULL, &handed_over);
    expect_first_frees_in_a_child(handed, HANDED, true,
                                  "blocks another thread freed before the fork");
    atomic_store(&children_done, 1);
    pthread_join(thread, NULL);
}
/* The other way round: a thread allocates blocks and stays while the main thread frees them,
 * which posts them to that thread's mailbox. A child forked then frees every one again: the
 * thread did not survive the fork, so they wait in its left-behind mailbox, and each free there
 * is the block's first in the child. */
static _Atomic int allocated, parent_done;

static void *allocate_and_stay(void *arg)
{
    (void)arg;
    for (int i = 0; i < HANDED; i++)
        handed[i] = malloc(SIZE);
    ready_then_stay(&allocated, &parent_done);
    return NULL;
}

static void a_child_may_free_again_what_waits_in_a_left_behind_mailbox(void **state)
{
    (void)state;
    atomic_store(&allocated, 0);
    pthread_t thread = start_until_ready(allocate_and_stay, NULL, &allocated);
    /* This thread's earlier lists were mostly its own: sorted by owner from the first again. */
    cm_thread_cache_current->unsorted[cm_size_class(SIZE)] = 0;
    for (int i = 0; i < HANDED; i++)
        free(handed[i]);
    cm_thread_cache_flush_current(); /* every one posted, none left on this thread's list */
    expect_first_frees_in_a_child(handed, HANDED, false,
                                  "blocks waiting in a left-behind mailbox");
    atomic_store(&parent_done, 1);
    pthread_join(thread, NULL);
}

/* Another thread frees whole spans of this thread's blocks, in the order they were carved:
 * when this thread's next miss takes its mailbox, the runs go back to their spans without a
 * walk, the first span that came back whole is handed out again from its start, as the
 * class's fresh run (no fill, no new span), the next ones kept as its spares (up to
 * cm_spare_most), and the others return to the page heap. */
#define WHOLE_SIZE 64
#define WHOLE      2048
static void *whole[WHOLE];
static void **freeing = whole; /* the blocks free_whole frees (a test may point it elsewhere) */

static void *free_whole(void *arg) /* arg: how many, from the first */
{
    for (intptr_t i = 0; i < (intptr_t)arg; i++)
        free(freeing[i]);
    return NULL;
}

static void spans_that_come_back_whole_are_handed_out_again_or_freed(void **state)
{
    (void)state;
    unsigned c = cm_size_class(WHOLE_SIZE);
    size_t span_bytes = (size_t)cm_classes[c].pages * CM_PAGE_SIZE;
    size_t before = held_out(c);
    void *keep[4096];
    unsigned kept = allocate_before_a_miss(WHOLE_SIZE, whole, WHOLE, keep);
    on_another_thread(free_whole, (void *)(intptr_t)WHOLE);
    assert_int_equal(mailbox_count(c), WHOLE);
    size_t free_before, free_after, released, large, count;
    cm_page_heap_counters(&free_before, &released, &large, &count);
    size_t released_before = released;
    void *next = malloc(WHOLE_SIZE);
    cm_page_heap_counters(&free_after, &released, &large, &count);
    size_t spans_back = (free_after + released - free_before - released_before) / span_bytes,
           spans = WHOLE * (size_t)WHOLE_SIZE / span_bytes;
    const cm_spare_spans *spares = &cm_thread_cache_current->spares[c];
    printf("whole spans: %zu of the %zu spans of %d blocks of %d B back in the page heap, %u "
           "kept as spares\n", spans_back, spans, WHOLE, WHOLE_SIZE, spares->count);
    assert_int_equal(mailbox_count(c), 0);
    /* the spares: as many as were whole beyond the run (all but the first, shared with
     * earlier blocks, and the last, which the run may share), up to the bound */
    size_t whole_beyond_run = spans - 3;
    assert_true(spares->count <= cm_spare_most(c));
    assert_true(spares->count >= (whole_beyond_run < cm_spare_most(c) ? whole_beyond_run
                                                                     : cm_spare_most(c)));
    /* the rest back in the page heap: all but the first, the run and the spares */
    assert_true(spans_back + 3 + spares->count >= spans);
    assert_true(cm_heap_check()); /* the run and the spares counted out, each a whole span */
    free(next);
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_int_equal(held_out(c), before); /* its flush gave the spares back too */
    assert_null(spares->top);
    assert_int_equal(spares->count, 0);
}

/* The spares stop at their bound, CM_SPARE_BYTES of spans: when more spans than that come back
 * whole in one take, the ones beyond it go to the page heap. */
static void the_spares_stop_at_their_bound(void **state)
{
    (void)state;
    unsigned c = cm_size_class(WHOLE_SIZE);
    const uint32_t spans = cm_spare_most(c) + 4;
    const int count = (int)(spans * cm_classes[c].objects);
    void **blocks = calloc((size_t)count, sizeof *blocks);
    assert_non_null(blocks);
    size_t before = held_out(c);
    void *keep[4096];
    unsigned kept = allocate_before_a_miss(WHOLE_SIZE, blocks, count, keep);
    freeing = blocks;
    on_another_thread(free_whole, (void *)(intptr_t)count);
    freeing = whole;
    void *next = malloc(WHOLE_SIZE); /* the miss that takes the mailbox */
    const cm_spare_spans *spares = &cm_thread_cache_current->spares[c];
    printf("spares: %u of at most %u, %u spans freed whole\n", spares->count,
           cm_spare_most(c), spans);
    assert_int_equal(spares->count, cm_spare_most(c));
    assert_true(cm_heap_check());
    free(next);
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    free(blocks);
    assert_int_equal(held_out(c), before);
    assert_int_equal(spares->count, 0);
}

/* The take itself, with an empty fresh run and no spare: another thread freed whole spans in
 * order, so its posts ended with their spans and the mailbox's runs are whole spans but for the
 * first span's (shared with earlier blocks). The first becomes the run and the next ones the
 * spares, with no lock, from their starts, still the taker's and counted out; the rest go to
 * the page heap, where without a run every whole span goes (the fill after would cut one
 * again). */
static void a_span_back_whole_becomes_the_empty_run(void **state)
{
    (void)state;
    unsigned c = cm_size_class(WHOLE_SIZE), slot = cm_thread_cache_current->slot;
    size_t before = held_out(c);
    void *keep[4096];
    unsigned kept = allocate_before_a_miss(WHOLE_SIZE, whole, WHOLE, keep);
    on_another_thread(free_whole, (void *)(intptr_t)WHOLE);
    uint32_t count;
    bool plain;
    void *mail = cm_remote_take(slot, c, &count, &plain);
    assert_int_equal(count, WHOLE);
    assert_false(plain);
    const uint32_t spans = WHOLE * WHOLE_SIZE / (cm_classes[c].pages * CM_PAGE_SIZE);
    uint32_t runs = 0, whole_runs = 0;
    for (void *head = mail; head != NULL; runs++) {
        uint32_t n;
        void *last;
        head = cm_run_header(head, &n, &last);
        whole_runs += n == cm_classes[c].objects;
    }
    printf("mailbox: %u runs, %u of them whole spans, of %u spans freed\n", runs, whole_runs,
           spans);
    assert_true(whole_runs + 2 >= spans);
    cm_fresh_run run = {0};
    cm_spare_spans spares = {0};
    cm_central_take_runs(c, mail, count, &run, &spares, slot);
    assert_true(run.next != run.end);
    assert_true(spares.count >= 1 && spares.count <= cm_spare_most(c));
    char *spare = spares.top;
    for (uint32_t i = 0; i < spares.count; i++, spare = cm_link_next(spare)) {
        assert_non_null(spare);
        assert_ptr_equal(spare, cm_span_start(cm_span_of(spare)));
        assert_true(cm_span_of(spare) != cm_span_of(run.next));
        assert_int_equal(cm_span_of(spare)->used, cm_classes[c].objects);
        assert_int_equal(cm_pagemap_owner(spare), slot);
    }
    assert_null(spare); /* the stack ends with its count */
    cm_span *span = cm_span_of(run.next);
    bool came_back = false;
    for (unsigned i = 0; i < WHOLE; i++)
        came_back |= cm_span_of(whole[i]) == span;
    assert_true(came_back);
    assert_int_equal(span->state, CM_SPAN_SMALL);
    assert_ptr_equal(run.next, cm_span_start(span));
    assert_ptr_equal(run.end, span->limit);
    assert_int_equal(run.size, WHOLE_SIZE);
    assert_int_equal(span->used, cm_classes[c].objects);
    assert_int_equal(cm_pagemap_owner(run.next), slot);
    assert_true(cm_heap_check());
    for (void *object; (object = cm_fresh_run_take(&run)) != NULL;) /* out, then freed */
        free(object);
    while ((spare = spares.top) != NULL) { /* as the cache gives its spares back */
        spares.top = cm_link_next(spare);
        cm_central_take_span(spare);
    }
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_int_equal(held_out(c), before);
}

/* Another thread frees blocks of a class whose span holds few objects (1 KiB: 8 a span), and
 * this thread's mailbox gets them back in the order they were carved (posted again by their
 * spans: long runs, whole spans; the freeing thread's lists, short at its start, had posted
 * them a few at a time). This thread's next miss makes them its list as they are, and no span
 * goes back to the page heap: given back, each span would have gone there and the fill carved
 * a fresh one every few objects (policy.h's CM_RUN_SPAN_OBJECTS). */
#define FEW_SIZE 1024
#define FEW      64

static void long_runs_of_small_spans_become_the_list(void **state)
{
    (void)state;
    unsigned c = cm_size_class(FEW_SIZE);
    assert_true(cm_classes[c].objects < CM_RUN_SPAN_OBJECTS);
    size_t before = held_out(c);
    void *keep[4096];
    unsigned kept = allocate_before_a_miss(FEW_SIZE, whole, FEW, keep);
    on_another_thread(free_whole, (void *)(intptr_t)FEW);
    unsigned slot = cm_thread_cache_current->slot;
    uint32_t count;
    bool plain;
    void *mail = cm_remote_take(slot, c, &count, &plain);
    assert_int_equal(count, FEW);
    assert_false(plain);
    assert_non_null(mail);
    cm_remote_chain chain = {0};
    for (int i = 0; i < FEW; i++)
        cm_remote_chain_add(&chain, c, whole[i], cm_pagemap_span_page(whole[i]));
    assert_true(cm_remote_post(slot, c, &chain, CM_LIST_OBJECTS_MAX));
    mail = cm_remote_take(slot, c, &count, &plain);
    assert_false(plain);
    assert_true(cm_remote_runs_long(c, mail, count));
    post_back(slot, c, mail, count);
    size_t free_before, free_after, released_before, released, large, spans;
    cm_page_heap_counters(&free_before, &released_before, &large, &spans);
    void *first = malloc(FEW_SIZE);
    cm_page_heap_counters(&free_after, &released, &large, &spans);
    assert_int_equal(free_after + released, free_before + released_before);
    assert_int_equal(mailbox_count(c), 0);
    assert_int_equal(cm_free_list_length(&cm_thread_cache_current->lists[c]), FEW - 1);
    bool freed = false;
    for (int i = 0; i < FEW && !freed; i++)
        freed = first == whole[i];
    assert_true(freed);
    assert_true(cm_heap_check());
    free(first);
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_int_equal(held_out(c), before);
}

/* Another thread frees blocks of two spans in turn, so every run it sends holds one: this
 * thread's next miss makes the mailbox its list as it is (runs that short seldom empty a
 * span, and giving them back would only have the fill walk them out again). */
static void *free_in_turn(void *arg)
{
    intptr_t half = (intptr_t)arg;
    for (intptr_t i = 0; i < half; i++) {
        free(whole[i]);
        free(whole[WHOLE / 2 + i]);
    }
    return NULL;
}

static void short_runs_become_the_list(void **state)
{
    (void)state;
    unsigned c = cm_size_class(WHOLE_SIZE);
    size_t before = held_out(c);
    void *keep[4096];
    unsigned kept = allocate_before_a_miss(WHOLE_SIZE, whole, WHOLE, keep);
    assert_true(cm_pagemap_span_page(whole[0]) != cm_pagemap_span_page(whole[WHOLE / 2]));
    on_another_thread(free_in_turn, (void *)(intptr_t)100);
    assert_int_equal(mailbox_count(c), 200);
    size_t cached, out = cm_central_objects_out(c, &cached);
    void *first = malloc(WHOLE_SIZE);
    assert_int_equal(cm_central_objects_out(c, &cached), out); /* no span touched */
    bool freed = false;
    for (int i = 0; i < 100 && !freed; i++)
        freed = first == whole[i] || first == whole[WHOLE / 2 + i];
    assert_true(freed);
    assert_true(cm_heap_check());
    free(first);
    for (int i = 100; i < WHOLE / 2; i++) {
        free(whole[i]);
        free(whole[WHOLE / 2 + i]);
    }
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_int_equal(held_out(c), before);
}

/* A fresh thread frees its own blocks and this thread's in turn: each time its list makes
 * room, this thread's half of the batch is posted here, and its own half stays on its list
 * (to leave later as a whole batch) instead of reaching the spans as a part batch. */
#define MIXED 200
static void *mixed[2 * MIXED]; /* this thread's, then the other's */
static size_t mixed_to_spans;

static void *free_mixed(void *arg)
{
    (void)arg;
    unsigned c = cm_size_class(SIZE);
    for (int i = MIXED; i < 2 * MIXED; i++)
        mixed[i] = malloc(SIZE);
    cm_central_drain(); /* the transfer cache has room for every whole batch to come */
    size_t cached, before = cm_central_objects_out(c, &cached);
    for (int i = 0; i < MIXED; i++) {
        free(mixed[i]);
        free(mixed[MIXED + i]);
    }
    mixed_to_spans = before - cm_central_objects_out(c, &cached);
    return NULL;
}

static void a_batch_half_sent_home_keeps_the_other_half(void **state)
{
    (void)state;
    unsigned c = cm_size_class(SIZE);
    size_t before = held_out(c);
    for (int i = 0; i < MIXED; i++)
        mixed[i] = malloc(SIZE);
    on_another_thread(free_mixed, NULL);
    printf("mixed frees: %zu objects went to spans, %u wait in this thread's mailbox\n",
           mixed_to_spans, mailbox_count(c));
    assert_int_equal(mixed_to_spans, 0);
    assert_true(mailbox_count(c) > 0);
    assert_true(cm_heap_check());
    assert_int_equal(held_out(c), before);
}

/* A thread whose list gave back a batch of its own objects sends the next few lists to the
 * central cache as they are, without sorting them by owner. Its list is driven to exact
 * overflows: emptied, filled with its own blocks, then one of another thread's (a full list
 * sends its own objects to their spans' local lists, so only another's overflows it: a batch
 * of its own goes back, sorted, and the countdown starts), then more of the other's until the
 * next overflow (that batch goes back unsorted: the countdown moves on). */
#define OWN_MANY 4096
static void *own_many[OWN_MANY];
static uint32_t own_room, countdown_after_own, countdown_after_next; /* for the main thread:
                                                                         cmocka asserts there */

static void *free_own_then_others(void *arg)
{
    (void)arg;
    unsigned c = cm_size_class(SIZE), batch = cm_classes[c].batch;
    for (int i = 0; i < OWN_MANY; i++)
        own_many[i] = malloc(SIZE);
    cm_thread_cache_flush_current();
    cm_thread_cache_current->unsorted[c] = 0;
    uint32_t room = own_room = (uint32_t)cm_thread_cache_current->lists[c].room, freed = 0;
    if (room < batch || room + 1 >= OWN_MANY)
        return NULL;
    while (freed < room)
        free(own_many[freed++]);
    free(mixed[0]);
    countdown_after_own = cm_thread_cache_current->unsorted[c];
    for (unsigned i = 1; i <= batch; i++)
        free(mixed[i]);
    countdown_after_next = cm_thread_cache_current->unsorted[c];
    for (int i = (int)freed; i < OWN_MANY; i++)
        free(own_many[i]);
    return NULL;
}

static void mostly_own_lists_are_not_sorted(void **state)
{
    (void)state;
    unsigned c = cm_size_class(SIZE);
    size_t before = held_out(c);
    for (unsigned i = 0; i <= cm_classes[c].batch; i++)
        mixed[i] = malloc(SIZE);
    on_another_thread(free_own_then_others, NULL);
    assert_true(own_room >= cm_classes[c].batch && own_room + 1 < OWN_MANY);
    assert_int_equal(countdown_after_own, CM_UNSORTED_LISTS);
    assert_int_equal(countdown_after_next, CM_UNSORTED_LISTS - 1);
    assert_true(cm_heap_check());
    assert_int_equal(held_out(c), before);
}

/* 64 blocks this thread allocated, freed by another thread: this thread's mailbox for their
 * class, taken (*count objects). */
static void *take_64_sent_home(uint32_t *count)
{
    for (int i = 0; i < 64; i++)
        whole[i] = malloc(WHOLE_SIZE);
    on_another_thread(free_whole, (void *)(intptr_t)64);
    bool plain;
    void *mail = cm_remote_take(cm_thread_cache_current->slot, cm_size_class(WHOLE_SIZE), count,
                                &plain);
    assert_false(plain); /* its runs have headers to corrupt */
    return mail;
}

/* A run header overwritten while the run waits (a write to freed memory): the owner's take
 * reports the list as corrupted instead of splicing objects into the wrong span. */
static void corrupt_a_run_header(void *arg)
{
    (void)arg;
    uint32_t count;
    void *mail = take_64_sent_home(&count);
    announce(mail);
    ((uintptr_t *)mail)[2] ^= (uintptr_t)1 << 20; /* the run's last object moves */
    cm_central_take_runs(cm_size_class(WHOLE_SIZE), mail, count, NULL, NULL, 0);
}

static void a_corrupted_run_header_is_reported(void **state)
{
    (void)state;
    child_spec spec = {.body = corrupt_a_run_header};
    expect_report(&spec, "cmalloc: corrupted free list at %p");
}

/* A spare's link overwritten while it waits (a write to freed memory): the next miss that
 * pops the spares reports the list as corrupted instead of handing out memory it leads to. */
static void corrupt_a_spare_link(void *arg)
{
    (void)arg;
    unsigned c = cm_size_class(WHOLE_SIZE);
    void *keep[4096];
    allocate_before_a_miss(WHOLE_SIZE, whole, WHOLE, keep);
    on_another_thread(free_whole, (void *)(intptr_t)WHOLE);
    void *next = malloc(WHOLE_SIZE); /* the take: a run and spares */
    (void)next;
    char *top = cm_thread_cache_current->spares[c].top;
    if (top == NULL || cm_thread_cache_current->spares[c].count < 2)
        _exit(3); /* nothing to corrupt: the test fails on the missing report */
    announce(top);
    cm_link_set(top, (char *)whole[WHOLE / 2] + WHOLE_SIZE); /* into a span, not its start */
    cm_thread_cache_flush_current(); /* gives the spares back, popping each */
}

static void a_corrupted_spare_link_is_reported(void **state)
{
    (void)state;
    child_spec spec = {.body = corrupt_a_spare_link};
    expect_report(&spec, "cmalloc: corrupted free list at %p");
}

/* The same with the next run's head pointed outside the heap: reported, not followed. */
static void point_a_run_header_away(void *arg)
{
    (void)arg;
    uint32_t count;
    void *mail = take_64_sent_home(&count), *away = (void *)(uintptr_t)0x10000;
    announce(away);
    cm_run_set_next(mail, away);
    cm_central_take_runs(cm_size_class(WHOLE_SIZE), mail, count, NULL, NULL, 0);
}

static void a_run_header_pointing_away_is_reported(void **state)
{
    (void)state;
    child_spec spec = {.body = point_a_run_header_away};
    expect_report(&spec, "cmalloc: corrupted free list at %p");
}
#define KEPT_MOST 512
typedef struct {
    void *blocks[KEPT_MOST];
    unsigned count;
} kept_blocks;

/* The objects of span in the calling thread's fresh run of its class (thread_cache.c): out of
 * the span until the run goes back, at the latest when the thread exits. */
static uint32_t in_own_run(const cm_span *span)
{
    const cm_fresh_run *run = &cm_thread_cache_current->runs[span->size_class];
    bool here = run->next != run->end && cm_span_of(run->next) == span;
    return here ? (uint32_t)((size_t)(run->end - run->next) / run->size) : 0;
}

/* A block of size from a span with room (or objects in the thread's fresh run) that the
 * calling thread's fills took as its own: the thread allocates blocks of the class until its
 * fills ask for enough to claim their spans (CM_CLAIM_FILL objects; the first fills of a class
 * are smaller and leave spans shared). The blocks before it go in *kept, for the caller to
 * free. */
static void *allocate_owned(size_t size, kept_blocks *kept)
{
    for (;;) {
        void *block = malloc(size);
        const cm_span *span = cm_span_of(block);
        unsigned slot = cm_thread_cache_current->slot;
        if (slot != 0 && cm_pagemap_owner(block) == slot &&
            span->used - in_own_run(span) < cm_classes[span->size_class].objects)
            return block;
        assert_true(kept->count < KEPT_MOST);
        kept->blocks[kept->count++] = block;
    }
}

static void free_kept(kept_blocks *kept)
{
    while (kept->count > 0)
        free(kept->blocks[--kept->count]);
}

#define LIGHT_SIZE 6000 /* a class no other test here allocates */
static sem_t light_allocated, light_go;
static void *light_block;

static void *allocate_one_light(void *arg)
{
    (void)arg;
    light_block = malloc(LIGHT_SIZE);
    sem_post(&light_allocated);
    sem_wait(&light_go);
    return NULL;
}

/* A thread that allocates a few blocks of a class takes no span of it for itself: a live
 * thread's first block and another's come from one span (churning threads would each hold a
 * span of every class they touch). Once its fills ask for CM_CLAIM_FILL objects, the spans
 * they take are the thread's own. */
static void a_few_blocks_take_no_span(void **state)
{
    (void)state;
    pthread_t thread;
    sem_init(&light_allocated, 0, 0);
    sem_init(&light_go, 0, 0);
    assert_int_equal(pthread_create(&thread, NULL, allocate_one_light, NULL), 0);
    sem_wait(&light_allocated);
    void *mine = malloc(LIGHT_SIZE);
    assert_ptr_equal(cm_span_of(mine), cm_span_of(light_block));
    assert_int_equal(cm_pagemap_owner(mine), 0);
    static kept_blocks kept;
    void *owned = allocate_owned(LIGHT_SIZE, &kept);
    assert_int_equal(cm_pagemap_owner(owned), cm_thread_cache_current->slot);
    assert_ptr_not_equal(cm_span_of(owned), cm_span_of(light_block));
    sem_post(&light_go);
    assert_int_equal(pthread_join(thread, NULL), 0);
    free(light_block);
    free(mine);
    free(owned);
    free_kept(&kept);
    assert_true(cm_heap_check());
}

#define OWNED_SIZE 5000 /* a class no other test here allocates */
typedef struct {
    void *block;       /* a block of OWNED_SIZE the thread allocated and left live */
    void *listed;      /* the head of its list of the class as it exited */
    unsigned slot;     /* the thread's mailbox slot */
    kept_blocks kept;  /* the blocks it allocated before (allocate_owned) */
} owned_note;

static void *allocate_one_owned(void *arg)
{
    owned_note *note = arg;
    note->block = allocate_owned(OWNED_SIZE, &note->kept);
    free(malloc(OWNED_SIZE)); /* on the list even when the last ones came from a fresh run */
    note->listed = cm_thread_cache_current->lists[cm_size_class(OWNED_SIZE)].head;
    note->slot = cm_thread_cache_current->slot;
    return NULL;
}

static void *allocate_one(void *arg)
{
    owned_note *note = arg;
    note->block = malloc(OWNED_SIZE);
    note->slot = cm_thread_cache_current->slot;
    return NULL;
}

static void *start_a_cache(void *arg)
{
    free(malloc(16));
    *(unsigned *)arg = cm_thread_cache_current->slot;
    return NULL;
}

/* The span a thread's fill took, with room left, is not another live thread's to fill from
 * (their blocks would share pages). When the thread exits, the next thread to start takes over
 * its slot and spans, and its list (a stocked cache); once parked a release delay unused, they
 * are anyone's. */
static void a_live_owners_spans_are_its_own(void **state)
{
    (void)state;
    unsigned c = cm_size_class(OWNED_SIZE);
    static kept_blocks kept;
    static owned_note theirs, next;
    void *mine = allocate_owned(OWNED_SIZE, &kept);
    unsigned late_slot = 0;
    on_another_thread(allocate_one_owned, &theirs);
    assert_ptr_not_equal(cm_span_of(theirs.block), cm_span_of(mine));
    on_another_thread(allocate_one, &next); /* starts after the first exited */
    assert_int_not_equal(theirs.slot, 0);
    assert_int_equal(next.slot, theirs.slot);
    assert_non_null(theirs.listed);
    assert_ptr_equal(next.block, theirs.listed);
    assert_true(cm_option.release_delay_ms >= 0);
    usleep((useconds_t)(cm_option.release_delay_ms + 100) * 1000);
    on_another_thread(start_a_cache, &late_slot); /* shares the parked slot out */
    assert_int_not_equal(late_slot, theirs.slot);
    void *head;
    unsigned n = cm_central_fill(c, 1, &head, 0); /* the shared list: the parked slot's span */
    assert_true(n >= 1);
    assert_ptr_equal(cm_span_of(head), cm_span_of(theirs.block));
    cm_central_flush(c, head, n);
    free(next.block);
    free(theirs.block);
    free(mine);
    free_kept(&theirs.kept);
    free_kept(&kept);
    assert_true(cm_heap_check());
}

#define TAKEOVER_SIZE 7000 /* classes no other test here allocates */
#define KEPT_SIZE     6500
typedef struct {
    void *freed_later, *kept; /* blocks of TAKEOVER_SIZE and KEPT_SIZE the thread left */
    unsigned slot;            /* the thread's mailbox slot */
    sem_t allocated, go;      /* the thread has allocated; it may exit now */
    kept_blocks before;       /* the blocks it allocated before them (allocate_owned) */
} leaving_note;

static void *allocate_and_wait(void *arg)
{
    leaving_note *l = arg;
    l->freed_later = allocate_owned(TAKEOVER_SIZE, &l->before);
    l->kept = allocate_owned(KEPT_SIZE, &l->before);
    l->slot = cm_thread_cache_current->slot;
    sem_post(&l->allocated);
    sem_wait(&l->go);
    return NULL;
}

static void start_leaving(pthread_t *thread, leaving_note *l)
{
    sem_init(&l->allocated, 0, 0);
    sem_init(&l->go, 0, 0);
    assert_int_equal(pthread_create(thread, NULL, allocate_and_wait, l), 0);
    sem_wait(&l->allocated);
}

static void leave(pthread_t thread, leaving_note *l)
{
    sem_post(&l->go);
    assert_int_equal(pthread_join(thread, NULL), 0);
}

typedef struct {
    void *inherited; /* a block an exited thread left, freed first */
    unsigned slot;   /* the slot this thread opened */
} successor_note;

static void *free_then_allocate(void *arg)
{
    successor_note *s = arg;
    free(s->inherited);
    free(malloc(16)); /* a miss in another class: the slot opens */
    s->slot = cm_thread_cache_current->slot;
    return NULL;
}

/* A new thread that frees what an exited one left takes over that thread's parked slot, not
 * the newest one parked, and its first miss leaves the slot's spans its own (a new cache's
 * empty lists are not idle lists). */
static void a_successor_takes_over_the_slot_of_what_it_frees(void **state)
{
    (void)state;
    unsigned kept_class = cm_size_class(KEPT_SIZE);
    assert_int_not_equal(kept_class, 0);
    assert_int_not_equal(kept_class, cm_size_class(TAKEOVER_SIZE));
    pthread_t first_thread, second_thread;
    static leaving_note first, second;
    start_leaving(&first_thread, &first);
    start_leaving(&second_thread, &second);
    leave(first_thread, &first);   /* parked: first's slot */
    leave(second_thread, &second); /* parked on top: second's, the newest */
    assert_int_not_equal(first.slot, 0);
    assert_int_not_equal(second.slot, first.slot);
    successor_note next = {.inherited = first.freed_later};
    on_another_thread(free_then_allocate, &next);
    assert_int_equal(next.slot, first.slot);
    void *head;
    unsigned n = cm_central_fill(kept_class, 1, &head, 0); /* the shared list, or a fresh span */
    assert_true(n >= 1);
    assert_ptr_not_equal(cm_span_of(head), cm_span_of(first.kept));
    cm_central_flush(kept_class, head, n);
    free(first.kept);
    free(second.kept);
    free(second.freed_later);
    free_kept(&first.before);
    free_kept(&second.before);
    assert_true(cm_heap_check());
}

#define BATCH_SIZE 768 /* a class no other test here allocates, its objects whole line pairs */
typedef struct {
    void *head;    /* the batch this thread gave the transfer cache */
    unsigned slot; /* its slot */
} batch_note;

/* A batch of objects carved for this thread's slot, given to the transfer cache whole. */
static void *flush_own_batch(void *arg)
{
    batch_note *note = arg;
    unsigned c = cm_size_class(BATCH_SIZE);
    free(malloc(16)); /* the slot opens */
    note->slot = cm_thread_cache_current->slot;
    void *list;
    assert_int_equal(cm_central_fill(c, cm_classes[c].batch, &list, note->slot),
                     cm_classes[c].batch);
    note->head = list;
    cm_central_flush(c, list, cm_classes[c].batch);
    return NULL;
}

/* A fill with a span of its own to take from leaves another owner's batch in the transfer
 * cache (its blocks would share pages with the filler's, and come back to their owner as
 * remote frees); a fill with no span with room takes it rather than a fresh span. */
static void another_owners_batch_waits_for_it(void **state)
{
    (void)state;
    unsigned c = cm_size_class(BATCH_SIZE), mine = cm_thread_cache_current->slot;
    assert_int_equal(cm_classes[c].size % 128, 0);
    assert_int_not_equal(mine, 0);
    void *first, *second, *theirs;
    /* a span of its own, with room (a fill of CM_CLAIM_FILL takes it as its own) */
    assert_int_equal(cm_central_fill(c, CM_CLAIM_FILL, &first, mine), CM_CLAIM_FILL);
    batch_note note = {0};
    on_another_thread(flush_own_batch, &note);
    assert_int_not_equal(note.slot, mine);
    assert_int_equal(cm_central_fill(c, 1, &second, mine), 1);
    assert_ptr_equal(cm_span_of(second), cm_span_of(first));
    cm_central_flush(c, second, 1);
    cm_central_flush(c, first, CM_CLAIM_FILL); /* its span empties: no span with room left */
    unsigned n = cm_central_fill(c, 1, &theirs, mine);
    assert_int_equal(n, cm_classes[c].batch);
    assert_ptr_equal(theirs, note.head);
    cm_central_flush(c, theirs, n);
    assert_true(cm_heap_check());
}

#define BORROW_SIZE  2304 /* a class no other test here allocates */
#define BORROW_SPANS 4
/* Before a fill carves a fresh span, it borrows a span with room from another owner: one
 * behind the head of that owner's list (never the head, which its owner fills from), and of a
 * live owner only while it keeps CM_LENDER_KEEPS more. */
static void a_fill_borrows_before_carving(void **state)
{
    (void)state;
    unsigned c = cm_size_class(BORROW_SIZE), mine = cm_thread_cache_current->slot, other = 900;
    const uint32_t objects = cm_classes[c].objects;
    assert_true(objects >= 2 && CM_LENDER_KEEPS + 2 == BORROW_SPANS);
    assert_int_not_equal(mine, 0);
    void *list, *kept = NULL, *one_of[BORROW_SPANS];
    unsigned spans = 0;
    assert_int_equal(cm_central_fill(c, BORROW_SPANS * objects, &list, mine),
                     BORROW_SPANS * objects);
    for (void *next; list != NULL; list = next) { /* one object of each span goes back */
        next = cm_link_next(list);
        if (spans == 0 || cm_span_of(list) != cm_span_of(one_of[spans - 1])) {
            assert_true(spans < BORROW_SPANS);
            one_of[spans++] = list;
        } else {
            cm_link_set(list, kept);
            kept = list;
        }
    }
    assert_int_equal(spans, BORROW_SPANS);
    for (unsigned i = 0; i < BORROW_SPANS; i++) {
        cm_link_set(one_of[i], NULL);
        cm_central_flush(c, one_of[i], 1); /* the span has room: on mine's list, newest first */
    }
    cm_central_own(other);
    void *taken, *fresh;
    /* fills that claim what they take (CM_CLAIM_FILL): the borrowed span has one object */
    assert_int_equal(cm_central_fill(c, CM_CLAIM_FILL, &taken, other), 1);
    assert_ptr_equal(taken, one_of[BORROW_SPANS - 2]); /* the span behind mine's head */
    assert_int_equal(cm_pagemap_owner(taken), other);
    /* mine keeps its head and CM_LENDER_KEEPS more: the next fill carves */
    unsigned carved = cm_central_fill(c, CM_CLAIM_FILL, &fresh, other);
    assert_true(carved >= CM_CLAIM_FILL);
    for (void *o = fresh; o != NULL; o = cm_link_next(o))
        for (unsigned i = 0; i < BORROW_SPANS; i++)
            assert_ptr_not_equal(cm_span_of(o), cm_span_of(one_of[i]));
    assert_true(cm_heap_check());
    cm_central_flush(c, taken, 1);
    cm_central_flush(c, fresh, carved);
    while (kept != NULL) {
        void *next = cm_link_next(kept);
        cm_link_set(kept, NULL);
        cm_central_flush(c, kept, 1);
        kept = next;
    }
    cm_central_disown(other);
    assert_true(cm_heap_check());
}

#define MISSED_SIZE 440 /* classes no other test here allocates */
#define LOOK_SIZE   3584
#define MISSED_MOST 4096
typedef struct {
    void *blocks[MISSED_MOST]; /* of MISSED_SIZE, allocated until the list was empty */
    unsigned count;
    bool room_left;    /* the span of the last of them had room at the look */
    void *shared_fill; /* what a shared fill of the class got while the thread lived */
    unsigned filled;
} missed_note;

static void *empty_a_list_then_look(void *arg)
{
    missed_note *m = arg;
    unsigned c = cm_size_class(MISSED_SIZE);
    void *look = malloc(LOOK_SIZE); /* the cache's first look: it only sets the clock */
    static kept_blocks before;
    m->blocks[m->count++] = allocate_owned(MISSED_SIZE, &before); /* its fills claim now */
    do /* misses and pops, from a span of this thread's with room left, to an empty list (and
          an empty fresh run, which may have taken its span's last objects: then on) */
        m->blocks[m->count++] = malloc(MISSED_SIZE);
    while ((m->count < 3 || serves_without_a_miss(c) ||
            cm_span_of(m->blocks[m->count - 1])->used >= cm_classes[c].objects) &&
           m->count < MISSED_MOST);
    m->room_left = cm_span_of(m->blocks[m->count - 1])->used < cm_classes[c].objects;
    usleep((useconds_t)(cm_release_interval_ms() + 100) * 1000);
    void *miss = malloc(LOOK_SIZE + 200); /* a miss of another class: the next look */
    m->filled = cm_central_fill(c, 1, &m->shared_fill, 0);
    free(miss);
    free(look);
    free_kept(&before);
    return NULL;
}

/* A class the thread allocates is empty at every miss; at a look a release delay after the
 * last, an empty list with misses since is in use, not idle: its spans stay the thread's, so
 * a fill from the shared list does not get one of them. */
static void a_class_in_use_is_not_idle_when_empty(void **state)
{
    (void)state;
    assert_true(cm_option.release_delay_ms >= 0);
    unsigned c = cm_size_class(MISSED_SIZE);
    static missed_note m;
    on_another_thread(empty_a_list_then_look, &m);
    assert_true(m.count >= 3 && m.count < MISSED_MOST && m.room_left);
    assert_true(m.filled >= 1);
    assert_ptr_not_equal(cm_span_of(m.shared_fill), cm_span_of(m.blocks[m.count - 1]));
    cm_central_flush(c, m.shared_fill, m.filled);
    for (unsigned i = 0; i < m.count; i++)
        free(m.blocks[i]);
    assert_true(cm_heap_check());
}

/* ---- outboxes: a consumer's frees of one owner's blocks, posted whole -------------------- */
#define OUTBOX_SIZE   64
#define OUTBOX_BLOCKS 3000
static void *outbox_blocks[OUTBOX_BLOCKS];

typedef struct {
    unsigned owner;     /* the slot the blocks' spans belong to */
    size_t size;        /* the blocks' (free_into_outbox) */
    int from, to;       /* the blocks this thread frees */
    uint32_t most_held; /* the most its outbox held at once */
    bool collecting;    /* its outbox collected for owner when it was done */
    bool valid;         /* cm_heap_check held after every hundredth free */
    bool plain_seen;    /* its outbox gathered a plain chain (remote.c, "plain posts") */
    int runs_again_at;  /* free_scattered_then_in_order: the first ordered free after which
                           the outbox gathered runs again (-1: none) */
    void **scattered;   /* free_scattered's blocks (to of them), freed in no order (and
                           free_scattered_then_in_order's, which go on past them in order) */
} outbox_note;

static void *free_into_outbox(void *arg)
{
    outbox_note *n = arg;
    unsigned c = cm_size_class(n->size);
    n->valid = true;
    for (int i = n->from; i < n->to; i++) {
        free(outbox_blocks[i]);
        uint32_t held = cm_thread_cache_current->outboxes[c].chain.count;
        n->most_held = held > n->most_held ? held : n->most_held;
        if (i % 100 == 0)
            n->valid = n->valid && cm_heap_check();
    }
    n->collecting = cm_thread_cache_current->outbox_slot[c] == n->owner;
    return NULL;
}

/* Another thread frees far more of this thread's blocks of size than its list holds: once a
 * list it gave back went to this thread's mailbox, its outbox collects for this thread and the
 * frees past its full list wait there and are posted whole. *arrived (unless NULL): how many
 * blocks reached this thread's mailbox (the freeing thread's exit posts what was left, but for
 * a list its own block heads, which its stocked cache keeps whole: send_others_home). Returns
 * the most blocks the outbox held at once. */
static uint32_t consumer_posts_its_outbox(size_t size, uint32_t *arrived)
{
    unsigned c = cm_size_class(size);
    size_t before = held_out(c);
    void *keep[4096];
    unsigned kept = allocate_before_a_miss(size, outbox_blocks, OUTBOX_BLOCKS, keep);
    outbox_note note = {.owner = cm_thread_cache_current->slot, .size = size, .to = OUTBOX_BLOCKS};
    assert_true(note.owner != 0);
    on_another_thread(free_into_outbox, &note);
    printf("outbox: at most %u of %d blocks of %zu B waited in the freeing thread's outbox\n",
           note.most_held, OUTBOX_BLOCKS, size);
    assert_true(note.valid);
    assert_true(note.collecting);
    assert_true(note.most_held > 1);
    uint32_t waiting = mailbox_count(c);
    if (arrived != NULL)
        *arrived = waiting;
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_true(cm_heap_check());
    assert_int_equal(held_out(c), before); /* every block back, once */
    return note.most_held;
}

/* 64-byte blocks: the outbox holds CM_OUTBOX_BYTES of them, or up to twice that while its
 * newest run's span goes on, and every block arrives in the owner's mailbox. */
static void a_consumer_posts_its_outbox_to_the_owner(void **state)
{
    (void)state;
    uint32_t arrived;
    uint32_t most = consumer_posts_its_outbox(OUTBOX_SIZE, &arrived);
    const uint32_t bound = CM_OUTBOX_BYTES / OUTBOX_SIZE;
    assert_true(most >= bound && most <= 2 * bound);
    assert_int_equal(arrived, OUTBOX_BLOCKS);
}

/* 1 KiB blocks, 8 to CM_OUTBOX_BYTES: the outbox holds CM_OUTBOX_OBJECTS of them before it
 * posts, so that a post's cost is shared by 16 blocks, not 8. */
#define LARGE_OUTBOX_SIZE 1024
static void an_outbox_of_1_KiB_blocks_posts_16(void **state)
{
    (void)state;
    _Static_assert(CM_OUTBOX_BYTES / LARGE_OUTBOX_SIZE < CM_OUTBOX_OBJECTS &&
                       LARGE_OUTBOX_SIZE <= CM_OUTBOX_OBJECTS_SIZE,
                   "1 KiB blocks are among those the object count stretches the outbox for");
    assert_int_equal(consumer_posts_its_outbox(LARGE_OUTBOX_SIZE, NULL), CM_OUTBOX_OBJECTS);
}

/* Another thread frees this thread's blocks in no order, each of another span than the one
 * before: the runs of its outbox's first post are short, so the next chains are plain, pushed
 * by the fast path without a run cut at every block. The mailbox says so (its owner then takes
 * it as its inbox: it has no headers), the heap checks hold throughout, and every block
 * arrives, once. */
#define SCATTER_STRIDE 1009 /* coprime with every count freed: each block once, spans apart */

static void *free_scattered(void *arg)
{
    outbox_note *n = arg;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    n->valid = true;
    for (int i = 0; i < n->to; i++) {
        free(n->scattered[(size_t)i * SCATTER_STRIDE % (size_t)n->to]);
        n->plain_seen = n->plain_seen || cm_thread_cache_current->outboxes[c].chain.plain;
        if (i % 100 == 0)
            n->valid = n->valid && cm_heap_check();
    }
    n->collecting = cm_thread_cache_current->outbox_slot[c] == n->owner;
    return NULL;
}

/* This thread's OUTBOX_BLOCKS blocks (allocate_before_a_miss: the rest to keep, how many
 * returned) freed on another thread by free_scattered, *note its account: the heap checks
 * held there, and its outbox gathered a plain chain. */
static unsigned scatter_outbox_blocks(outbox_note *note, void **keep)
{
    unsigned kept = allocate_before_a_miss(OUTBOX_SIZE, outbox_blocks, OUTBOX_BLOCKS, keep);
    *note = (outbox_note){
        .owner = cm_thread_cache_current->slot, .to = OUTBOX_BLOCKS, .scattered = outbox_blocks};
    assert_true(note->owner != 0);
    on_another_thread(free_scattered, note);
    assert_true(note->valid);
    assert_true(note->plain_seen);
    return kept;
}

static int compare_pointers(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

static void scattered_frees_go_out_as_plain_chains(void **state)
{
    (void)state;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    size_t before = held_out(c);
    void *keep[4096];
    outbox_note note;
    unsigned kept = scatter_outbox_blocks(&note, keep);
    assert_true(note.collecting);
    uint32_t count;
    bool plain;
    void *mail = cm_remote_take(note.owner, c, &count, &plain);
    assert_true(plain);
    assert_int_equal(count, OUTBOX_BLOCKS);
    static void *arrived[OUTBOX_BLOCKS], *sent[OUTBOX_BLOCKS];
    uint32_t found = 0;
    for (void *p = mail; p != NULL && found < OUTBOX_BLOCKS; p = cm_link_next(p))
        arrived[found++] = p;
    assert_int_equal(found, OUTBOX_BLOCKS);
    memcpy(sent, outbox_blocks, sizeof sent);
    qsort(arrived, OUTBOX_BLOCKS, sizeof arrived[0], compare_pointers);
    qsort(sent, OUTBOX_BLOCKS, sizeof sent[0], compare_pointers);
    assert_memory_equal(arrived, sent, sizeof sent);
    post_back(note.owner, c, mail, count);
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_true(cm_heap_check());
    assert_int_equal(held_out(c), before);
}

/* Frees in no order make an outbox's posts plain; once the frees come in order again, the
 * outbox goes on posting plain chains for CM_PLAIN_POSTS posts at most and then gathers runs
 * again (thread_cache.c, "outboxes"). */
#define REMEASURE_SCATTERED 8192 /* freed in no order first, past a list's cap (a stocked cache
                                    may bring one grown full); coprime with SCATTER_STRIDE */
#define REMEASURE_ORDERED   ((CM_PLAIN_POSTS + 2) * (int)(CM_OUTBOX_BYTES / OUTBOX_SIZE))
static void *remeasure_blocks[REMEASURE_SCATTERED + REMEASURE_ORDERED];

/* free_scattered on the first REMEASURE_SCATTERED blocks, then the rest in order. */
static void *free_scattered_then_in_order(void *arg)
{
    outbox_note *n = arg;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    n->to = REMEASURE_SCATTERED;
    free_scattered(n);
    n->runs_again_at = -1;
    for (int i = 0; i < REMEASURE_ORDERED && n->runs_again_at < 0; i++) {
        free(n->scattered[REMEASURE_SCATTERED + i]);
        /* the cache's own outbox, read after each free: before its first slow path the thread
         * has the shared empty cache */
        const cm_outbox *box = &cm_thread_cache_current->outboxes[c];
        if (box->chain.count > 0 && !box->chain.plain)
            n->runs_again_at = i;
    }
    for (int i = n->runs_again_at + 1; n->runs_again_at >= 0 && i < REMEASURE_ORDERED; i++)
        free(n->scattered[REMEASURE_SCATTERED + i]);
    n->valid = n->valid && cm_heap_check();
    n->collecting = cm_thread_cache_current->outbox_slot[c] == n->owner;
    return NULL;
}

static void an_outbox_measures_its_runs_again_after_its_plain_posts(void **state)
{
    (void)state;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    size_t before = held_out(c);
    static void *keep[4096];
    const int blocks = REMEASURE_SCATTERED + REMEASURE_ORDERED;
    unsigned kept = allocate_before_a_miss(OUTBOX_SIZE, remeasure_blocks, blocks, keep);
    outbox_note note = {.owner = cm_thread_cache_current->slot, .scattered = remeasure_blocks};
    assert_true(note.owner != 0);
    on_another_thread(free_scattered_then_in_order, &note);
    printf("plain posts: runs again after %d of %d blocks freed in order\n", note.runs_again_at,
           REMEASURE_ORDERED);
    assert_true(note.valid);
    assert_true(note.plain_seen);
    assert_true(note.collecting);
    assert_true(note.runs_again_at >= 0);
    assert_true(note.runs_again_at < (CM_PLAIN_POSTS + 1) * (int)(CM_OUTBOX_BYTES / OUTBOX_SIZE));
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_true(cm_heap_check());
    assert_int_equal(held_out(c), before);
}

/* What a list of OUTBOX_SIZE blocks holds at most (thread_cache.c's list_cap). */
static uint32_t list_cap_of_outbox_size(void)
{
    size_t by_bytes = CM_LIST_BYTES_MAX / OUTBOX_SIZE;
    return by_bytes < CM_LIST_OBJECTS_MAX ? (uint32_t)by_bytes : CM_LIST_OBJECTS_MAX;
}

/* Scattered frees of more blocks than a list holds, with the owner not allocating: the plain
 * posts stop at a list's worth in the mailbox (the rest goes to the central cache), as posts
 * of short runs do, and nothing is lost. */
#define SCATTER_MANY 5003 /* coprime with SCATTER_STRIDE */
static void *scatter_many[SCATTER_MANY];

static void a_plain_mailbox_holds_no_more_than_a_list(void **state)
{
    (void)state;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    const uint32_t cap = list_cap_of_outbox_size();
    assert_true(SCATTER_MANY > cap);
    size_t before = held_out(c);
    static void *keep[4096];
    unsigned kept = allocate_before_a_miss(OUTBOX_SIZE, scatter_many, SCATTER_MANY, keep);
    outbox_note note = {
        .owner = cm_thread_cache_current->slot, .to = SCATTER_MANY, .scattered = scatter_many};
    on_another_thread(free_scattered, &note);
    assert_true(note.plain_seen);
    assert_true(note.valid);
    uint32_t count;
    bool plain;
    void *mail = cm_remote_take(note.owner, c, &count, &plain);
    printf("scattered: %u of %d blocks waited in the owner's mailbox (a list holds %u)\n", count,
           SCATTER_MANY, cap);
    assert_true(plain);
    assert_true(count > 0 && count <= cap);
    post_back(note.owner, c, mail, count);
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_true(cm_heap_check());
    assert_int_equal(held_out(c), before);
}

/* A post of long runs may take a mailbox past what a list holds (thread_cache.c's
 * mailbox_most); onto a plain post, the stack has no headers to give the runs back by, so the
 * owner's miss gives it all to the central cache as a list, and nothing is lost. */
#define PAST_CAP_EXTRA 200

static void *free_outbox_blocks(void *arg)
{
    int count = (int)(intptr_t)arg;
    for (int i = 0; i < count; i++)
        free(outbox_blocks[i]);
    return NULL;
}

static void a_plain_stack_past_a_lists_cap_goes_to_the_central_cache(void **state)
{
    (void)state;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    const uint32_t cap = list_cap_of_outbox_size();
    const int total = (int)cap + PAST_CAP_EXTRA;
    assert_true(total <= OUTBOX_BLOCKS * 2);
    static void *many_blocks[OUTBOX_BLOCKS * 2];
    size_t before = held_out(c);
    unsigned slot = cm_thread_cache_current->slot;
    assert_true(slot != 0);
    /* total blocks of this thread's, freed by another thread and taken from the mailbox, in
     * two rounds of OUTBOX_BLOCKS at most */
    uint32_t taken = 0;
    for (int round = 0; taken < (uint32_t)total; round++) {
        int n = total - (int)taken < OUTBOX_BLOCKS ? total - (int)taken : OUTBOX_BLOCKS;
        for (int i = 0; i < n; i++)
            outbox_blocks[i] = malloc(OUTBOX_SIZE);
        on_another_thread(free_outbox_blocks, (void *)(intptr_t)n);
        uint32_t count;
        bool plain;
        for (void *p = cm_remote_take(slot, c, &count, &plain), *next; p != NULL; p = next) {
            next = cm_link_next(p);
            many_blocks[taken++] = p;
        }
        assert_true(round < 4);
    }
    assert_int_equal(taken, (uint32_t)total);
    /* a plain post of PAST_CAP_EXTRA, then one of long runs of the rest */
    cm_remote_chain plain_chain = {.plain = true}, runs = {0};
    for (int i = 0; i < PAST_CAP_EXTRA; i++)
        cm_remote_chain_add(&plain_chain, c, many_blocks[i], cm_pagemap_span_page(many_blocks[i]));
    for (int i = PAST_CAP_EXTRA; i < total; i++)
        cm_remote_chain_add(&runs, c, many_blocks[i], cm_pagemap_span_page(many_blocks[i]));
    assert_int_equal(plain_chain.runs, 0);
    assert_true(runs.runs > 0 && runs.count >= CM_RUN_LONG * runs.runs);
    assert_true(cm_remote_post(slot, c, &plain_chain, CM_REMOTE_COUNT_MOST));
    assert_true(cm_remote_post(slot, c, &runs, CM_REMOTE_COUNT_MOST));
    assert_true(cm_heap_check());
    /* this thread's next miss of the class takes the mailbox */
    static void *emptied[CM_LIST_OBJECTS_MAX];
    unsigned popped = 0;
    while (serves_without_a_miss(c) && popped < CM_LIST_OBJECTS_MAX)
        emptied[popped++] = malloc(OUTBOX_SIZE);
    size_t cached, out_before = cm_central_objects_out(c, &cached);
    void *one = malloc(OUTBOX_SIZE);
    size_t out_after = cm_central_objects_out(c, &cached);
    printf("plain stack past the cap: %zu objects out of the spans before the miss, %zu after\n",
           out_before, out_after);
    assert_true(out_after + (size_t)total - cap <= out_before); /* given back, not the list */
    uint32_t left;
    bool plain;
    assert_null(cm_remote_take(slot, c, &left, &plain));
    assert_true(cm_heap_check());
    free(one);
    for (unsigned i = 0; i < popped; i++)
        free(emptied[i]);
    assert_int_equal(held_out(c), before);
}

/* The owner exits while another thread's outbox collects for it: the next post is refused,
 * the outbox goes to the central cache and collects for nobody, and nothing is lost. */
static sem_t owner_allocated, owner_go;

static void *allocate_for_an_outbox(void *arg)
{
    unsigned *slot = arg;
    for (int i = 0; i < OUTBOX_BLOCKS; i++)
        outbox_blocks[i] = malloc(OUTBOX_SIZE);
    *slot = cm_thread_cache_current->slot;
    sem_post(&owner_allocated);
    sem_wait(&owner_go);
    return NULL;
}

static void *free_half_then_the_rest(void *arg)
{
    outbox_note *n = arg;
    n->to = OUTBOX_BLOCKS / 2;
    free_into_outbox(n);
    bool collected = n->collecting;
    sem_post(&owner_go);
    sem_wait(&owner_allocated); /* the owner has exited */
    n->from = OUTBOX_BLOCKS / 2, n->to = OUTBOX_BLOCKS;
    free_into_outbox(n);
    unsigned c = cm_size_class(OUTBOX_SIZE);
    n->collecting = collected && cm_thread_cache_current->outbox_slot[c] == CM_NO_OWN_SLOT;
    return NULL;
}

static void a_refused_outbox_goes_to_the_central_cache(void **state)
{
    (void)state;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    size_t before = held_out(c);
    sem_init(&owner_allocated, 0, 0);
    sem_init(&owner_go, 0, 0);
    outbox_note note = {.size = OUTBOX_SIZE};
    pthread_t owner, consumer;
    assert_int_equal(pthread_create(&owner, NULL, allocate_for_an_outbox, &note.owner), 0);
    sem_wait(&owner_allocated);
    assert_int_equal(pthread_create(&consumer, NULL, free_half_then_the_rest, &note), 0);
    pthread_join(owner, NULL);
    sem_post(&owner_allocated);
    pthread_join(consumer, NULL);
    assert_true(note.valid);
    assert_true(note.collecting); /* for the owner while it lived, for none after */
    assert_true(cm_heap_check());
    assert_int_equal(held_out(c), before);
}

/* A second free of a block waiting in an outbox is reported. */
static void *free_all_then_one_twice(void *arg)
{
    outbox_note *n = arg;
    free_into_outbox(n);
    void *last = outbox_blocks[OUTBOX_BLOCKS - 1];
    if (cm_thread_cache_current->outboxes[cm_size_class(OUTBOX_SIZE)].chain.top != last)
        _exit(6); /* it is not in the outbox: the test would not test it */
    announce(last);
    free(last);
    return NULL;
}

static void free_twice_from_an_outbox(void *arg)
{
    (void)arg;
    for (int i = 0; i < OUTBOX_BLOCKS; i++)
        outbox_blocks[i] = malloc(OUTBOX_SIZE);
    outbox_note note = {
        .owner = cm_thread_cache_current->slot, .size = OUTBOX_SIZE, .to = OUTBOX_BLOCKS};
    on_another_thread(free_all_then_one_twice, &note);
}

static void a_double_free_of_a_block_in_an_outbox_is_reported(void **state)
{
    (void)state;
    child_spec spec = {.body = free_twice_from_an_outbox};
    expect_report(&spec, "cmalloc: double free %p in free()");
}

/* Scattered frees (as above) reach the owner as plain posts, whose objects carry ahead links
 * (internal.h): each one's word 2 names the object CM_POST_AHEAD further down its post, or
 * nothing near the post's end (the outbox's first post, of runs, has headers there instead).
 * The owner's next miss takes the mailbox as its inbox, not as its list: the heap checks hold
 * with it full, its pops hand out its blocks in its order, and what is left in it goes back
 * with a flush, none lost. */
static void *inbox_blocks[OUTBOX_BLOCKS];

static void a_plain_mailbox_becomes_the_inbox(void **state)
{
    (void)state;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    size_t before = held_out(c);
    void *keep[4096];
    outbox_note note;
    unsigned kept = scatter_outbox_blocks(&note, keep);
    assert_false(serves_without_a_miss(c));
    const cm_fresh_run *run = &cm_thread_cache_current->runs[c];
    assert_null(run->inbox);
    void *first = malloc(OUTBOX_SIZE); /* the miss: the mailbox becomes the inbox */
    assert_non_null(run->inbox);
    assert_null(cm_thread_cache_current->lists[c].head);
    uint32_t n = 0;
    for (void *p = run->inbox; p != NULL && n < OUTBOX_BLOCKS; p = cm_link_next(p))
        inbox_blocks[n++] = p;
    assert_int_equal(n, run->inbox_count);
    assert_int_equal(n + 1, OUTBOX_BLOCKS);
    uint32_t ahead = 0, none = 0;
    for (uint32_t k = 0; k < n; k++) {
        const void *a = cm_ahead_of(inbox_blocks[k]);
        ahead += k + CM_POST_AHEAD < n && a == inbox_blocks[k + CM_POST_AHEAD];
        none += a == NULL;
    }
    printf("inbox: %u of %u blocks with an ahead link, %u at a post's end\n", ahead, n, none);
    assert_true(ahead >= n / 2);
    assert_true(ahead + none + OUTBOX_BLOCKS / 4 >= n);
    assert_true(cm_heap_check());
    for (uint32_t k = 0; k < n / 2; k++)
        assert_ptr_equal(malloc(OUTBOX_SIZE), inbox_blocks[k]);
    assert_int_equal(run->inbox_count, n - n / 2);
    assert_true(cm_heap_check());
    free(first);
    for (uint32_t k = 0; k < n / 2; k++)
        free(inbox_blocks[k]);
    for (unsigned i = 0; i < kept; i++)
        free(keep[i]);
    assert_int_equal(held_out(c), before); /* the inbox's other half went back with the flush */
    assert_null(run->inbox);
}

/* A block that waits in its owner's inbox is free: freeing it is a double free. */
static void free_twice_from_an_inbox(void *arg)
{
    (void)arg;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    void *keep[4096];
    outbox_note note;
    scatter_outbox_blocks(&note, keep);
    (void)malloc(OUTBOX_SIZE);
    void *waiting = cm_thread_cache_current->runs[c].inbox;
    if (waiting == NULL)
        _exit(6); /* no inbox: the test would not test it */
    announce(waiting);
    free(waiting);
}

static void a_double_free_of_a_block_in_an_inbox_is_reported(void **state)
{
    (void)state;
    child_spec spec = {.body = free_twice_from_an_inbox};
    expect_report(&spec, "cmalloc: double free %p in free()");
}

/* A thread frees this thread's blocks and stays, the last of them in its outbox; a child
 * forked then frees them all again: each is that free's first in the child (the thread's
 * cache is left behind), and a second is a double free as ever. */
static _Atomic int outbox_filled, outbox_children_done;

static void *fill_an_outbox_and_stay(void *arg)
{
    outbox_note *n = arg;
    free_into_outbox(n);
    ready_then_stay(&outbox_filled, &outbox_children_done);
    return NULL;
}

static void a_child_may_free_again_what_waits_in_an_outbox(void **state)
{
    (void)state;
    for (int i = 0; i < OUTBOX_BLOCKS; i++)
        outbox_blocks[i] = malloc(OUTBOX_SIZE);
    outbox_note note = {
        .owner = cm_thread_cache_current->slot, .size = OUTBOX_SIZE, .to = OUTBOX_BLOCKS};
    pthread_t thread = start_until_ready(fill_an_outbox_and_stay, &note, &outbox_filled);
    assert_true(note.collecting && note.most_held > 0);
    /* the last block freed, the outbox's newest, first: the one freed twice */
    static void *newest_first[OUTBOX_BLOCKS];
    for (int i = 0; i < OUTBOX_BLOCKS; i++)
        newest_first[i] = outbox_blocks[OUTBOX_BLOCKS - 1 - i];
    expect_first_frees_in_a_child(newest_first, OUTBOX_BLOCKS, true,
                                  "blocks waiting in a left-behind outbox");
    atomic_store(&outbox_children_done, 1);
    pthread_join(thread, NULL);
}

/* A thread's inbox holds what another thread freed, and the thread stays; a child forked then
 * frees those blocks again: each is that free's first in the child (the thread's cache is
 * left behind, and its inbox searched as its lists are), and a second is a double free as
 * ever. */
static _Atomic int inbox_filled, inbox_children_done;
static uint32_t inbox_waiting; /* how many of inbox_blocks the staying thread's inbox holds */

static void *fill_an_inbox_and_stay(void *arg)
{
    (void)arg;
    unsigned c = cm_size_class(OUTBOX_SIZE);
    void *keep[4096];
    allocate_before_a_miss(OUTBOX_SIZE, outbox_blocks, OUTBOX_BLOCKS, keep);
    outbox_note note = {
        .owner = cm_thread_cache_current->slot, .to = OUTBOX_BLOCKS, .scattered = outbox_blocks};
    on_another_thread(free_scattered, &note);
    (void)malloc(OUTBOX_SIZE); /* the miss: the mailbox becomes the inbox */
    for (void *p = cm_thread_cache_current->runs[c].inbox; p != NULL; p = cm_link_next(p))
        inbox_blocks[inbox_waiting++] = p;
    ready_then_stay(&inbox_filled, &inbox_children_done);
    return NULL;
}

static void a_child_may_free_again_what_waits_in_an_inbox(void **state)
{
    (void)state;
    pthread_t thread = start_until_ready(fill_an_inbox_and_stay, NULL, &inbox_filled);
    assert_true(inbox_waiting > OUTBOX_BLOCKS / 2);
    expect_first_frees_in_a_child(inbox_blocks, inbox_waiting, true,
                                  "blocks waiting in a left-behind inbox");
    atomic_store(&inbox_children_done, 1);
    pthread_join(thread, NULL);
}

int main(void)
{
    start_watchdog("test_remote", 120);
    cm_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(remote_frees_come_back),
        cmocka_unit_test(owner_gone_before_the_frees),
        cmocka_unit_test(a_flush_takes_every_class_its_mailbox_holds),
        cmocka_unit_test(rounds_of_threads_lose_nothing),
        cmocka_unit_test(a_remote_double_free_is_reported),
        cmocka_unit_test(a_child_may_free_again_what_another_thread_sent_home),
        cmocka_unit_test(a_mailbox_holds_no_more_than_its_bound),
        cmocka_unit_test(a_mailbox_counts_past_15_bits),
        cmocka_unit_test(an_idle_class_mailbox_is_given_back),
        cmocka_unit_test(a_child_may_free_again_what_waits_in_a_left_behind_mailbox),
        cmocka_unit_test(spans_that_come_back_whole_are_handed_out_again_or_freed),
        cmocka_unit_test(the_spares_stop_at_their_bound),
        cmocka_unit_test(a_span_back_whole_becomes_the_empty_run),
        cmocka_unit_test(short_runs_become_the_list),
        cmocka_unit_test(long_runs_of_small_spans_become_the_list),
        cmocka_unit_test(a_corrupted_run_header_is_reported),
        cmocka_unit_test(a_corrupted_spare_link_is_reported),
        cmocka_unit_test(a_run_header_pointing_away_is_reported),
        cmocka_unit_test(a_batch_half_sent_home_keeps_the_other_half),
        cmocka_unit_test(mostly_own_lists_are_not_sorted),
        cmocka_unit_test(a_few_blocks_take_no_span),
        cmocka_unit_test(a_live_owners_spans_are_its_own),
        cmocka_unit_test(a_successor_takes_over_the_slot_of_what_it_frees),
        cmocka_unit_test(another_owners_batch_waits_for_it),
        cmocka_unit_test(a_fill_borrows_before_carving),
        cmocka_unit_test(a_class_in_use_is_not_idle_when_empty),
        cmocka_unit_test(a_consumer_posts_its_outbox_to_the_owner),
        cmocka_unit_test(an_outbox_of_1_KiB_blocks_posts_16),
        cmocka_unit_test(an_outbox_measures_its_runs_again_after_its_plain_posts),
        cmocka_unit_test(scattered_frees_go_out_as_plain_chains),
        cmocka_unit_test(a_plain_mailbox_holds_no_more_than_a_list),
        cmocka_unit_test(a_plain_stack_past_a_lists_cap_goes_to_the_central_cache),
        cmocka_unit_test(a_refused_outbox_goes_to_the_central_cache),
        cmocka_unit_test(a_double_free_of_a_block_in_an_outbox_is_reported),
        cmocka_unit_test(a_plain_mailbox_becomes_the_inbox),
        cmocka_unit_test(a_double_free_of_a_block_in_an_inbox_is_reported),
        cmocka_unit_test(a_child_may_free_again_what_waits_in_an_inbox),
        cmocka_unit_test(a_child_may_free_again_what_waits_in_an_outbox),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
