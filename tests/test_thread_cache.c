/* test_thread_cache.c - the front end: slow start (a list's max_length starts at 0 and grows
 * one per miss up to the batch), the budget (the bytes counted at slow paths within a budget of
 * at most CMALLOC_THREAD_CACHE_MAX, what the lists may hold within four), cross-thread frees
 * travelling as whole batches, caches given back at thread exit, a free that waits on a lock
 * not marking its object before it has it, lists left unused giving their objects back, a
 * forked child freeing again what another thread freed before the fork, a live block that
 * looks free to the fast path's one-byte test of the free mark, an exited
 * thread's lists stocked for the next thread to start with, and fresh runs (never-used
 * objects a fill hands over as a range: handed out in address order after the list's, given
 * back with the cache). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cmalloc.h"
#include "internal.h"
#include "helpers.h"

/* cmocka's asserts must run on the main thread: workers return the first failed check. */
#define CHECK(condition)               \
    do {                               \
        if (!(condition))              \
            return (void *)#condition; \
    } while (0)

static void run_checked(void *(*body)(void *))
{
    pthread_t thread;
    void *failure = NULL;
    assert_int_equal(pthread_create(&thread, NULL, body, NULL), 0);
    pthread_join(thread, &failure);
    if (failure)
        fail_msg("worker check failed: %s", (const char *)failure);
}

static void *slow_start_thread(void *arg)
{
    (void)arg;
    unsigned c = cm_size_class(7000);
    const uint32_t batch = cm_classes[c].batch;
    free(malloc(16)); /* create this thread's cache */
    cm_free_list *list = &cm_thread_cache_current->lists[c];
    CHECK(list->max_length == 0); /* a class this thread never used holds nothing */
    enum { COUNT = 64 };
    void *objects[COUNT];
    for (uint32_t i = 0; i < COUNT; i++) {
        objects[i] = malloc(7000);
        CHECK(objects[i] != NULL);
        CHECK(list->max_length <= i + 2 + batch); /* one step per miss */
    }
    CHECK(list->max_length >= batch); /* grew with use */
    for (uint32_t i = 0; i < COUNT; i++) {
        free(objects[i]);
        CHECK(cm_free_list_length(list) <= list->max_length);
    }
    return NULL;
}

static void lists_start_small_and_grow(void **state)
{
    (void)state;
    run_checked(slow_start_thread);
}

static void *budget_thread(void *arg)
{
    (void)arg;
    enum { COUNT = 400 };
    static void *objects[COUNT];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < COUNT; i++)
            objects[i] = malloc(16384 + (size_t)(i % 7) * 4096);
        for (int i = 0; i < COUNT; i++) {
            free(objects[i]);
            const cm_thread_cache *cache = cm_thread_cache_current;
            size_t held = 0;
            for (unsigned c = 1; c < cm_class_count; c++)
                held += (size_t)cm_free_list_length(&cache->lists[c]) * cm_classes[c].size;
            CHECK(held <= cache->capacity);
            CHECK(cache->capacity <= CM_CAPACITY_PER_BUDGET * cache->max_size);
            CHECK(cache->published_size <= cache->max_size);
            CHECK(cache->max_size <= cm_option.thread_cache_max);
        }
    }
    return NULL;
}

static void cache_stays_within_budget(void **state)
{
    (void)state;
    run_checked(budget_thread);
}

enum { HANDOFF = 4096 };
static void *handoff[HANDOFF];

static void *producer(void *arg)
{
    (void)arg;
    for (int i = 0; i < HANDOFF; i++)
        handoff[i] = malloc(96);
    return NULL;
}

static void *consumer(void *arg)
{
    (void)arg;
    for (int i = 0; i < HANDOFF; i++)
        free(handoff[i]);
    cm_thread_cache_flush_current(); /* an exiting thread may keep its lists (stocked caches) */
    return NULL;
}

static void cross_thread_frees_travel_in_batches(void **state)
{
    (void)state;
    unsigned c = cm_size_class(96);
    pthread_t thread;
    pthread_create(&thread, NULL, producer, NULL);
    pthread_join(thread, NULL);
    cm_central_drain();
    size_t cached, out_before = cm_central_objects_out(c, &cached);
    pthread_create(&thread, NULL, consumer, NULL);
    pthread_join(thread, NULL);
    size_t cached_after, out_after = cm_central_objects_out(c, &cached_after);
    /* Nearly everything the consumer freed sits in the transfer cache as whole batches, or
     * went back to spans once the transfer cache was full; none is lost. */
    assert_true(cached_after > 0);
    assert_int_equal(cached_after % cm_classes[c].batch, 0);
    assert_true(out_before - out_after + cached_after >= HANDOFF - 2 * cm_classes[c].batch);
}

