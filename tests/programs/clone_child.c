/* clone_child.c - children made without fork's atfork handlers, as container and sandbox tools
 * make them: glibc's clone() wrapper (with CLONE_NEWPID where the kernel lets us, as
 * `unshare --fork --pid` does) and a raw syscall(SYS_fork). Such a child keeps the parent
 * thread's cache, which still names the parent thread's kernel id; the child then starts
 * threads that allocate, hand blocks to each other and free them, and frees what its main
 * thread holds. An allocator that takes the main thread's live cache for an orphan (its thread
 * id is not in the child) gives two threads one set of lists: "corrupted free list", "block
 * overwritten by another thread" or SIGSEGV in about half the children. 8 children of each kind;
 * any child that does not exit 0 fails the run; a watchdog ends a hang. */
#define _GNU_SOURCE
#include "../watchdog.h"
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { CHILDREN = 8, THREADS = 4, BLOCKS = 2000, STACK = 256 * 1024 };

static void *held[BLOCKS]; /* the main thread's blocks, made before the child starts threads */

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void *mine[256] = {0};
    for (int round = 0; round < 20000; round++) {
        unsigned slot = (seed = seed * 1103515245u + 12345u) % 256;
        free(mine[slot]);
        mine[slot] = malloc(16 + (seed >> 8) % 2000);
        if (mine[slot] == NULL)
            return (void *)1;
        memset(mine[slot], (int)slot, 16);
    }
    for (int i = 0; i < 256; i++)
        free(mine[i]);
    return NULL;
}

/* The child's life: threads that allocate and free while the main thread keeps using its own
 * cache; the main thread's blocks are freed last. Returns the exit status. */
static int child_body(void *unused)
{
    (void)unused;
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&threads[i], NULL, worker, (void *)(size_t)(i + 1)) != 0)
            return 2;
    for (int round = 0; round < 20000; round++) { /* the main thread's cache stays in use */
        void *block = malloc(32 + round % 512);
        if (block == NULL)
            return 3;
        memset(block, 1, 32);
        free(block);
    }
    for (int i = 0; i < THREADS; i++) {
        void *result;
        if (pthread_join(threads[i], &result) != 0 || result != NULL)
            return 4;
    }
    for (int i = 0; i < BLOCKS; i++)
        free(held[i]);
    return 0;
}

static int wait_child(pid_t pid, const char *how, int number)
{
    int status;
    watchdog_child = pid;
    if (waitpid(pid, &status, 0) != pid) {
        fprintf(stderr, "clone_child: waitpid (%s %d): %s\n", how, number, strerror(errno));
        return 1;
    }
    watchdog_child = 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFSIGNALED(status))
        fprintf(stderr, "clone_child: %s child %d killed by signal %d\n", how, number,
                WTERMSIG(status));
    else
        fprintf(stderr, "clone_child: %s child %d exited %d\n", how, number, WEXITSTATUS(status));
    return 1;
}

int main(void)
{
    start_watchdog("clone_child", 60);
    char *stack = mmap(NULL, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack == MAP_FAILED)
        return 1;
    int failures = 0;
    int clone_flags = CLONE_NEWPID | SIGCHLD;
    for (int child = 0; child < CHILDREN; child++) {
        for (int i = 0; i < BLOCKS; i++)
            if ((held[i] = malloc(24 + i % 300)) == NULL)
                return 1;
        pid_t pid = clone(child_body, stack + STACK, clone_flags, NULL);
        if (pid < 0 && errno == EPERM && clone_flags != SIGCHLD) { /* no new PID namespace */
            fprintf(stderr, "clone_child: CLONE_NEWPID refused, plain clone() instead\n");
            clone_flags = SIGCHLD;
            pid = clone(child_body, stack + STACK, clone_flags, NULL);
        }
        if (pid < 0) {
            perror("clone_child: clone");
            return 1;
        }
        failures += wait_child(pid, "clone()", child);

        pid = (pid_t)syscall(SYS_fork);
        if (pid == 0)
            _exit(child_body(NULL));
        if (pid < 0) {
            perror("clone_child: syscall(SYS_fork)");
            return 1;
        }
        failures += wait_child(pid, "syscall(SYS_fork)", child);
        for (int i = 0; i < BLOCKS; i++)
            free(held[i]);
    }
    if (failures != 0) {
        fprintf(stderr, "clone_child: %d of %d children failed\n", failures, 2 * CHILDREN);
        return 1;
    }
    puts("clone_child: every child exited 0");
    return 0;
}
