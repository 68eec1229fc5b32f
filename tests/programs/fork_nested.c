/* fork_nested.c - forks of forks, each process multi-threaded: at every level two threads
 * malloc/free while the process forks 3 children (4 levels: 39 processes), each child starts
 * its own two threads and forks again. A child inherits the caches of its parent's threads
 * (which it does not have) and the locks the fork handlers held; its own children inherit that
 * again. Exit 0 when every process at every level exited 0; a hang ends with status 124
 * (a watchdog in every process, shorter at each level down, kills the child it waits for). */
#include "../watchdog.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int stop;

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void *blocks[32] = {0};
    for (int n = 0; n < 2000 || !atomic_load(&stop); n++) {
        int k = (int)(rand_r(&seed) % 32);
        free(blocks[k]);
        blocks[k] = malloc(16 + (size_t)(rand_r(&seed) % 9000));
        if (blocks[k] == NULL)
            return (void *)1;
    }
    for (int k = 0; k < 32; k++)
        free(blocks[k]);
    return NULL;
}

static int level(int depth)
{
    pthread_t threads[2];
    atomic_store(&stop, 0);
    if (depth > 0) /* each process ends its own hang and kills its child (threads do not fork) */
        start_watchdog("fork_nested", 25 - 4 * (unsigned)depth);
    for (int i = 0; i < 2; i++)
        if (pthread_create(&threads[i], NULL, churn, (void *)(size_t)(depth * 2 + i + 1)) != 0)
            return 2;
    int bad = 0;
    for (int i = 0; i < 3 && depth < 3; i++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(level(depth + 1));
        watchdog_child = pid;
        int status;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || status != 0)
            bad = 1;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) {
        void *result;
        pthread_join(threads[i], &result);
        bad |= result != NULL;
    }
    return bad;
}

int main(void)
{
    start_watchdog("fork_nested", 25);
    return level(0);
}