static void *short_lived(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100; i++)
        free(malloc((size_t)i * 40));
    void *keep = malloc(500);
    return keep;
}

static void exited_threads_give_their_cache_back(void **state)
{
    (void)state;
    cmalloc_stats before, after;
    cmalloc_stats_get(&before);
    for (int i = 0; i < 200; i++) {
        pthread_t thread;
        void *kept;
        pthread_create(&thread, NULL, short_lived, NULL);
        pthread_join(thread, &kept);
        free(kept);
    }
    cmalloc_stats_get(&after);
    assert_int_equal(after.thread_caches, before.thread_caches);
    assert_true(after.bytes_metadata <= before.bytes_metadata + (64 << 10)); /* caches recycled */
}

/* Frees that do not come through the fast path with a full list (realloc's move frees the old
 * block through the slow path) keep the budget too, counting what the fast paths pushed since
 * the list's last slow path (one build counted only the block being freed, and a cache ended
 * over its budget after 1,615 of these steps). */
static void *realloc_churn_thread(void *arg)
{
    (void)arg;
    unsigned seed = 7;
    void *slots[256] = {0};
    for (int i = 0; i < 20000; i++) {
        int k = (int)(rand_r(&seed) % 256), op = (int)(rand_r(&seed) % 3);
        size_t size = 16 + (size_t)(rand_r(&seed) % 8000);
        if (op == 0) {
            free(slots[k]);
            slots[k] = malloc(size);
        } else if (op == 1 && slots[k] != NULL) {
            slots[k] = realloc(slots[k], size);
            CHECK(slots[k] != NULL && cm_thread_cache_valid());
        } else {
            free(slots[k]);
            slots[k] = NULL;
        }
    }
    for (int k = 0; k < 256; k++)
        free(slots[k]);
    return NULL;
}

static void frees_through_the_slow_path_keep_the_budget(void **state)
{
    (void)state;
    run_checked(realloc_churn_thread);
}

/* Frees blocks (of size bytes) from *freed on until their list is full; false if it never
 * was. */
static bool fill_list(size_t size, void **blocks, int *freed, int count)
{
    cm_free_list *list = &cm_thread_cache_current->lists[cm_size_class(size)];
    while (*freed < count &&
           (list->max_length == 0 || cm_free_list_length(list) < list->max_length))
        free(blocks[(*freed)++]);
    return cm_free_list_length(list) == list->max_length && list->max_length > 0;
}

/* A free that finds its list full, of a block of a span the thread owns, goes onto the span's
 * local list: nothing goes back to the central cache but the spans whose every block came
 * back; the next misses take the local lists back, and the thread's exit gives back what is
 * left. */
enum { LOCAL_BLOCKS = 4096, LOCAL_SIZE = 64 };
static size_t local_out_at_start; /* objects out of the class's spans as the worker started */

/* Objects of the class out of its spans and not in its transfer cache. */
static size_t out_of_spans(unsigned size_class)
{
    size_t cached, out = cm_central_objects_out(size_class, &cached);
    return out - cached;
}

