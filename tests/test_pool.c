/* test_pool.c - object pools (cmalloc_pool_*), black box plus the pool's invariant check.
 *
 *   alignment_for_every_size     sizes 1..300: 16-byte aligned, and to the size's natural
 *                                alignment up to 64; object_size() covers the request
 *   objects_distinct_and_reused  patterns survive, a freed object comes back before the pool
 *                                grows, free(NULL)
 *   fixed_pool_fills_to_capacity capacities 1, 7, 1000, 100000 (many chunks): capacity() is the
 *                                request, the next alloc is NULL with ENOMEM, in_use == capacity,
 *                                and a free makes room for exactly one more
 *   grow_pool_keeps_addresses    600,000 objects: capacity grows, every object keeps its
 *                                address and contents
 *   random_against_model         seeded interleaved alloc/free (TEST_SEED to repeat), in_use and
 *                                contents against a model, cm_pool_valid at checkpoints
 *   thread_safe_pool_4_threads   4 threads allocate, then free each other's objects, 3 rounds
 *   thread_safe_pool_never_strands  4 threads alloc and free at once on a FIXED pool exactly as
 *                                large as they can hold together: no allocation may fail
 *   memory_in_stats_and_released a 64 MiB pool counts in bytes_in_use; destroy takes it out of
 *                                bytes_in_use and out of RSS at once
 *   bad_arguments                EINVAL: size 0, size > 1 GiB, unknown flags, FIXED of capacity
 *                                0; ENOMEM: a capacity no memory can hold; GROW of capacity 0 ok
 *   death_*                      double free (plain and THREAD_SAFE), a malloc pointer, a stack
 *                                address, another pool's object, a pointer inside an object, a
 *                                slot past a FIXED pool's capacity, and free() of a pool object:
 *                                SIGABRT with the exact message, through cmalloc.h's inline
 *                                cmalloc_pool_free and through the exported function
 *   keep_going                   with CMALLOC_ABORT_ON_ERROR=0 (a re-executed copy) both are
 *                                reported and ignored, the pool intact
 *   fork_beside_pool_threads     2 threads allocate from and free to a THREAD_SAFE pool while
 *                                main forks 200 times; every child allocates from that pool
 *                                and must exit within 5 s (its alarm): no pool lock is left
 *                                held by a thread the child does not have
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmalloc.h"
#include "helpers.h"
#include "pool_churn.h"

bool cm_pool_valid(const cmalloc_pool *pool); /* src/internal.h: hidden, linkable from the .a */

static void alignment_for_every_size(void **state)
{
    (void)state;
    for (size_t size = 1; size <= 300; size++) {
        size_t low = size & -size;
        size_t align = low < 16 ? 16 : low > 64 ? 64 : low;
        unsigned flags = size % 2 ? CMALLOC_POOL_GROW : CMALLOC_POOL_FIXED;
        cmalloc_pool *pool = cmalloc_pool_create(size, 50, flags);
        assert_non_null(pool);
        assert_true(cmalloc_pool_object_size(pool) >= size);
        assert_int_equal(cmalloc_pool_object_size(pool) % align, 0);
        for (int i = 0; i < 50; i++) {
            unsigned char *p = cmalloc_pool_alloc(pool);
            assert_non_null(p);
            assert_int_equal((uintptr_t)p % align, 0);
            memset(p, 0xab, size);
        }
        assert_true(cm_pool_valid(pool));
        cmalloc_pool_destroy(pool);
    }
}

static void objects_distinct_and_reused(void **state)
{
    (void)state;
    cmalloc_pool *pool = cmalloc_pool_create(40, 0, CMALLOC_POOL_GROW);
    assert_non_null(pool);
    enum { N = 5000 };
    static unsigned char *objects[N];
    for (int i = 0; i < N; i++) {
        objects[i] = cmalloc_pool_alloc(pool);
        assert_non_null(objects[i]);
        memset(objects[i], i & 0xff, 40);
    }
    for (int i = 0; i < N; i++) /* no two overlap: every pattern is intact */
        for (int k = 0; k < 40; k++)
            assert_int_equal(objects[i][k], i & 0xff);
    assert_int_equal(cmalloc_pool_in_use(pool), N);
    cmalloc_pool_free(pool, objects[17]);
    assert_int_equal(cmalloc_pool_in_use(pool), N - 1);
    /* the freed object comes back before the pool grows */
    size_t capacity = cmalloc_pool_capacity(pool), reused = 0;
    while (cmalloc_pool_in_use(pool) < capacity)
        reused += cmalloc_pool_alloc(pool) == objects[17];
    assert_int_equal(reused, 1);
    assert_int_equal(cmalloc_pool_capacity(pool), capacity);
    cmalloc_pool_free(pool, NULL);
    assert_int_equal(cmalloc_pool_in_use(pool), capacity);
    assert_true(cm_pool_valid(pool));
    cmalloc_pool_destroy(pool);
    cmalloc_pool_destroy(NULL);
}

