/* prof_program.c - the program tests/test_prof.sh runs under LD_PRELOAD=libcmalloc.so with the
 * profiler or guarded allocations on. Built with -rdynamic so that dladdr names its functions.
 * One mode per run (argv[1]); each allocating function has a name the test looks for.
 *
 *   estimate PATH   a known heap (mixed sizes, some large, half of it freed, some made by a second
 *                   thread and freed by the first), profile dumped to PATH; prints the truth
 *   leak            leaks from leaky_function, frees everything else
 *   overflow        writes past the end of a block from make_buffer
 *   use-after-free  writes to a block from make_buffer after release_buffer freed it
 *   use-after-free-later  the same after 150 more blocks were made and freed (with the guard,
 *                   slots opened in runs since the free)
 *   overflow-in-run writes past the end of a guarded block whose guard page lies inside a run
 *                   of slots opened together (its mapping readable and writable in
 *                   /proc/self/maps, the kernel's guard marker alone stopping the write); exits
 *                   2 when no such block turns up
 *   use-after-free-in-run  writes to a guarded block freed while its slot lay in a run opened
 *                   ahead of the guard's cursor; exits 2 when it never did
 *   double-free     frees a block from make_buffer twice
 *   signal PATH     raises CMALLOC_PROF_SIGNAL's signal, then allocates (the next slow path writes
 *                   PATH.<pid>.0.heap)
 *   fork            threads allocate and free while the main thread forks; children allocate,
 *                   dump a profile and exit
 *   dlopen PLUGIN N threads allocate and free while the main thread loads and unloads PLUGIN
 *                   (tests/data/prof_plugin.c) N times, calling it in between
 *   many N          keeps N small blocks (to fill the sample table)
 *   mixed N         N blocks of 16 B - 8 KiB allocated and freed, then the stats
 *   release N       the same, then cmalloc_release, then the stats
 *   replace N K PATH  keeps N blocks, then K times frees a random one and allocates another in
 *                   its place (the churn the sampler sees least of: README measures it); dumps
 *                   to PATH and prints the truth
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmalloc.h"

#define KEPT 40000

static void **kept;
static size_t kept_sizes[KEPT];

static unsigned next_random(unsigned *state)
{
    *state = *state * 1103515245u + 12345u;
    return *state >> 8;
}

__attribute__((noinline)) void *estimate_small(size_t size)
{
    return malloc(size);
}
__attribute__((noinline)) void *estimate_large(size_t size)
{
    return malloc(size);
}
__attribute__((noinline)) void *leaky_function(size_t size)
{
    return malloc(size);
}
__attribute__((noinline)) char *make_buffer(size_t size)
{
    return malloc(size);
}
__attribute__((noinline)) void release_buffer(char *p)
{
    free(p);
}

/* Whether the page at address is mapped readable and writable (/proc/self/maps, read without
 * allocating: with the guard on, an allocation would move the guard's cursor). */
static int page_open(uintptr_t address)
{
    static char maps[1 << 20];
    int fd = open("/proc/self/maps", O_RDONLY);
    size_t length = 0;
    ssize_t got;
    while (fd >= 0 && length < sizeof maps - 1 &&
           (got = read(fd, maps + length, sizeof maps - 1 - length)) > 0)
        length += (size_t)got;
    if (fd >= 0)
        close(fd);
    maps[length] = '\0';
    for (char *line = maps; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "") {
        unsigned long start, end;
        char permissions[8];
        if (sscanf(line, "%lx-%lx %7s", &start, &end, permissions) == 3 && address >= start &&
            address < end)
            return permissions[0] == 'r' && permissions[1] == 'w';
    }
    return 0;
}

/* Overflows a guarded block whose next slot is live too and whose guard page an opening of
 * several slots at once made accessible: only the guard marker stops the write. */
static int overflow_in_run(void)
{
    enum { BLOCKS = 40, PAGE = 4096 };
    char *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++)
        blocks[i] = make_buffer(100);
    for (int i = 0; i + 1 < BLOCKS; i++) {
        uintptr_t guard = ((uintptr_t)blocks[i] | (PAGE - 1)) + 1;
        if ((uintptr_t)blocks[i + 1] == (uintptr_t)blocks[i] + 2 * PAGE && page_open(guard)) {
            for (int j = 0; j < 200; j++)
                ((volatile char *)blocks[i])[j] = 1;
            return 0;
        }
    }
    fprintf(stderr, "overflow-in-run: no block before an opened guard page\n");
    return 2;
}

/* Frees a guarded block while the run of slots just opened ahead of the guard's cursor holds
 * it, then writes to it: the free must have closed its page all the same. Blocks are made and
 * freed until one comes from a slot at most 8 before a kept block and the slot after the kept
 * block is open. Two kept blocks two slots apart: a kept block where a run would start pushes
 * the run past it, but then the other lies inside that run. */