static void *local_lists_thread(void *arg)
{
    (void)arg;
    static void *blocks[LOCAL_BLOCKS];
    const unsigned c = cm_size_class(LOCAL_SIZE);
    free(malloc(LOCAL_SIZE)); /* this thread's cache: empty when it starts */
    local_out_at_start = out_of_spans(c) - cm_thread_cache_objects(c);
    for (int i = 0; i < LOCAL_BLOCKS; i++)
        CHECK((blocks[i] = malloc(LOCAL_SIZE)) != NULL);
    for (int i = 0; i < LOCAL_BLOCKS; i++)
        free(blocks[i]);
    const cm_thread_cache *cache = cm_thread_cache_current;
    const cm_free_list *list = &cache->lists[c];
    CHECK(cm_free_list_length(list) == list->max_length); /* full: the rest went local */
    CHECK(cache->local_objects[c] > 0 && cache->local_spans[c] != NULL);
    CHECK(cm_thread_cache_valid() && cm_heap_check());
    /* Every block out of the class's spans is this thread's again: on its list or local. */
    CHECK(out_of_spans(c) - local_out_at_start == cm_thread_cache_objects(c));
    for (const cm_span *span = cache->local_spans[c]; span != NULL; span = span->local_next)
        CHECK(span->local_count < span->used); /* a span with every block back went home */
    void *local_head = cache->local_spans[c]->local_free;
    uint32_t local_before = cache->local_objects[c], found = 0;
    for (int i = 0; i < LOCAL_BLOCKS; i++) {
        CHECK((blocks[i] = malloc(LOCAL_SIZE)) != NULL);
        found += blocks[i] == local_head;
    }
    CHECK(found == 1 && cache->local_objects[c] < local_before); /* the misses took them */
    CHECK(cm_thread_cache_valid() && cm_heap_check());
    for (int i = 0; i < LOCAL_BLOCKS; i++)
        free(blocks[i]);
    return NULL;
}

static void full_lists_send_own_frees_to_their_spans(void **state)
{
    (void)state;
    const unsigned c = cm_size_class(LOCAL_SIZE);
    cm_thread_cache_flush_current(); /* this thread holds none, nor has any in its mailbox */
    size_t out_before = out_of_spans(c);
    run_checked(local_lists_thread);
    /* The exit gave back the list and the local lists (some of the list perhaps to this
     * thread's mailbox, where the flush takes it). */
    cm_thread_cache_flush_current();
    assert_int_equal(out_of_spans(c), out_before);
    assert_true(cm_heap_check());
}

/* Frees onto local lists keep the budget as the list's own slow path does: the first such
 * free of a span publishes what the fast paths pushed onto the list since its last slow path,
 * and that may be over a budget that can no longer grow (one build left it over: the debug
 * build's heap check failed in 3 of 20 runs of tests/programs/cancel_prof.c). */
static void *local_lists_budget_thread(void *arg)
{
    (void)arg;
    static void *blocks[LOCAL_BLOCKS];
    bool went_local = false;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < LOCAL_BLOCKS; i++)
            CHECK((blocks[i] = malloc(LOCAL_SIZE)) != NULL);
        for (int i = 0; i < LOCAL_BLOCKS; i++) {
            free(blocks[i]);
            const cm_thread_cache *cache = cm_thread_cache_current;
            went_local = went_local || cache->local_objects[cm_size_class(LOCAL_SIZE)] > 0;
            CHECK(cache->published_size <= cache->max_size);
            CHECK(cache->capacity <= CM_CAPACITY_PER_BUDGET * cache->max_size);
        }
        CHECK(cm_thread_cache_valid());
    }
    CHECK(went_local);
    return NULL;
}

static void local_lists_keep_the_budget(void **state)
{
    (void)state;
    size_t most = cm_option.thread_cache_max;
    cm_option.thread_cache_max = CM_THREAD_START_BUDGET; /* the budget cannot grow */
    pthread_t thread;
    void *failure = NULL;
    assert_int_equal(pthread_create(&thread, NULL, local_lists_budget_thread, NULL), 0);
    pthread_join(thread, &failure);
    cm_option.thread_cache_max = most; /* before a failure ends the test: the next ones need it */
    if (failure)
        fail_msg("worker check failed: %s", (const char *)failure);
}

/* A thread never pushes onto a local list another thread holds, even when the pagemap's owner
 * of the span says it may (here the main thread frees, through the local list's slow path, a
 * block of a span whose list the worker holds): the block goes the list's way instead. */
static void *held_block;
static cm_span *held_span;
static _Atomic int held_ready, held_done;

static void *hold_a_local_list(void *arg)
{
    (void)arg;
    static void *blocks[LOCAL_BLOCKS];
    for (int i = 0; i < LOCAL_BLOCKS; i++)
        blocks[i] = malloc(LOCAL_SIZE);
    int freed = 0;
    fill_list(LOCAL_SIZE, blocks, &freed, LOCAL_BLOCKS);
    while (freed < LOCAL_BLOCKS - 1 && held_block == NULL) { /* until one stays with a held span */
        cm_span *span = cm_span_of(blocks[freed]);
        free(blocks[freed++]);
        if (span->local_holder == cm_thread_cache_current && cm_span_of(blocks[freed]) == span)
            held_span = span, held_block = blocks[freed++];
    }
    atomic_store(&held_ready, 1);
    while (!atomic_load(&held_done))
        cm_os_yield();
    while (freed < LOCAL_BLOCKS)
        if (blocks[freed++] != held_block)
            free(blocks[freed - 1]);
    return NULL;
}