static void fixed_pool_fills_to_capacity(void **state)
{
    (void)state;
    static const size_t capacities[] = {1, 7, 1000, 100000};
    for (size_t c = 0; c < sizeof capacities / sizeof *capacities; c++) {
        size_t capacity = capacities[c];
        cmalloc_pool *pool = cmalloc_pool_create(24, capacity, CMALLOC_POOL_FIXED);
        assert_non_null(pool);
        assert_int_equal(cmalloc_pool_capacity(pool), capacity);
        void **objects = calloc(capacity, sizeof *objects);
        for (size_t i = 0; i < capacity; i++)
            assert_non_null(objects[i] = cmalloc_pool_alloc(pool));
        errno = 0;
        assert_null(cmalloc_pool_alloc(pool));
        assert_int_equal(errno, ENOMEM);
        assert_int_equal(cmalloc_pool_in_use(pool), capacity);
        assert_int_equal(cmalloc_pool_capacity(pool), capacity);
        cmalloc_pool_free(pool, objects[capacity / 2]);
        assert_ptr_equal(cmalloc_pool_alloc(pool), objects[capacity / 2]);
        assert_null(cmalloc_pool_alloc(pool));
        assert_true(cm_pool_valid(pool));
        free(objects);
        cmalloc_pool_destroy(pool);
    }
}

/* A pool that ran dry refills from a word holding many free objects, not from the lowest word
 * that holds one: objects 0..255 taken in address order, then object 1 and objects 128..191
 * freed; the next allocations come from 128..191, and object 1 only once those are gone. */
static void refill_takes_a_full_word(void **state)
{
    (void)state;
    enum { N = 256 };
    cmalloc_pool *pool = cmalloc_pool_create(24, N, CMALLOC_POOL_FIXED);
    assert_non_null(pool);
    static char *objects[N];
    for (size_t i = 0; i < N; i++) {
        assert_non_null(objects[i] = cmalloc_pool_alloc(pool));
        if (i > 0)
            assert_true(objects[i] > objects[i - 1]);
    }
    cmalloc_pool_free(pool, objects[1]);
    for (size_t i = 128; i < 192; i++)
        cmalloc_pool_free(pool, objects[i]);
    for (size_t i = 128; i < 192; i++)
        assert_ptr_equal(cmalloc_pool_alloc(pool), objects[i]);
    assert_ptr_equal(cmalloc_pool_alloc(pool), objects[1]);
    assert_null(cmalloc_pool_alloc(pool));
    assert_true(cm_pool_valid(pool));
    cmalloc_pool_destroy(pool);
}

