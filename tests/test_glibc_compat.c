/* test_glibc_compat.c - what programs expect of the malloc family beyond malloc and free, each
 * written as a program hits it, compared with what glibc does.
 *
 * Linked with build/libcmalloc.a by the Makefile, so cmalloc serves every call here.
 *
 *   errno_left_alone            errno set to a sentinel survives every successful call of the
 *                               family (free, realloc, calloc, the aligned forms, trim, stats,
 *                               mallinfo2, malloc_usable_size, malloc_info), of every size
 *   errno_at_mapping_limit      a mapped block whose mapping the kernel merged with neighbours
 *                               on both sides is freed while the process is at
 *                               vm.max_map_count: munmap fails (the cut needs one more
 *                               mapping); free leaves errno alone
 *   memalign_limits             memalign above SIZE_MAX/2+1: NULL, EINVAL (glibc); just below:
 *                               NULL, ENOMEM
 *   mallopt_as_glibc            mallopt answers as glibc 2.36: 1 for every threshold (above
 *                               32 MiB and negative too) and every parameter it ignores, 0
 *                               for an M_MXFAST above 160 or negative; a threshold above a
 *                               block's size keeps it off its own mapping (hblkhd), one below
 *                               maps it; glibc's internal names __libc_mallopt and
 *                               __libc_mallinfo are cmalloc's mallopt and mallinfo
 *   impossible_sizes_fail_fast  2^47..2^64 byte requests through every entry point fail with
 *                               ENOMEM and unmap nothing the heap keeps (no reclaim and retry)
 *   mallinfo_under_threads      a thread maps and unmaps 4 MiB blocks while mallinfo2 is read
 *                               10000 times: arena never underflows, uordblks <= arena, and a
 *                               64 MiB block counts in hblkhd only
 *   malloc_info_is_cmallocs     malloc_info writes glibc's XML shape with cmalloc's mapped
 *                               block in it (not glibc's own empty arena)
 *   malloc_stats_with_cancel    a thread with a cancel pending calls malloc_stats: the report is
 *                               written and the call returns (glibc does not act on the cancel
 *                               inside malloc_stats either)
 *   late_destructor_caches      1000 threads whose first allocation happens in the last round
 *                               of pthread key destructors: after joining them, at most the
 *                               main thread's cache (and one in passing) is alive
 * Runtime: about 2 s.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "cmalloc.h"
#include "helpers.h"

/* glibc's internal names for mallopt and mallinfo, which cmalloc exports too; glibc's
 * headers do not declare them. */
int __libc_mallopt(int param, int value);
struct mallinfo __libc_mallinfo(void);

#define SENTINEL 4242

#define EXPECT_ERRNO_KEPT(call)                               \
    do {                                                      \
        errno = SENTINEL;                                     \
        call;                                                 \
        if (errno != SENTINEL)                                \
            fail_msg("%s changed errno to %d", #call, errno); \
    } while (0)

#define EXPECT_ENOMEM(call)                                                \
    do {                                                                   \
        errno = 0;                                                         \
        if ((call) != NULL || errno != ENOMEM)                             \
            fail_msg("%s: not NULL with ENOMEM (errno %d)", #call, errno); \
    } while (0)

static void errno_left_alone(void **state)
{
    (void)state;
    static const size_t sizes[] = {0, 1, 48, 4000, 70 * KiB, 300 * KiB, 3 * MiB, 40 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t size = sizes[i];
        void *p, *q;
        EXPECT_ERRNO_KEPT(p = malloc(size));
        assert_non_null(p);
        EXPECT_ERRNO_KEPT(opaque((void *)malloc_usable_size(p)));
        EXPECT_ERRNO_KEPT(q = realloc(p, size * 2 + 16));
        assert_non_null(q);
        EXPECT_ERRNO_KEPT(q = realloc(q, size / 2 + 1));
        EXPECT_ERRNO_KEPT(free(q));
        EXPECT_ERRNO_KEPT(p = calloc(1, size));
        EXPECT_ERRNO_KEPT(free(p));
        EXPECT_ERRNO_KEPT(p = aligned_alloc(4096, size));
        EXPECT_ERRNO_KEPT(free(p));
        EXPECT_ERRNO_KEPT(p = memalign(64, size));
        EXPECT_ERRNO_KEPT(free(p));
        EXPECT_ERRNO_KEPT(assert_int_equal(posix_memalign(&p, 256, size), 0));
        EXPECT_ERRNO_KEPT(free(p));
        EXPECT_ERRNO_KEPT(free(valloc(size)));
    }
    EXPECT_ERRNO_KEPT(free(NULL));
    EXPECT_ERRNO_KEPT(malloc_trim(0));
    EXPECT_ERRNO_KEPT(opaque((void *)mallinfo2().arena));
    FILE *null = fopen("/dev/null", "w");
    assert_non_null(null);
    EXPECT_ERRNO_KEPT(malloc_info(0, null));
    fclose(null);
}

static void exit_with(void *body)
{
    _exit((*(int (**)(void))body)());
}

/* Runs body in a child (it may exhaust the mapping count); fails with its output unless it
 * exits 0. */
static void in_child(int (*body)(void), const char *what)
{
    static child_result result;
    child_spec spec = {.body = exit_with, .arg = &body, .with_stdout = true, .alarm_seconds = 60};
    run_child(&spec, &result);
    printf("%s", result.output);
    if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0)
        fail_msg("%s: child status 0x%x", what, result.status);
}

/* Whether the mapping holding [start, start + size) begins before it and ends after it. */
static bool mapping_extends_both_ways(char *start, size_t size)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    bool extends = false;
    while (maps != NULL && fgets(line, sizeof line, maps) != NULL) {
        uintptr_t low, high;
        if (sscanf(line, "%lx-%lx", &low, &high) == 2 && low <= (uintptr_t)start &&
            (uintptr_t)start < high)
            extends = low < (uintptr_t)start && high > (uintptr_t)start + size;
    }
    if (maps != NULL)
        fclose(maps);
    return extends;
}