static void a_held_local_list_is_the_holders_alone(void **state)
{
    (void)state;
    pthread_t thread;
    free(malloc(LOCAL_SIZE)); /* the main thread's cache */
    assert_int_equal(pthread_create(&thread, NULL, hold_a_local_list, NULL), 0);
    while (!atomic_load(&held_ready))
        cm_os_yield();
    bool found = held_block != NULL;
    const cm_thread_cache *holder = found ? held_span->local_holder : NULL;
    uint32_t count = found ? held_span->local_count : 0;
    if (found)
        cm_thread_cache_free_local(held_span, held_block);
    bool kept = found && held_span->local_holder == holder && held_span->local_count == count &&
                cm_object_is_free(held_block) && cm_thread_cache_valid();
    atomic_store(&held_done, 1);
    pthread_join(thread, NULL);
    assert_true(found);
    assert_true(kept);
    assert_true(cm_heap_check());
}

/* A free that waits on a lock marks its object free only after it has the lock: fork's
 * prepare handler holds every lock, and a free it catches waiting must leave the object
 * allocated in the child. Here the main thread holds the central caches' locks as that handler
 * does while a worker frees into a full list: another thread's block (the list makes room in
 * the central cache), or the last block out of a span of its own (the span's local list goes
 * back to the central cache). */
enum { WAITING_BLOCKS = 400, WAITING_SIZE = 7000, FOREIGN_BLOCKS = 64 };
static void *waiting_object;
static void *foreign_blocks[FOREIGN_BLOCKS]; /* main's: one of a span the worker does not own */
static _Atomic int worker_ready, worker_go, worker_done, main_checked;

/* Whether freeing block now gives its span's local list back to the central cache. */
static bool frees_last_of_span(void *block)
{
    const cm_span *span = cm_span_of(block);
    return span->local_holder == cm_thread_cache_current && span->local_count + 1 == span->used;
}

static void *free_into_full_list(void *own_span)
{
    static void *blocks[WAITING_BLOCKS];
    for (int i = 0; i < WAITING_BLOCKS; i++)
        blocks[i] = malloc(WAITING_SIZE);
    int freed = 0; /* a recycled cache may have a list of any length: free until it is full */
    bool ready = fill_list(WAITING_SIZE, blocks, &freed, WAITING_BLOCKS);
    if (own_span != NULL) /* on to a block whose free gives its span back */
        while (ready && freed < WAITING_BLOCKS && !frees_last_of_span(blocks[freed]))
            free(blocks[freed++]);
    if (own_span != NULL && freed < WAITING_BLOCKS)
        waiting_object = blocks[freed++];
    for (int i = 0; own_span == NULL && i < FOREIGN_BLOCKS && waiting_object == NULL; i++)
        if (cm_pagemap_owner(foreign_blocks[i]) != cm_thread_cache_current->own_slot)
            waiting_object = foreign_blocks[i];
    ready = ready && waiting_object != NULL;
    atomic_store(&worker_ready, 1);
    if (!ready) { /* main waits for worker_done */
        atomic_store(&worker_done, 1);
        return own_span ? "a free gives its span's local list back"
                        : "the list is full, and a block of another's span";
    }
    while (!atomic_load(&worker_go))
        cm_os_yield();
    free(waiting_object); /* waits for the central lock */
    atomic_store(&worker_done, 1);
    /* Another's block stays in this thread's list until main has looked: once the thread
     * exits its span may go back to the OS (at once with CMALLOC_RELEASE_DELAY_MS=0) and read
     * as zero. */
    while (!atomic_load(&main_checked))
        cm_os_yield();
    while (freed < WAITING_BLOCKS)
        free(blocks[freed++]);
    return NULL;
}