static void grow_pool_keeps_addresses(void **state)
{
    (void)state;
    enum { N = 600000 };
    cmalloc_pool *pool = cmalloc_pool_create(24, 1000, CMALLOC_POOL_GROW);
    assert_non_null(pool);
    size_t first_capacity = cmalloc_pool_capacity(pool);
    assert_true(first_capacity >= 1000);
    uint64_t **objects = malloc(N * sizeof *objects);
    for (size_t i = 0; i < N; i++) {
        objects[i] = cmalloc_pool_alloc(pool);
        assert_non_null(objects[i]);
        objects[i][0] = i; /* its index, and its own address */
        objects[i][1] = (uintptr_t)objects[i];
        objects[i][2] = ~(uint64_t)i;
    }
    assert_true(cmalloc_pool_capacity(pool) >= N && cmalloc_pool_capacity(pool) > first_capacity);
    assert_int_equal(cmalloc_pool_in_use(pool), N);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(objects[i][0], i);
        assert_int_equal(objects[i][1], (uintptr_t)objects[i]);
        assert_int_equal(objects[i][2], ~(uint64_t)i);
    }
    assert_true(cm_pool_valid(pool));
    free(objects);
    cmalloc_pool_destroy(pool);
}

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void random_against_model(void **state)
{
    (void)state;
    uint64_t s = seed_from_env("test_pool: random_against_model") | 1;
    enum { SLOTS = 4096, STEPS = 400000, SIZE = 48 };
    static unsigned char *slots[SLOTS];
    memset(slots, 0, sizeof slots);
    size_t live = 0;
    for (unsigned flags = 0; flags < 4; flags++) {
        size_t capacity = flags & CMALLOC_POOL_GROW ? 100 : SLOTS;
        cmalloc_pool *pool = cmalloc_pool_create(SIZE, capacity, flags);
        assert_non_null(pool);
        for (long step = 0; step < STEPS; step++) {
            size_t i = next_random(&s) % SLOTS;
            if (slots[i] == NULL) {
                slots[i] = cmalloc_pool_alloc(pool);
                assert_non_null(slots[i]);
                memset(slots[i], (int)(i & 0xff), SIZE);
                live++;
            } else {
                for (int k = 0; k < SIZE; k++)
                    assert_int_equal(slots[i][k], i & 0xff);
                cmalloc_pool_free(pool, slots[i]);
                slots[i] = NULL;
                live--;
            }
            assert_int_equal(cmalloc_pool_in_use(pool), live);
            if (step % 50000 == 0)
                assert_true(cm_pool_valid(pool));
        }
        assert_true(cm_pool_valid(pool));
        cmalloc_pool_destroy(pool);
        memset(slots, 0, sizeof slots);
        live = 0;
    }
}

enum { THREADS = 4, PER_THREAD = 20000 };
static cmalloc_pool *shared;
static void *handed[THREADS][PER_THREAD];

static void *fill(void *arg)
{
    uintptr_t t = (uintptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        handed[t][i] = cmalloc_pool_alloc(shared);
        if (handed[t][i] == NULL)
            return (void *)1;
        memcpy(handed[t][i], &handed[t][i], sizeof(void *)); /* each object names itself */
    }
    return NULL;
}

static void *drain_neighbour(void *arg)
{
    uintptr_t t = ((uintptr_t)arg + 1) % THREADS; /* free another thread's objects */
    for (int i = 0; i < PER_THREAD; i++) {
        void *self;
        memcpy(&self, handed[t][i], sizeof self);
        if (self != handed[t][i])
            return (void *)1;
        cmalloc_pool_free(shared, handed[t][i]);
    }
    return NULL;
}

static void run_threads(void *(*body)(void *))
{
    pthread_t threads[THREADS];
    for (uintptr_t t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&threads[t], NULL, body, (void *)t), 0);
    for (int t = 0; t < THREADS; t++) {
        void *failed;
        pthread_join(threads[t], &failed);
        assert_null(failed);
    }
}

static void thread_safe_pool_4_threads(void **state)
{
    (void)state;
    for (unsigned flags = CMALLOC_POOL_THREAD_SAFE;
         flags <= (CMALLOC_POOL_THREAD_SAFE | CMALLOC_POOL_GROW); flags++) {
        shared = cmalloc_pool_create(24, THREADS * PER_THREAD, flags);
        assert_non_null(shared);
        for (int round = 0; round < 3; round++) {
            run_threads(fill);
            assert_int_equal(cmalloc_pool_in_use(shared), THREADS * PER_THREAD);
            run_threads(drain_neighbour);
            assert_int_equal(cmalloc_pool_in_use(shared), 0);
            assert_true(cm_pool_valid(shared));
        }
        cmalloc_pool_destroy(shared);
    }
}

/* All threads at once: each holds at most BATCH objects of a FIXED pool of exactly
 * THREADS * BATCH, so an allocation may never fail: a free that races with the allocator
 * leaving a chunk must not strand its object (and a chunk holds fewer objects than the pool,
 * so chunks are left and re-entered all the time). */
enum { BATCH = 200, CYCLES = 3000 };

static void *churn(void *arg)
{
    return pool_churn(shared, (unsigned)(uintptr_t)arg, BATCH, CYCLES) ? (void *)1 : NULL;
}

static void thread_safe_pool_never_strands(void **state)
{
    (void)state;
    shared =
        cmalloc_pool_create(2000, THREADS * BATCH, CMALLOC_POOL_FIXED | CMALLOC_POOL_THREAD_SAFE);
    assert_non_null(shared);
    run_threads(churn);
    assert_int_equal(cmalloc_pool_in_use(shared), 0);
    assert_int_equal(cmalloc_pool_capacity(shared), THREADS * BATCH);
    assert_true(cm_pool_valid(shared));
    cmalloc_pool_destroy(shared);
}

