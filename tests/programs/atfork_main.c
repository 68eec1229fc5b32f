/* atfork_main.c - linked with libatfork_lib.so, whose atfork handlers allocate; it only
 * forks (single-threaded, then beside a thread) and checks every child exits 0. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int stop;

static void *churn(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop))
        free(malloc(1000));
    return NULL;
}

static int fork_and_wait(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        free(malloc(5000));
        _exit(0);
    }
    int status;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}

int main(void)
{
    for (int i = 0; i < 20; i++)
        if (!fork_and_wait())
            return 1;
    pthread_t thread;
    pthread_create(&thread, NULL, churn, NULL);
    for (int i = 0; i < 50; i++)
        if (!fork_and_wait())
            return 1;
    atomic_store(&stop, 1);
    pthread_join(thread, NULL);
    return 0;
}
