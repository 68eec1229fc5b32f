/* prof_reports.c - the program tests/test_prof_reports.sh runs, built WITHOUT -rdynamic (its
 * functions are in its .symtab only, as in any ordinary build), dynamically under
 * LD_PRELOAD=libcmalloc.so and statically linked with libcmalloc.a. One mode per run (argv[1]);
 * each allocating or faulting function has a name the test looks for.
 *
 *   work N          allocates N blocks of 1000 bytes from allocate_in_work_function and keeps
 *                   them (a profile has samples naming it)
 *   nothing         allocates nothing of its own
 *   children N      runs N copies of itself in mode `work 2000`, one after another, then does
 *                   the same work itself
 *   leak            leaks 4000 blocks of 1000 bytes from leaky_function
 *   leak-dlopen PLUGIN  leaks from 24 stacks while a second thread loads and unloads PLUGIN
 *                   without end (dlopen allocates under the loader's lock), then returns from
 *                   main: the leak report at exit meets a thread inside dlopen
 *   overflow        writes 12 bytes past the end of a 100-byte block from make_block, in
 *                   write_past_end
 *   use-after-free  writes into a 100-byte block after drop_block freed it
 *   overflow-memset writes past the end of a 100-byte block from make_block with libc's memset,
 *                   called from memset_past_end (the fault is inside libc)
 *   raise | kill | pthread_kill   sends itself SIGSEGV that way; prints "survived" and exits 1
 *                   when it is still alive after it
 *   signal-dump SIG allocates, raises the signal named SIG (CMALLOC_PROF_SIGNAL's), allocates
 *                   again (the next slow path writes the dump), twice
 *   check-overflow | check-double-free | check-write-after-free | check-quarantine
 *                   the errors CMALLOC_CHECK reports, from named functions (check-quarantine:
 *                   a write to a freed block that is still quarantined when the program ends)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile char sink;

__attribute__((noinline)) void *allocate_in_work_function(size_t size)
{
    void *p = malloc(size);
    if (p != NULL)
        memset(p, 1, size);
    return p;
}

static int work(long count)
{
    for (long i = 0; i < count; i++)
        if (allocate_in_work_function(1000) == NULL)
            return 1;
    return 0;
}

static int children(const char *self, int count)
{
    for (int i = 0; i < count; i++) {
        pid_t child = fork();
        if (child == 0) {
            execl(self, self, "work", "2000", (char *)NULL);
            _exit(127);
        }
        int status;
        if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            return 1;
    }
    return work(2000);
}

__attribute__((noinline)) void *leaky_function(size_t size)
{
    return malloc(size);
}

static int leak(void)
{
    for (int i = 0; i < 4000; i++)
        leaky_function(1000);
    return 0;
}

/* Distinct stacks of different depths: depth d leaks from a chain of d calls. */
__attribute__((noinline)) void *leak_at_depth(int depth, size_t size)
{
    void *p = depth == 0 ? malloc(size) : leak_at_depth(depth - 1, size);
    sink = *(volatile char *)&depth; /* not a tail call: each depth keeps its frame */
    return p;
}

static void *load_forever(void *plugin)
{
    for (;;) {
        void *library = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
        if (library == NULL) {
            fprintf(stderr, "dlopen %s: %s\n", (const char *)plugin, dlerror());
            _exit(3);
        }
        dlclose(library);
    }
    return NULL;
}

static int leak_dlopen(char *plugin)
{
    pthread_t thread;
    if (pthread_create(&thread, NULL, load_forever, plugin) != 0)
        return 1;
    for (int round = 0; round < 200; round++)
        for (int depth = 0; depth < 24; depth++)
            leak_at_depth(depth, 100);
    usleep(2000);
    return 0; /* exit with the thread inside dlopen or dlclose */
}

__attribute__((noinline)) char *make_block(size_t size)
{
    return malloc(size);
}

__attribute__((noinline)) void write_past_end(char *p, size_t size)
{
    ((volatile char *)p)[size + 12] = 'x'; /* past the 16-byte rounding, into the guard page */
}

static volatile size_t memset_overrun = 64; /* not a constant: memset is called, not inlined */

__attribute__((noinline)) void memset_past_end(char *p, size_t size)
{
    memset(p, 'x', size + memset_overrun);
    sink = p[0]; /* not a tail call: memset_past_end keeps its frame */
}

__attribute__((noinline)) void drop_block(char *p)
{
    free(p);
}