static int use_after_free_in_run(void)
{
    enum { PAGE = 4096 };
    uintptr_t kept[2];
    for (int k = 0; k < 2; k++) {
        kept[k] = (uintptr_t)make_buffer(100);
        release_buffer(make_buffer(100));
    }
    for (int i = 0; i < 1 << 20; i++) {
        char *q = make_buffer(100);
        release_buffer(q);
        uintptr_t q_page = (uintptr_t)q & ~(uintptr_t)(PAGE - 1);
        for (int k = 0; k < 2; k++) {
            uintptr_t kept_page = kept[k] & ~(uintptr_t)(PAGE - 1);
            if (q_page < kept_page && kept_page - q_page <= 8 * 2 * PAGE &&
                page_open(kept_page + 2 * PAGE)) {
                release_buffer((char *)kept[k]);
                ((volatile char *)kept[k])[10] = 1;
                return 0;
            }
        }
    }
    fprintf(stderr, "use-after-free-in-run: no kept block ever lay in an opened run\n");
    return 2;
}

/* Writes the profile and prints the true live bytes for the test to compare. */
static int dump_and_print(const char *path, size_t live)
{
    if (cmalloc_prof_dump(path) != 0) {
        perror("cmalloc_prof_dump");
        return 1;
    }
    printf("%zu\n", live);
    return 0;
}

static void *second_thread(void *arg)
{
    size_t *made = arg;
    unsigned state = 7;
    for (size_t i = KEPT / 2; i < KEPT; i++) {
        kept_sizes[i] = 16 + next_random(&state) % 3000;
        kept[i] = estimate_small(kept_sizes[i]);
        *made += kept_sizes[i];
    }
    return NULL;
}

static int estimate(const char *path)
{
    size_t live = 0, thread_made = 0;
    unsigned state = 1;
    kept = calloc(KEPT, sizeof *kept);
    live += KEPT * sizeof *kept; /* profiled too */
    for (size_t i = 0; i < KEPT / 2; i++) {
        kept_sizes[i] =
            i % 1000 == 1 ? 300000 + next_random(&state) % 200000 : 16 + next_random(&state) % 3000;
        kept[i] =
            kept_sizes[i] > 4096 ? estimate_large(kept_sizes[i]) : estimate_small(kept_sizes[i]);
        live += kept_sizes[i];
    }
    pthread_t thread;
    pthread_create(&thread, NULL, second_thread, &thread_made);
    pthread_join(thread, NULL);
    live += thread_made;
    for (size_t i = 0; i < KEPT; i += 2) { /* half, in both threads' blocks, freed here */
        free(kept[i]);
        live -= kept_sizes[i];
    }
    return dump_and_print(path, live);
}

static int leak(void)
{
    for (int i = 0; i < 4000; i++)
        leaky_function(1000);
    for (int i = 0; i < 4000; i++)
        free(malloc(1000));
    return 0;
}

__attribute__((noinline)) void *replace_block(size_t size)
{
    return malloc(size);
}

static int replace(size_t count, size_t times, const char *path)
{
    void **blocks = calloc(count, sizeof *blocks);
    size_t *sizes = calloc(count, sizeof *sizes), live = 2 * count * sizeof(void *);
    unsigned state = 5;
    for (size_t i = 0; i < count; i++) {
        sizes[i] = 16 + next_random(&state) % 1000;
        blocks[i] = replace_block(sizes[i]);
        live += sizes[i];
    }
    for (size_t k = 0; k < times; k++) {
        size_t i = next_random(&state) % count;
        free(blocks[i]);
        live -= sizes[i];
        sizes[i] = 16 + next_random(&state) % 1000;
        blocks[i] = replace_block(sizes[i]);
        live += sizes[i];
    }
    return dump_and_print(path, live);
}

static void *churn(void *arg)
{
    volatile int *stop = arg;
    unsigned state = 3;
    void *slots[64] = {0};
    while (!*stop) {
        unsigned i = next_random(&state) % 64;
        free(slots[i]);
        slots[i] = malloc(16 + next_random(&state) % 5000);
    }
    for (int i = 0; i < 64; i++)
        free(slots[i]);
    return NULL;
}

/* Loads and unloads a plugin times times while three threads allocate, every allocation sampled
 * (CMALLOC_PROF_RATE=1): the unwinders look up code ranges through the loader
 * (dl_iterate_phdr) inside malloc while dlopen and dlclose, which allocate, change them. */