static void *filled_pool(size_t bytes)
{
    cmalloc_pool *pool = cmalloc_pool_create(1024, bytes / 1024, CMALLOC_POOL_FIXED);
    for (size_t i = 0; pool != NULL && i < bytes / 1024; i++)
        memset(cmalloc_pool_alloc(pool), 1, 1024);
    return pool;
}

static void destroy_pool(void *pool)
{
    cmalloc_pool_destroy(pool);
}

static void memory_in_stats_and_released(void **state)
{
    (void)state;
    expect_in_stats_and_released(filled_pool, destroy_pool, (size_t)64 << 20);
}

static void bad_arguments(void **state)
{
    (void)state;
    static const struct {
        size_t size, capacity;
        unsigned flags;
        int error;
    } cases[] = {
        {0, 10, CMALLOC_POOL_GROW, EINVAL},
        {0, 10, CMALLOC_POOL_FIXED, EINVAL},
        {((size_t)1 << 30) + 1, 1, CMALLOC_POOL_FIXED, EINVAL},
        {64, 10, 0x80, EINVAL},
        {64, 10, CMALLOC_POOL_GROW | 4, EINVAL},
        {64, 0, CMALLOC_POOL_FIXED, EINVAL},
        {64, 0, CMALLOC_POOL_THREAD_SAFE, EINVAL},
        {64, SIZE_MAX / 2, CMALLOC_POOL_FIXED, ENOMEM},
        {64, SIZE_MAX, CMALLOC_POOL_GROW, ENOMEM},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        errno = 0;
        assert_null(cmalloc_pool_create(cases[i].size, cases[i].capacity, cases[i].flags));
        assert_int_equal(errno, cases[i].error);
    }
    cmalloc_pool *pool = cmalloc_pool_create(64, 0, CMALLOC_POOL_GROW);
    assert_non_null(pool);
    assert_int_equal(cmalloc_pool_capacity(pool), 0);
    assert_int_equal(cmalloc_pool_in_use(pool), 0);
    assert_non_null(cmalloc_pool_alloc(pool));
    assert_true(cmalloc_pool_capacity(pool) >= 1);
    cmalloc_pool_destroy(pool);
}

/* ---- death tests ---------------------------------------------------------------------------- */

typedef struct misuse {
    cmalloc_pool *pool;
    void *object;
    bool twice;     /* free it once first */
    bool with_free; /* free() rather than cmalloc_pool_free() */
    bool calls;     /* the exported cmalloc_pool_free, not cmalloc.h's inline path */
} misuse;

static void misuse_body(void *arg)
{
    misuse *m = arg;
    if (m->twice)
        cmalloc_pool_free(m->pool, m->object);
    if (m->with_free)
        free(m->object);
    else if (m->calls)
        (cmalloc_pool_free)(m->pool, m->object);
    else
        cmalloc_pool_free(m->pool, m->object);
}

/* The misuse m, through the inline path and (unless it is free()) the exported function. */
static void expect_misuse_report(misuse m, const char *format)
{
    char expected[256];
    snprintf(expected, sizeof expected, format, m.object, (void *)m.pool);
    expect_death(misuse_body, &m, expected);
    m.calls = true;
    if (!m.with_free)
        expect_death(misuse_body, &m, expected);
}

static const char double_free[] = "cmalloc: cmalloc_pool_free(): double free %p; aborting\n";
static const char not_ours[] =
    "cmalloc: cmalloc_pool_free(): %p is not an object of pool %p; aborting\n";

static void death_double_free(void **state)
{
    (void)state;
    for (unsigned flags = 0; flags < 4; flags++) {
        cmalloc_pool *pool = cmalloc_pool_create(32, 100, flags);
        void *object = cmalloc_pool_alloc(pool);
        cmalloc_pool_alloc(pool);
        expect_misuse_report((misuse){.pool = pool, .object = object, .twice = true}, double_free);
        cmalloc_pool_destroy(pool);
    }
}

