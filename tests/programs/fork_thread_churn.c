/* fork_thread_churn.c - fork while other threads are being created and are exiting (their
 * caches being flushed and recycled), while two threads malloc/free and use stdio. 200 forks;
 * each child mallocs, starts a thread that mallocs, joins it, and exits 0. A child that hangs
 * (a lock copied held from an exiting thread) or crashes fails; a watchdog ends a hang.
 * One exception, with the profiler on (CMALLOC_PROF=1): cmalloc then dlopens libunwind, whose
 * TLS block every thread gets from malloc, and glibc's window of fork_dlopen_tls.c opens: a
 * thread reusing a cached stack in pthread_create frees the previous thread's block and clears
 * the table only after, so a fork in between has the child (in its own pthread_create) free it
 * again, which cmalloc reported as a double free and aborted: 3 of 30 runs had one such child
 * (`for i in $(seq 30); do CMALLOC_PROF=1 CMALLOC_PROF_RATE=4K LD_PRELOAD=$PWD/build/
 * libcmalloc.so build/tests/programs/fork_thread_churn >/dev/null || echo failed; done`; the
 * abort's stack in the child: pthread_create -> free). Since the child takes back a block it
 * finds on a list another thread left behind at the fork (cm_thread_cache_take_left_behind),
 * 0 of 90 runs had one. The allowance stays for the case that remains (the block had gone on
 * to the central cache, that thread's list being full): with the profiler on a run allows one
 * child that aborted; two, or any other failure, fail it. */
#include "../watchdog.h"
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int stop;

static void *short_lived(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void *blocks[64];
    for (int i = 0; i < 64; i++)
        blocks[i] = malloc(16 + (size_t)(rand_r(&seed) % 4000));
    for (int i = 0; i < 64; i++)
        free(blocks[i]);
    return NULL;
}

static void *spawner(void *arg)
{
    (void)arg;
    unsigned n = 1;
    while (!atomic_load(&stop)) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            if (pthread_create(&t[i], NULL, short_lived, (void *)(size_t)n++) != 0)
                t[i] = 0;
        for (int i = 0; i < 4; i++)
            if (t[i])
                pthread_join(t[i], NULL);
    }
    return NULL;
}

static void *stdio_churn(void *arg)
{
    (void)arg;
    char *buffer = NULL;
    size_t size = 0;
    while (!atomic_load(&stop)) {
        FILE *f = open_memstream(&buffer, &size);
        for (int i = 0; i < 200; i++)
            fprintf(f, "line %d %s\n", i, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
        fclose(f);
        free(buffer);
        buffer = NULL;
    }
    return NULL;
}

static void *child_thread(void *arg)
{
    (void)arg;
    void *p = malloc(1000);
    free(malloc(100000));
    return p;
}

int main(void)
{
    start_watchdog("fork_thread_churn", 25);
    pthread_t helpers[3];
    pthread_create(&helpers[0], NULL, spawner, NULL);
    pthread_create(&helpers[1], NULL, spawner, NULL);
    pthread_create(&helpers[2], NULL, stdio_churn, NULL);
    const char *prof = getenv("CMALLOC_PROF");
    int allowed_aborts = prof != NULL && atoi(prof) != 0; /* glibc's window, see above */
    int bad = 0, aborted = 0;
    for (int i = 0; i < 200; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            char *p = malloc(5000);
            memset(p, 1, 5000);
            pthread_t t;
            void *q = NULL;
            if (pthread_create(&t, NULL, child_thread, NULL) != 0 || pthread_join(t, &q) != 0)
                _exit(3);
            free(q);
            free(p);
            printf("child %d\n", i); /* stdio in the child too */
            fflush(stdout);
            _exit(0);
        }
        if (pid < 0) {
            perror("fork");
            bad++;
            continue;
        }
        watchdog_child = pid;
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "child %d: status %#x\n", i, status);
            if (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && aborted < allowed_aborts)
                aborted++;
            else
                bad++;
        }
        watchdog_child = 0;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(helpers[i], NULL);
    if (aborted > 0 && bad == 0)
        fprintf(stderr,
                "1 child aborted with the profiler on: glibc's window, allowed once a run\n");
    return bad ? 1 : 0;
}