static void run_free_into_full_list(bool own_span)
{
    pthread_t thread;
    void *failure = NULL;
    atomic_store(&worker_ready, 0);
    atomic_store(&worker_go, 0);
    atomic_store(&worker_done, 0);
    atomic_store(&main_checked, 0);
    waiting_object = NULL;
    for (int i = 0; i < FOREIGN_BLOCKS; i++)
        foreign_blocks[i] = malloc(WAITING_SIZE);
    assert_int_equal(pthread_create(&thread, NULL, free_into_full_list, own_span ? &thread : NULL),
                     0);
    while (!atomic_load(&worker_ready))
        cm_os_yield();
    cm_central_fork(CM_FORK_PREPARE);
    atomic_store(&worker_go, 1);
    cm_os_sleep_ms(100);
    bool done_early = atomic_load(&worker_done), marked_early = cm_object_is_free(waiting_object);
    cm_central_fork(CM_FORK_PARENT);
    while (!atomic_load(&worker_done))
        cm_os_yield();
    bool marked = own_span || cm_object_is_free(waiting_object); /* a span gone home reads 0 */
    atomic_store(&main_checked, 1);
    pthread_join(thread, &failure);
    for (int i = 0; i < FOREIGN_BLOCKS; i++)
        if (foreign_blocks[i] != waiting_object || own_span)
            free(foreign_blocks[i]);
    if (failure)
        fail_msg("worker check failed: %s", (const char *)failure);
    if (done_early)
        fail_msg("the free of %s did not wait for the lock",
                 own_span ? "a span's last block" : "another thread's block");
    assert_false(marked_early); /* without marking its object */
    assert_true(marked);
}

static void free_marks_its_object_after_taking_locks(void **state)
{
    (void)state;
    run_free_into_full_list(false);
    run_free_into_full_list(true);
}

/* Free tests a block for its free mark by the mark's low byte and leaves the word to the slow
 * path (internal.h): a live block whose second word shares only that byte is measured, kept in
 * place by realloc and freed, not reported, and is the next one handed out; no mark's low byte
 * is 0, a handed-out block's second word, so a zeroed block never takes the slow path. */
static void free_mark_lookalike_is_freed(void **state)
{
    (void)state;
    for (int i = 0; i < 64; i++) {
        uintptr_t *block = malloc(48);
        assert_non_null(block);
        uintptr_t mark = cm_free_mark(block);
        assert_int_not_equal(mark & 0xff, 0);
        block[1] = mark ^ ((uintptr_t)(i + 1) << 8);
        assert_true(cm_object_may_be_free(block, mark));
        assert_false(cm_object_is_free(block));
        assert_int_equal(malloc_usable_size(block), 48);
        assert_ptr_equal(realloc(block, 40), block);
        free(block);
        assert_true(cm_object_is_free(block)); /* freed: it carries the whole mark now */
        void *again = malloc(48);
        assert_ptr_equal(again, block);
        free(again);
    }
}

/* glibc's child frees again what a parent thread freed just before the fork (the dlopen'd TLS
 * blocks of tests/programs/fork_dlopen_tls.c). In the child a block on a list the fork left
 * behind (another thread's, or one of that thread's local lists) is out of reach, so such a
 * free is its first there and goes on as an ordinary one; a second free in the child is a
 * double free as ever. */
enum { LEFT_BEHIND_SIZE = 48, LEFT_BEHIND_OWN = 2000 };
static void *left_behind_block;
static _Atomic int left_behind_freed, children_done;
static const char *left_behind_failure;

static void *free_and_stay(void *local)
{
    static void *own[LEFT_BEHIND_OWN];
    int freed = 0;
    if (local != NULL) { /* a block of its own, freed into its full list: a local list's */
        for (int i = 0; i < LEFT_BEHIND_OWN; i++)
            own[i] = malloc(LEFT_BEHIND_SIZE);
        if (!fill_list(LEFT_BEHIND_SIZE, own, &freed, LEFT_BEHIND_OWN - 1))
            left_behind_failure = "the list is full";
        left_behind_block = own[LEFT_BEHIND_OWN - 1];
    }
    free(left_behind_block); /* onto this thread's list, or its span's local list */
    if (local != NULL && cm_span_of(left_behind_block)->local_holder != cm_thread_cache_current)
        left_behind_failure = "the block is on its span's local list";
    atomic_store(&left_behind_freed, 1);
    while (!atomic_load(&children_done))
        cm_os_yield();
    while (local != NULL && freed < LEFT_BEHIND_OWN - 1)
        free(own[freed++]);
    return NULL;
}