static void death_foreign_pointers(void **state)
{
    (void)state;
    cmalloc_pool *pool = cmalloc_pool_create(32, 100, CMALLOC_POOL_GROW);
    cmalloc_pool *other = cmalloc_pool_create(32, 100, CMALLOC_POOL_GROW);
    char *object = cmalloc_pool_alloc(pool);
    int local;
    void *heap = malloc(32);
    expect_misuse_report((misuse){.pool = pool, .object = heap}, not_ours);
    expect_misuse_report((misuse){.pool = pool, .object = &local}, not_ours);
    expect_misuse_report((misuse){.pool = pool, .object = cmalloc_pool_alloc(other)}, not_ours);
    expect_misuse_report((misuse){.pool = pool, .object = object + 16}, not_ours);
    /* the chunk header */
    expect_misuse_report((misuse){.pool = pool, .object = object - 64}, not_ours);
    free(heap);
    cmalloc_pool_destroy(other);
    cmalloc_pool_destroy(pool);
}

/* A FIXED pool of 7 objects has slots for more in its chunk: those past the capacity are no
 * objects, though the chunk is one the pool knows (a free made it known to the inline path). */
static void death_past_a_fixed_pool(void **state)
{
    (void)state;
    cmalloc_pool *pool = cmalloc_pool_create(32, 7, CMALLOC_POOL_FIXED);
    char *objects[7], *last = NULL;
    for (int i = 0; i < 7; i++) {
        objects[i] = cmalloc_pool_alloc(pool);
        last = objects[i] > last ? objects[i] : last;
    }
    cmalloc_pool_free(pool, objects[0]);
    objects[0] = cmalloc_pool_alloc(pool);
    expect_misuse_report((misuse){.pool = pool, .object = last + 32}, not_ours);
    expect_misuse_report((misuse){.pool = pool, .object = last + 64 * 32}, not_ours);
    cmalloc_pool_destroy(pool);
}

static void death_free_of_a_pool_object(void **state)
{
    (void)state;
    cmalloc_pool *pool = cmalloc_pool_create(32, 100, CMALLOC_POOL_FIXED);
    expect_misuse_report(
        (misuse){.pool = pool, .object = cmalloc_pool_alloc(pool), .with_free = true},
        "cmalloc: free(): invalid pointer %p; aborting\n");
    cmalloc_pool_destroy(pool);
}

/* A pool used after cmalloc_pool_destroy: its chunks are gone (malloc may have reused them),
 * so a free through the stale handle, inline or exported, and an allocation are reported. */
typedef struct after_destroy {
    cmalloc_pool *pool;
    void *object;
    int call; /* 0 inline free, 1 exported free, 2 alloc, 3 destroy again */
} after_destroy;

static void after_destroy_body(void *arg)
{
    after_destroy *a = arg;
    if (a->call == 0)
        cmalloc_pool_free(a->pool, a->object);
    else if (a->call == 1)
        (cmalloc_pool_free)(a->pool, a->object);
    else if (a->call == 2)
        cmalloc_pool_alloc(a->pool);
    else
        cmalloc_pool_destroy(a->pool);
}

/* A GROW pool with 8 objects out, one freed and taken again (its chunk now known to the
 * inline free), destroyed; then malloc asks for what the chunk was. objects[] gets the 8. */
static cmalloc_pool *destroyed_pool(void *objects[8], unsigned char **block)
{
    cmalloc_pool *pool = cmalloc_pool_create(64, 0, CMALLOC_POOL_GROW);
    for (int i = 0; i < 8; i++)
        objects[i] = cmalloc_pool_alloc(pool);
    cmalloc_pool_free(pool, objects[0]);
    objects[0] = cmalloc_pool_alloc(pool);
    cmalloc_pool_destroy(pool);
    *block = malloc(60000);
    memset(*block, 0xab, 60000);
    return pool;
}

static void death_use_after_destroy(void **state)
{
    (void)state;
    static const char *const callers[] = {"cmalloc_pool_free()", "cmalloc_pool_free()",
                                          "cmalloc_pool_alloc()", "cmalloc_pool_destroy()"};
    void *objects[8];
    unsigned char *block;
    cmalloc_pool *pool = destroyed_pool(objects, &block);
    for (int call = 0; call < 4; call++) {
        char expected[160];
        snprintf(expected, sizeof expected, "cmalloc: %s: pool %p was destroyed; aborting\n",
                 callers[call], (void *)pool);
        expect_death(after_destroy_body, &(after_destroy){pool, objects[1 + call], call}, expected);
    }
    free(block);
}