__attribute__((noinline)) void write_after_drop(char *p)
{
    ((volatile char *)p)[10] = 'x';
}

static void *send_to_self(void *how)
{
    if (strcmp(how, "raise") == 0)
        raise(SIGSEGV);
    else if (strcmp(how, "kill") == 0)
        kill(getpid(), SIGSEGV);
    else
        pthread_kill(pthread_self(), SIGSEGV);
    return NULL;
}

/* The signal a name means (INT, SIGRTMIN+3, SIGRTMAX-1), as a user reads it. */
static int signal_by_name(const char *name)
{
    if (strncmp(name, "SIG", 3) == 0)
        name += 3;
    if (strncmp(name, "RTMIN", 5) == 0)
        return SIGRTMIN + (name[5] == '+' ? atoi(name + 6) : 0);
    if (strncmp(name, "RTMAX", 5) == 0)
        return SIGRTMAX - (name[5] == '-' ? atoi(name + 6) : 0);
    for (int number = 1; number < SIGRTMIN; number++)
        if (sigabbrev_np(number) != NULL && strcmp(sigabbrev_np(number), name) == 0)
            return number;
    return 0;
}

static int signal_dump(int number)
{
    for (int i = 0; i < 2; i++) {
        free(allocate_in_work_function(100));
        raise(number);
        for (int j = 0; j < 100; j++)
            free(allocate_in_work_function(100 + j));
    }
    return 0;
}

__attribute__((noinline)) void overflow_checked_block(char *p, size_t size)
{
    ((volatile char *)p)[size] = 'x';
}

__attribute__((noinline)) void free_checked_block(char *p)
{
    free(p);
}

/* A guarded block's misuse, named after the mode: written past its end, by the program or by
 * memset, or after its free. */
static int guard_misuse(const char *mode)
{
    char *p = make_block(100);
    if (strcmp(mode, "use-after-free") == 0) {
        drop_block(p);
        write_after_drop(p);
    } else if (strcmp(mode, "overflow-memset") == 0) {
        memset_past_end(p, 100);
    } else {
        write_past_end(p, 100);
    }
    return 1;
}

/* A checked block's misuse, named after check-: overflow, double-free, write-after-free (then
 * 5000 frees push it out of the quarantine), quarantine (the program ends with it there). */
static int check_misuse(const char *what)
{
    bool written_after_free = strcmp(what, "write-after-free") == 0 || strcmp(what, "quarantine") == 0;
    char *p = make_block(200);
    if (strcmp(what, "overflow") == 0)
        overflow_checked_block(p, 200);
    free_checked_block(p);
    if (strcmp(what, "double-free") == 0)
        free_checked_block(p);
    if (written_after_free)
        write_after_drop(p);
    for (int i = 0; strcmp(what, "write-after-free") == 0 && i < 5000; i++)
        free_checked_block(make_block(200));
    return strcmp(what, "quarantine") == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "work") == 0 && argc > 2)
        return work(atol(argv[2]));
    if (strcmp(mode, "nothing") == 0)
        return 0;
    if (strcmp(mode, "children") == 0 && argc > 2)
        return children(argv[0], atoi(argv[2]));
    if (strcmp(mode, "leak") == 0)
        return leak();
    if (strcmp(mode, "leak-dlopen") == 0 && argc > 2)
        return leak_dlopen(argv[2]);
    if (strcmp(mode, "overflow") == 0 || strcmp(mode, "use-after-free") == 0 ||
        strcmp(mode, "overflow-memset") == 0)
        return guard_misuse(mode);
    if (strcmp(mode, "raise") == 0 || strcmp(mode, "kill") == 0 ||
        strcmp(mode, "pthread_kill") == 0) {
        /* Some guarded blocks first, so that the guard is at work. */
        for (int i = 0; i < 100; i++)
            free(make_block(100));
        if (strcmp(mode, "pthread_kill") == 0) {
            pthread_t thread;
            pthread_create(&thread, NULL, send_to_self, (void *)mode);
            pthread_join(thread, NULL);
        } else {
            send_to_self((void *)mode);
        }
        puts("survived");
        return 1;
    }
    if (strcmp(mode, "signal-dump") == 0 && argc > 2)
        return signal_dump(signal_by_name(argv[2]));
    if (strncmp(mode, "check-", 6) == 0)
        return check_misuse(mode + 6);
    fprintf(stderr, "usage: %s MODE ...\n", argv[0]);
    return 2;
}