static void free_again_in_child(void *arg)
{
    free(left_behind_block);
    void *reused = malloc(LEFT_BEHIND_SIZE); /* the block went onto this thread's list: the
                                                next of its class */
    if (reused != left_behind_block)
        _exit(4);
    free(reused);
    if (arg != NULL)
        free(left_behind_block);
}

static void child_frees_again_a_block_left_behind(bool local)
{
    atomic_store(&left_behind_freed, 0);
    atomic_store(&children_done, 0);
    left_behind_failure = NULL;
    left_behind_block = local ? NULL : malloc(LEFT_BEHIND_SIZE);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, free_and_stay, local ? &thread : NULL), 0);
    while (!atomic_load(&left_behind_freed))
        cm_os_yield();
    static child_result result;
    child_spec spec = {.body = free_again_in_child};
    run_child(&spec, &result);
    char expected[96];
    snprintf(expected, sizeof expected, "cmalloc: double free %p in free()", left_behind_block);
    expect_death(free_again_in_child, "twice", expected);
    atomic_store(&children_done, 1);
    pthread_join(thread, NULL);
    if (left_behind_failure != NULL)
        fail_msg("the worker's check failed: %s", left_behind_failure);
    char how[96];
    if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0)
        fail_msg("a child's free of a block another thread freed before the fork (%s): %s\n%s",
                 local ? "onto a local list" : "onto its list",
                 describe_status(result.status, how, sizeof how), result.output);
}

static void a_child_may_free_again_what_another_thread_freed(void **state)
{
    (void)state;
    child_frees_again_a_block_left_behind(false);
    child_frees_again_a_block_left_behind(true);
}

/* A list no path touched for a release delay gives its objects back, looked at from the
 * allocation misses of other lists; with release off (-1) it keeps them. The worker frees 16
 * blocks of 7000 bytes, then for 150 ms only allocates 48-byte blocks, missing every round. */
static void *idle_thread(void *arg)
{
    bool release_on = arg != NULL;
    unsigned c = cm_size_class(7000);
    void *blocks[16], *smalls[12 * 40];
    for (int i = 0; i < 16; i++)
        blocks[i] = malloc(7000);
    for (int i = 0; i < 16; i++)
        free(blocks[i]);
    cm_free_list *list = &cm_thread_cache_current->lists[c];
    uint32_t kept = cm_free_list_length(list);
    CHECK(kept > 0);
    for (int round = 0; round < 12; round++) {
        cm_os_sleep_ms(12);
        for (int i = 0; i < 40; i++) /* more than a batch, none freed: a miss each round */
            smalls[round * 40 + i] = malloc(48);
    }
    bool released = cm_free_list_length(list) == 0 && list->max_length == 0;
    for (int i = 0; i < 12 * 40; i++)
        free(smalls[i]);
    CHECK(released == release_on);
    CHECK(release_on || cm_free_list_length(list) == kept);
    CHECK(cm_thread_cache_valid());
    return NULL;
}

static void idle_lists_give_their_objects_back(void **state)
{
    (void)state;
    int64_t delay = cm_option.release_delay_ms;
    for (int on = 1; on >= 0; on--) {
        cm_option.release_delay_ms = on ? 20 : -1;
        pthread_t thread;
        void *failure = NULL;
        assert_int_equal(pthread_create(&thread, NULL, idle_thread, on ? &thread : NULL), 0);
        pthread_join(thread, &failure);
        if (failure)
            fail_msg("worker check failed (release %s): %s", on ? "on" : "off",
                     (const char *)failure);
    }
    cm_option.release_delay_ms = delay;
}

/* ---- stocked caches: an exited thread's lists for the next thread ------------------------ */
#define STOCK_SIZE   3000 /* a class no other test here allocates */
#define STOCK_BLOCKS 8
static void *stock_listed; /* the head of the list the last leave_a_list left */

static void *leave_a_list(void *arg)
{
    (void)arg;
    void *blocks[STOCK_BLOCKS];
    for (int i = 0; i < STOCK_BLOCKS; i++)
        blocks[i] = malloc(STOCK_SIZE);
    for (int i = 0; i < STOCK_BLOCKS; i++)
        free(blocks[i]);
    stock_listed = cm_thread_cache_current->lists[cm_size_class(STOCK_SIZE)].head;
    CHECK(stock_listed != NULL);
    return NULL;
}

