/* fork_thread_churn.c - fork while other threads are being created and are exiting (their
 * caches being flushed and recycled), while two threads malloc/free and use stdio. 200 forks;
 * each child mallocs, starts a thread that mallocs, joins it, and exits 0. A child that hangs
 * (a lock copied held from an exiting thread) or crashes fails; a watchdog ends a hang. */
#include "../watchdog.h"
#include <pthread.h>
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
    int bad = 0;
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
            bad++;
        }
        watchdog_child = 0;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(helpers[i], NULL);
    return bad ? 1 : 0;
}