/* A mapped block of size bytes whose mapping the kernel merged with neighbours on both sides,
 * so that unmapping the block alone cuts that mapping in three. Pages of the same protection
 * are mapped right before and after it before it is touched (so nothing keeps them apart);
 * where a neighbour is there already and will not merge, the next block is tried. */
static char *block_inside_a_mapping(size_t size)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
    for (int attempt = 0; attempt < 16; attempt++) {
        char *block = malloc(size), *after = block + size, *before = block - 4096;
        if (block == NULL)
            return NULL;
        if (mmap(after, 4096, PROT_READ | PROT_WRITE, flags, -1, 0) == after)
            after[0] = 1;
        if (mmap(before, 4096, PROT_READ | PROT_WRITE, flags, -1, 0) == before)
            before[0] = 1;
        memset(block, 1, size);
        if (mapping_extends_both_ways(block, size))
            return block;
    }
    return NULL;
}

static int mapping_limit_child(void)
{
    mallopt(M_MMAP_THRESHOLD, (int)(1 * MiB)); /* fixed: the block below gets its own mmap */
    char *block = block_inside_a_mapping(4 * MiB);
    if (block == NULL)
        return 11;
    /* Use up the mapping count with pages of alternating protection (they cannot merge). */
    size_t made = 0;
    for (;;) {
        void *page =
            mmap(NULL, 4096, made % 2 ? PROT_READ : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page == MAP_FAILED)
            break;
        if (++made > 1000000)
            return 12;
    }
    errno = SENTINEL;
    free(block);
    int after_free = errno;
    printf("mapping limit reached after %zu more mappings; errno after free: %d\n", made,
           after_free);
    return after_free == SENTINEL ? 0 : 13;
}

static void errno_at_mapping_limit(void **state)
{
    (void)state;
    in_child(mapping_limit_child, "free at the mapping limit changed errno");
}

static void memalign_limits(void **state)
{
    (void)state;
    errno = 0;
    assert_null(memalign(SIZE_MAX / 2 + 2, 16));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(memalign(SIZE_MAX, 16));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(memalign(SIZE_MAX / 2 + 1, 16));
    assert_int_equal(errno, ENOMEM);
}

/* Programs check mallopt's answer (some stop unless mallopt(M_MMAP_THRESHOLD, n) is 1): the
 * answers are glibc 2.36's, measured there with this test's calls. */