/* The head of the class's list as a new thread's cache starts: its first call is of another
 * class. A block could not tell: the central cache may hand out again a block a stale stock
 * gave back. */
static void *read_start(void *arg)
{
    free(malloc(16));
    *(void **)arg = cm_thread_cache_current->lists[cm_size_class(STOCK_SIZE)].head;
    return NULL;
}

static void *next_threads_list(void)
{
    pthread_t thread;
    void *head = NULL;
    assert_int_equal(pthread_create(&thread, NULL, read_start, &head), 0);
    assert_int_equal(pthread_join(thread, NULL), 0);
    return head;
}

/* A thread that starts after one exited takes its cache, lists and all: its list of a class
 * starts as the list the exited thread left. */
static void the_next_thread_starts_with_the_last_ones_lists(void **state)
{
    (void)state;
    cmalloc_release(); /* nothing stocked by the tests before */
    run_checked(leave_a_list);
    assert_ptr_equal(next_threads_list(), stock_listed);
    assert_true(cm_heap_check());
}

/* A stocked cache gives its lists back after a release delay unused, and at cmalloc_release;
 * stats count what it holds with the thread caches. */
static void stocked_lists_go_back_when_stale_or_released(void **state)
{
    (void)state;
    unsigned c = cm_size_class(STOCK_SIZE);
    int64_t delay = cm_option.release_delay_ms;
    cm_option.release_delay_ms = 20;
    cmalloc_release();
    run_checked(leave_a_list);
    cm_os_sleep_ms(60);
    assert_null(next_threads_list());
    cm_option.release_delay_ms = delay;

    cmalloc_release();
    cmalloc_stats before, after;
    cmalloc_stats_get(&before);
    run_checked(leave_a_list);
    cmalloc_stats_get(&after);
    assert_true(after.bytes_thread_caches >= before.bytes_thread_caches + cm_classes[c].size);
    cmalloc_release();
    cmalloc_stats_get(&after);
    assert_true(after.bytes_thread_caches <= before.bytes_thread_caches);
    assert_null(next_threads_list());
    assert_true(cm_heap_check());
}

/* A class no other test here uses, so that the fills below cut fresh spans, whose objects
 * come as runs (but for those a fill takes from its second span on, as a list). */
#define FRESH_SIZE 336
enum { FRESH_OBJECTS = 200 };
static void *fresh_objects[FRESH_OBJECTS];

static void *use_fresh_runs(void *arg)
{
    (void)arg;
    const unsigned c = cm_size_class(FRESH_SIZE);
    const size_t size = cm_classes[c].size;
    cm_thread_cache *cache = cm_thread_cache_current;
    unsigned from_runs = 0;
    for (unsigned i = 0; i < FRESH_OBJECTS; i++) {
        cache = cm_thread_cache_current; /* made by the first call */
        cm_fresh_run *run = &cache->runs[c];
        char *expected = cache->lists[c].head == NULL && run->next != run->end ? run->next : NULL;
        fresh_objects[i] = malloc(FRESH_SIZE);
        CHECK(fresh_objects[i] != NULL);
        if (expected != NULL) { /* an empty list: the run's next object, then the one above */
            CHECK(fresh_objects[i] == expected);
            CHECK(run->next == expected + size || run->next == run->end);
            from_runs++;
        }
        CHECK(cm_thread_cache_valid());
    }
    CHECK(from_runs > FRESH_OBJECTS / 2); /* fresh spans come as runs, not carved lists */
    CHECK(cm_heap_check());
    /* With an empty list and objects left in the run, a freed object is handed out again
     * before the run's next one. */
    cm_fresh_run *run = &cache->runs[c];
    void *more[FRESH_OBJECTS + 1];
    unsigned extra = 0;
    while ((run->next == run->end || cache->lists[c].head != NULL) && extra < FRESH_OBJECTS)
        more[extra++] = malloc(FRESH_SIZE);
    CHECK(run->next != run->end && cache->lists[c].head == NULL);
    char *next = run->next;
    void *freed = fresh_objects[1];
    free(freed);
    fresh_objects[1] = malloc(FRESH_SIZE);
    CHECK(fresh_objects[1] == freed);
    more[extra] = malloc(FRESH_SIZE);
    CHECK(more[extra++] == next);
    for (unsigned i = 0; i < FRESH_OBJECTS; i++)
        free(fresh_objects[i]);
    for (unsigned i = 0; i < extra; i++)
        free(more[i]);
    CHECK(cm_thread_cache_valid() && cm_heap_check());
    return NULL;
}

