/* test_thread_cache.c - the front end: slow start (a list's max_length starts at 0 and grows
 * one per miss up to the batch), the budget (the bytes counted at slow paths within a budget of
 * at most CMALLOC_THREAD_CACHE_MAX, what the lists may hold within four), cross-thread frees
 * travelling as whole batches, caches given back at thread exit, a free that waits on a lock
 * not marking its object before it has it, lists left unused giving their objects back, and a
 * forked child freeing again what another thread freed before the fork. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
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

/* A free whose list is full makes room in the central cache, under its lock, before it marks
 * its object free: fork's prepare handler holds every lock, and a free it catches waiting must
 * leave the object allocated in the child. Here the main thread holds the central caches'
 * locks as that handler does while a worker frees into a full list. */
static void *waiting_object;
static _Atomic int worker_ready, worker_go, worker_done, main_checked;

static void *free_into_full_list(void *arg)
{
    (void)arg;
    enum { COUNT = 64 };
    void *blocks[COUNT];
    for (int i = 0; i < COUNT; i++)
        blocks[i] = malloc(7000);
    cm_free_list *list = &cm_thread_cache_current->lists[cm_size_class(7000)]; /* created now */
    int freed = 0; /* a recycled cache may have a list of any length: free until it is full */
    while (freed < COUNT - 1 &&
           (list->max_length == 0 || cm_free_list_length(list) < list->max_length))
        free(blocks[freed++]);
    waiting_object = blocks[COUNT - 1];
    bool full = cm_free_list_length(list) == list->max_length && list->max_length > 0;
    atomic_store(&worker_ready, 1);
    if (!full) { /* main waits for worker_done */
        atomic_store(&worker_done, 1);
        return "the list is full";
    }
    while (!atomic_load(&worker_go))
        cm_os_yield();
    free(waiting_object); /* must flush first: waits for the central lock */
    atomic_store(&worker_done, 1);
    /* The object stays in this thread's list until main has looked: once the thread exits its
     * span may go back to the OS (at once with CMALLOC_RELEASE_DELAY_MS=0) and read as zero. */
    while (!atomic_load(&main_checked))
        cm_os_yield();
    while (freed < COUNT - 1)
        free(blocks[freed++]);
    return NULL;
}

static void free_marks_its_object_after_taking_locks(void **state)
{
    (void)state;
    pthread_t thread;
    void *failure = NULL;
    assert_int_equal(pthread_create(&thread, NULL, free_into_full_list, NULL), 0);
    while (!atomic_load(&worker_ready))
        cm_os_yield();
    cm_central_fork(CM_FORK_PREPARE);
    atomic_store(&worker_go, 1);
    cm_os_sleep_ms(100);
    bool done_early = atomic_load(&worker_done), marked_early = cm_object_is_free(waiting_object);
    cm_central_fork(CM_FORK_PARENT);
    while (!atomic_load(&worker_done))
        cm_os_yield();
    bool marked = cm_object_is_free(waiting_object);
    atomic_store(&main_checked, 1);
    pthread_join(thread, &failure);
    if (failure)
        fail_msg("worker check failed: %s", (const char *)failure);
    assert_false(done_early);   /* it waited for the lock */
    assert_false(marked_early); /* without marking its object */
    assert_true(marked);
}

/* glibc's child frees again what a parent thread freed just before the fork (the dlopen'd TLS
 * blocks of tests/programs/fork_dlopen_tls.c). In the child a block on a list the fork left
 * behind (another thread's) is out of reach, so such a free is its first there and goes on as
 * an ordinary one; a second free in the child is a double free as ever. */
static void *left_behind_block;
static _Atomic int left_behind_freed, children_done;

static void *free_and_stay(void *arg)
{
    (void)arg;
    free(left_behind_block); /* onto this thread's list */
    atomic_store(&left_behind_freed, 1);
    while (!atomic_load(&children_done))
        cm_os_yield();
    return NULL;
}

static void free_again_in_child(void *arg)
{
    free(left_behind_block);
    void *reused = malloc(48); /* the block went onto this thread's list: the next of its class */
    if (reused != left_behind_block)
        _exit(4);
    free(reused);
    if (arg != NULL)
        free(left_behind_block);
}

static void a_child_may_free_again_what_another_thread_freed(void **state)
{
    (void)state;
    left_behind_block = malloc(48);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, free_and_stay, NULL), 0);
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
    char how[96];
    if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0)
        fail_msg("a child's free of a block another thread freed before the fork: %s\n%s",
                 describe_status(result.status, how, sizeof how), result.output);
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

int main(void)
{
    cm_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lists_start_small_and_grow),
        cmocka_unit_test(cache_stays_within_budget),
        cmocka_unit_test(cross_thread_frees_travel_in_batches),
        cmocka_unit_test(exited_threads_give_their_cache_back),
        cmocka_unit_test(frees_through_the_slow_path_keep_the_budget),
        cmocka_unit_test(free_marks_its_object_after_taking_locks),
        cmocka_unit_test(idle_lists_give_their_objects_back),
        cmocka_unit_test(a_child_may_free_again_what_another_thread_freed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