static void mallopt_as_glibc(void **state)
{
    (void)state;
    assert_int_equal(mallopt(M_MMAP_THRESHOLD, (int)(32 * MiB + 1)), 1);
    assert_int_equal(mallopt(M_MMAP_THRESHOLD, INT_MAX), 1);
    assert_int_equal(mallopt(M_MMAP_THRESHOLD, -1), 1);
    assert_int_equal(mallopt(M_MMAP_THRESHOLD, 0), 1);
    assert_int_equal(mallopt(M_MXFAST, 0), 1);
    assert_int_equal(mallopt(M_MXFAST, 160), 1);
    assert_int_equal(mallopt(M_MXFAST, 161), 0);
    assert_int_equal(mallopt(M_MXFAST, -1), 0);
    assert_int_equal(mallopt(M_TRIM_THRESHOLD, -1), 1);
    assert_int_equal(mallopt(M_ARENA_MAX, 0), 1);
    assert_int_equal(mallopt(0, 1), 1);
    assert_int_equal(mallopt(12345, 1), 1);
    /* a threshold above 32 MiB is honoured: a 48 MiB block under a 64 MiB one stays in the page
     * heap, and gets its own mapping once the threshold is back at 1 MiB */
    assert_int_equal(mallopt(M_MMAP_THRESHOLD, (int)(64 * MiB)), 1);
    size_t mapped = mallinfo2().hblkhd;
    char *block = malloc(48 * MiB);
    assert_non_null(block);
    block[0] = block[48 * MiB - 1] = 1;
    assert_int_equal(mallinfo2().hblkhd, mapped);
    free(block);
    assert_int_equal(mallopt(M_MMAP_THRESHOLD, (int)(1 * MiB)), 1);
    block = malloc(48 * MiB);
    assert_non_null(block);
    assert_true(mallinfo2().hblkhd >= mapped + 48 * MiB);
    free(block);
    /* the same through glibc's internal names, which once reached glibc's own malloc: the
     * threshold was lost and mallinfo's figures were its empty arena's */
    assert_int_equal(__libc_mallopt(M_MMAP_THRESHOLD, (int)(64 * MiB)), 1);
    mapped = mallinfo2().hblkhd;
    block = malloc(48 * MiB);
    assert_non_null(block);
    block[0] = block[48 * MiB - 1] = 1;
    assert_int_equal(mallinfo2().hblkhd, mapped);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo via_alias = __libc_mallinfo(), direct = mallinfo();
#pragma GCC diagnostic pop
    /* 4 KiB of slack between the two reads, as test_api's mallinfo test allows: a release
     * thread that an earlier free started may still be allocating its own few hundred bytes */
    assert_true(via_alias.uordblks >= (int)(48 * MiB));
    assert_true(abs(via_alias.uordblks - direct.uordblks) <= 4096);
    assert_int_equal(via_alias.hblkhd, direct.hblkhd);
    free(block);
    assert_int_equal(__libc_mallopt(M_MMAP_THRESHOLD, (int)(1 * MiB)), 1);
    block = malloc(48 * MiB);
    assert_non_null(block);
    assert_true(__libc_mallinfo().hblkhd >= (int)(mapped + 48 * MiB));
    free(block);
}

static void impossible_sizes_fail_fast(void **state)
{
    (void)state;
    /* Free page-heap memory that a reclaim-and-retry would unmap. */
    void *blocks[8];
    for (int i = 0; i < 8; i++)
        memset(blocks[i] = malloc(512 * KiB), 1, 512 * KiB);
    for (int i = 0; i < 8; i++)
        free(blocks[i]);
    cmalloc_stats before, after;
    cmalloc_stats_get(&before);
    for (int shift = 47; shift < 64; shift++) {
        size_t size = ((size_t)1 << shift) + 1;
        void *p = (void *)1, *small = malloc(100);
        EXPECT_ENOMEM(malloc(size));
        EXPECT_ENOMEM(calloc(1, size));
        EXPECT_ENOMEM(memalign(64, size));
        EXPECT_ENOMEM(valloc(size));
        EXPECT_ENOMEM(aligned_alloc(4096, size));
        EXPECT_ENOMEM(realloc(small, size));
        assert_int_equal(posix_memalign(&p, 64, size), ENOMEM);
        free(small);
    }
    cmalloc_stats_get(&after);
    if (after.bytes_mapped < before.bytes_mapped)
        fail_msg("impossible requests unmapped %zu bytes of the heap (a reclaim and retry)",
                 before.bytes_mapped - after.bytes_mapped);
}

static atomic_int mapper_stop;

static void *mapper(void *arg)
{
    (void)arg;
    while (!atomic_load(&mapper_stop)) {
        void *p = malloc(40 * MiB);
        ((volatile char *)p)[0] = 1;
        free(p);
    }
    return NULL;
}