static void fresh_runs_hand_out_in_address_order_and_go_back(void **state)
{
    (void)state;
    const unsigned c = cm_size_class(FRESH_SIZE);
    cmalloc_release();
    size_t cached, out_before = cm_central_objects_out(c, &cached);
    run_checked(use_fresh_runs);
    cmalloc_release(); /* the stocked cache's lists too */
    size_t out_after = cm_central_objects_out(c, &cached);
    assert_int_equal(out_after, out_before); /* the runs' objects came back with the cache */
    assert_true(cm_heap_check());
}

/* Rounds of threads started together and exiting in any order: every one takes a stocked
 * cache or a fresh one and leaves its own, the stock stays within CM_STOCKED_CACHES caches of
 * CM_STOCKED_BYTES, and the registry of live caches stays whole (a cache taken from the stock
 * once linked itself back in with its old neighbour, and the registry looped). */
#define CHURN_THREADS 24
#define CHURN_ROUNDS  40
static void *churn_thread(void *arg)
{
    uintptr_t seed = (uintptr_t)arg;
    void *blocks[64];
    for (int i = 0; i < 64; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        blocks[i] = malloc(16 + (seed >> 33) % 6000);
        CHECK(blocks[i] != NULL);
    }
    for (int i = 0; i < 64; i += 2)
        free(blocks[i]);
    for (int i = 1; i < 64; i += 2)
        free(blocks[i]);
    CHECK(cm_thread_cache_valid());
    return NULL;
}

/* What the calling thread's own cache holds, which stats count with the stock. */
static size_t own_cache_bytes(void)
{
    size_t bytes = 0;
    for (unsigned c = 1; c < cm_class_count; c++)
        bytes += cm_thread_cache_objects(c) * cm_classes[c].size;
    return bytes;
}

static void churning_threads_keep_the_stock_bounded(void **state)
{
    (void)state;
    cmalloc_release();
    cmalloc_stats before, after;
    cmalloc_stats_get(&before);
    for (int round = 0; round < CHURN_ROUNDS; round++) {
        pthread_t threads[CHURN_THREADS];
        for (uintptr_t i = 0; i < CHURN_THREADS; i++)
            assert_int_equal(pthread_create(&threads[i], NULL, churn_thread,
                                            (void *)(round * CHURN_THREADS + i + 1)), 0);
        for (int i = 0; i < CHURN_THREADS; i++) {
            void *failure = NULL;
            assert_int_equal(pthread_join(threads[i], &failure), 0);
            if (failure)
                fail_msg("worker check failed: %s", (const char *)failure);
        }
        cmalloc_stats_get(&after); /* walks the registry: a looped one never ends */
        assert_int_equal(after.thread_caches, before.thread_caches);
        assert_true(after.bytes_thread_caches - own_cache_bytes() <=
                    before.bytes_thread_caches + CM_STOCKED_CACHES * CM_STOCKED_BYTES);
    }
    assert_true(cm_heap_check());
}

int main(void)
{
    cm_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lists_start_small_and_grow),
        cmocka_unit_test(cache_stays_within_budget),
        cmocka_unit_test(cross_thread_frees_travel_in_batches),
        cmocka_unit_test(exited_threads_give_their_cache_back),
        cmocka_unit_test(frees_through_the_slow_path_keep_the_budget),
        cmocka_unit_test(full_lists_send_own_frees_to_their_spans),
        cmocka_unit_test(a_held_local_list_is_the_holders_alone),
        cmocka_unit_test(free_marks_its_object_after_taking_locks),
        cmocka_unit_test(free_mark_lookalike_is_freed),
        cmocka_unit_test(idle_lists_give_their_objects_back),
        cmocka_unit_test(a_child_may_free_again_what_another_thread_freed),
        cmocka_unit_test(local_lists_keep_the_budget),
        cmocka_unit_test(the_next_thread_starts_with_the_last_ones_lists),
        cmocka_unit_test(stocked_lists_go_back_when_stale_or_released),
        cmocka_unit_test(churning_threads_keep_the_stock_bounded),
        cmocka_unit_test(fresh_runs_hand_out_in_address_order_and_go_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