/* With CMALLOC_ABORT_ON_ERROR=0 (read once at start: a re-executed copy of this binary runs
 * keep_going_child) a double free and a foreign pointer are reported and ignored: the pool is
 * intact, the object is not handed out twice. */
static int keep_going_child(void)
{
    cmalloc_pool *pool = cmalloc_pool_create(32, 2, CMALLOC_POOL_FIXED);
    void *a = cmalloc_pool_alloc(pool);
    int local;
    cmalloc_pool_free(pool, a);
    cmalloc_pool_free(pool, a);
    cmalloc_pool_free(pool, &local);
    void *b = cmalloc_pool_alloc(pool), *c = cmalloc_pool_alloc(pool);
    bool ok = b != NULL && c != NULL && b != c && cmalloc_pool_alloc(pool) == NULL &&
              cmalloc_pool_in_use(pool) == 2 && cm_pool_valid(pool);
    cmalloc_pool_destroy(pool);
    void *objects[8]; /* a destroyed pool's objects freed: malloc's block stays as it was */
    unsigned char *block;
    cmalloc_pool *dead = destroyed_pool(objects, &block);
    for (int i = 0; i < 8; i++)
        i % 2 ? (cmalloc_pool_free)(dead, objects[i]) : cmalloc_pool_free(dead, objects[i]);
    for (size_t i = 0; i < 60000; i++)
        ok = ok && block[i] == 0xab;
    free(block);
    return ok ? 0 : 1;
}

static void keep_going(void **state)
{
    (void)state;
    static child_result result;
    child_spec spec = {.self_args = (char *[]){"test_pool", "--keep-going", NULL},
                       .env = {"CMALLOC_ABORT_ON_ERROR=0"}};
    run_child(&spec, &result);
    assert_true(WIFEXITED(result.status) && WEXITSTATUS(result.status) == 0);
    assert_non_null(strstr(result.output, "double free"));
    assert_non_null(strstr(result.output, "is not an object of pool"));
    assert_non_null(strstr(result.output, " was destroyed; leaking it and going on\n"));
    assert_non_null(strstr(result.output, "; leaking it and going on\n"));
}

static atomic_int fork_test_stop;

static void *pool_user(void *arg)
{
    cmalloc_pool *pool = arg;
    void *held[64] = {0};
    for (unsigned i = 0; !atomic_load(&fork_test_stop); i++) {
        unsigned slot = i % 64;
        cmalloc_pool_free(pool, held[slot]);
        held[slot] = cmalloc_pool_alloc(pool);
    }
    for (unsigned slot = 0; slot < 64; slot++)
        cmalloc_pool_free(pool, held[slot]);
    return NULL;
}

static void fork_beside_pool_threads(void **state)
{
    (void)state;
    cmalloc_pool *pool = cmalloc_pool_create(48, 256, CMALLOC_POOL_GROW | CMALLOC_POOL_THREAD_SAFE);
    assert_non_null(pool);
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, pool_user, pool), 0);
    int stuck = 0;
    for (int i = 0; i < 200 && !stuck; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(5);
            void *objects[100];
            for (int j = 0; j < 100; j++)
                objects[j] = cmalloc_pool_alloc(pool);
            for (int j = 0; j < 100; j++)
                cmalloc_pool_free(pool, objects[j]);
            _exit(0);
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        stuck += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    atomic_store(&fork_test_stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    cmalloc_pool_destroy(pool);
    if (stuck)
        fail_msg("a child could not use the pool within 5 s (a lock held across fork)");
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--keep-going") == 0)
        return keep_going_child();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(alignment_for_every_size),
        cmocka_unit_test(objects_distinct_and_reused),
        cmocka_unit_test(fixed_pool_fills_to_capacity),
        cmocka_unit_test(refill_takes_a_full_word),
        cmocka_unit_test(grow_pool_keeps_addresses),
        cmocka_unit_test(random_against_model),
        cmocka_unit_test(thread_safe_pool_4_threads),
        cmocka_unit_test(thread_safe_pool_never_strands),
        cmocka_unit_test(memory_in_stats_and_released),
        cmocka_unit_test(bad_arguments),
        cmocka_unit_test(death_double_free),
        cmocka_unit_test(death_foreign_pointers),
        cmocka_unit_test(death_past_a_fixed_pool),
        cmocka_unit_test(death_free_of_a_pool_object),
        cmocka_unit_test(death_use_after_destroy),
        cmocka_unit_test(keep_going),
        cmocka_unit_test(fork_beside_pool_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