static void mallinfo_under_threads(void **state)
{
    (void)state;
    char *big = malloc(64 * MiB);
    assert_non_null(big);
    memset(big, 1, 64 * MiB);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, mapper, NULL), 0);
    for (int i = 0; i < 10000; i++) {
        struct mallinfo2 info = mallinfo2();
        if (info.arena > ((size_t)1 << 48) || info.uordblks > info.arena ||
            info.hblkhd < 64 * MiB || info.uordblks >= 64 * MiB)
            fail_msg("mallinfo2: arena %zu, uordblks %zu, hblkhd %zu, hblks %zu", info.arena,
                     info.uordblks, info.hblkhd, info.hblks);
    }
    atomic_store(&mapper_stop, 1);
    pthread_join(thread, NULL);
    free(big);
}

static void malloc_info_is_cmallocs(void **state)
{
    (void)state;
    void *big = malloc(48 * MiB);
    char *text = NULL;
    size_t length = 0;
    FILE *stream = open_memstream(&text, &length);
    assert_non_null(stream);
    assert_int_equal(malloc_info(0, stream), 0);
    fclose(stream);
    assert_non_null(strstr(text, "<malloc version=\"1\">"));
    assert_non_null(strstr(text, "</malloc>"));
    char expected[128];
    snprintf(expected, sizeof expected, "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>",
             mallinfo2().hblks, mallinfo2().hblkhd);
    if (strstr(text, expected) == NULL || mallinfo2().hblkhd < 48 * MiB)
        fail_msg("malloc_info lacks %s:\n%s", expected, text);
    free(text);
    free(big);
    assert_int_equal(malloc_info(1, stderr), EINVAL);
}

static atomic_int cancel_sent, stats_returned;

static void *stats_thread(void *arg)
{
    (void)arg;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
    while (!atomic_load(&cancel_sent))
        usleep(1000);
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL); /* the cancel is pending now */
    malloc_stats();
    atomic_store(&stats_returned, 1);
    pthread_testcancel();
    return NULL;
}

static void malloc_stats_with_cancel(void **state)
{
    (void)state;
    char path[] = "/tmp/cmalloc-stats-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    int saved_stderr = dup(2);
    dup2(fd, 2);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, stats_thread, NULL), 0);
    assert_int_equal(pthread_cancel(thread), 0);
    atomic_store(&cancel_sent, 1);
    void *result;
    pthread_join(thread, &result);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    off_t written = lseek(fd, 0, SEEK_END);
    close(fd);
    assert_ptr_equal(result, PTHREAD_CANCELED);
    if (!atomic_load(&stats_returned) || written <= 0)
        fail_msg("malloc_stats was cancelled inside (returned: %d, %lld bytes written)",
                 atomic_load(&stats_returned), (long long)written);
}

static pthread_key_t late_key;

/* Re-arms itself for three rounds, then allocates in the fourth, the last glibc runs
 * (PTHREAD_DESTRUCTOR_ITERATIONS): the thread's first allocation, so its cache is created
 * after glibc stopped looking at new key values. */
static void late_destructor(void *value)
{
    uintptr_t round = (uintptr_t)value;
    if (round < 4) {
        pthread_setspecific(late_key, (void *)(round + 1));
        return;
    }
    void *p = malloc(64);
    memset(p, 1, 64);
    free(p);
}

static void *late_thread(void *arg)
{
    (void)arg;
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}

static void late_destructor_caches(void **state)
{
    (void)state;
    assert_int_equal(pthread_key_create(&late_key, late_destructor), 0);
    for (int i = 0; i < 1000; i++) {
        pthread_t thread;
        assert_int_equal(pthread_create(&thread, NULL, late_thread, NULL), 0);
        pthread_join(thread, NULL);
    }
    cmalloc_stats stats;
    cmalloc_stats_get(&stats);
    printf("after 1000 threads that first allocated in their last destructor round: %zu caches\n",
           stats.thread_caches);
    if (stats.thread_caches > 2)
        fail_msg("%zu thread caches alive: the late threads' caches leaked", stats.thread_caches);
    pthread_key_delete(late_key);
}

int main(void)
{
    start_watchdog("test_glibc_compat", 120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(errno_left_alone),         cmocka_unit_test(errno_at_mapping_limit),
        cmocka_unit_test(memalign_limits),          cmocka_unit_test(mallopt_as_glibc),
        cmocka_unit_test(impossible_sizes_fail_fast),
        cmocka_unit_test(mallinfo_under_threads),   cmocka_unit_test(malloc_info_is_cmallocs),
        cmocka_unit_test(malloc_stats_with_cancel), cmocka_unit_test(late_destructor_caches),
    };
    return cmocka_run_group_tests_name("glibc_compat", tests, NULL, NULL);
}