static int dlopen_with_threads(const char *plugin, long times)
{
    volatile int stop = 0;
    pthread_t threads[3];
    for (int t = 0; t < 3; t++)
        pthread_create(&threads[t], NULL, churn, (void *)&stop);
    for (long i = 0; i < times; i++) {
        void *library = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
        void *(*plugin_alloc)(size_t) = library ? (void *(*)(size_t))dlsym(library, "plugin_alloc") : NULL;
        if (plugin_alloc == NULL) {
            fprintf(stderr, "dlopen %s: %s\n", plugin, dlerror());
            return 1;
        }
        for (int j = 0; j < 20; j++)
            free(plugin_alloc(100 + (size_t)j * 50));
        dlclose(library);
    }
    stop = 1;
    for (int t = 0; t < 3; t++)
        pthread_join(threads[t], NULL);
    printf("dlopen: %ld loads\n", times);
    return 0;
}

static int fork_with_threads(void)
{
    volatile int stop = 0;
    pthread_t threads[3];
    for (int t = 0; t < 3; t++)
        pthread_create(&threads[t], NULL, churn, (void *)&stop);
    for (int i = 0; i < 100; i++) {
        pid_t child = fork();
        if (child == 0) {
            for (int j = 0; j < 1000; j++)
                free(malloc(100 + j));
            if (i == 0)
                cmalloc_stats_print(1); /* the first child says which unwinder it uses */
            _exit(cmalloc_prof_dump("/dev/null") == 0 ? 0 : 3);
        }
        int status;
        if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            fprintf(stderr, "fork %d: child failed\n", i);
            return 1;
        }
    }
    stop = 1;
    for (int t = 0; t < 3; t++)
        pthread_join(threads[t], NULL);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    alarm(60); /* a hang is a failure, not a stuck test run */
    if (strcmp(mode, "estimate") == 0 && argc > 2)
        return estimate(argv[2]);
    if (strcmp(mode, "leak") == 0)
        return leak();
    if (strcmp(mode, "overflow") == 0) {
        volatile char *p = make_buffer(100);
        for (int i = 0; i < 200; i++)
            p[i] = 1;
        return 0;
    }
    if (strcmp(mode, "use-after-free") == 0) {
        char *p = make_buffer(100);
        release_buffer(p);
        ((volatile char *)p)[10] = 1;
        return 0;
    }
    if (strcmp(mode, "use-after-free-later") == 0) {
        char *p = make_buffer(100);
        release_buffer(p);
        for (int i = 0; i < 150; i++)
            release_buffer(make_buffer(100));
        ((volatile char *)p)[10] = 1;
        return 0;
    }
    if (strcmp(mode, "overflow-in-run") == 0)
        return overflow_in_run();
    if (strcmp(mode, "use-after-free-in-run") == 0)
        return use_after_free_in_run();
    if (strcmp(mode, "double-free") == 0) { /* twice, so the second finds a stashed page */
        char *p = make_buffer(100);
        release_buffer(p);
        release_buffer(p);
        return 0;
    }
    if (strcmp(mode, "signal") == 0) {
        raise(SIGUSR2);
        for (int i = 0; i < 1000; i++) /* kept, so that refills take the slow path */
            leaky_function(5000);
        return 0;
    }
    if (strcmp(mode, "fork") == 0)
        return fork_with_threads();
    if (strcmp(mode, "dlopen") == 0 && argc > 3)
        return dlopen_with_threads(argv[2], atol(argv[3]));
    if (strcmp(mode, "many") == 0 && argc > 2) {
        for (long i = 0; i < atol(argv[2]); i++)
            estimate_small(16);
        cmalloc_stats_print(1);
        return 0;
    }
    if (strcmp(mode, "errno") == 0) { /* sampled allocations and frees leave errno alone */
        long changed = 0;
        for (int i = 0; i < 20000; i++) {
            errno = 1234;
            void *p = estimate_small(100 + (size_t)(i % 3000));
            changed += errno != 1234;
            errno = 4321;
            free(p);
            changed += errno != 4321;
        }
        printf("errno changed %ld times\n", changed);
        return changed != 0;
    }
    if ((strcmp(mode, "mixed") == 0 || strcmp(mode, "release") == 0) && argc > 2) {
        unsigned seed = 1; /* n allocations of 16 B - 8 KiB, freed (then cmalloc_release) */
        for (long i = 0; i < atol(argv[2]); i++) {
            seed = seed * 1103515245u + 12345u;
            free(estimate_small((size_t)16 << (seed >> 16) % 10)); /* 16 B .. 8 KiB alike */
        }
        if (strcmp(mode, "release") == 0)
            cmalloc_release();
        cmalloc_stats_print(1);
        return 0;
    }
    if (strcmp(mode, "replace") == 0 && argc > 4)
        return replace((size_t)atol(argv[2]), (size_t)atol(argv[3]), argv[4]);
    fprintf(stderr, "usage: prof_program estimate PATH | leak | overflow | use-after-free "
                    "| use-after-free-later | overflow-in-run | use-after-free-in-run | signal "
                    "| double-free | fork | dlopen PLUGIN N | many N | mixed N | release N | errno | replace N K PATH\n");
    return 2;
}
