/* spawn_threads.c - starting processes from a threaded program, all at once: 4 threads each
 * run popen("echo ...")/pclose and read the line back, system("exit N") and check the status,
 * posix_spawn /bin/true and vfork+execve /bin/true, 15 times each, while 2 more threads
 * malloc/free and fprintf to a FILE. popen/system/posix_spawn allocate in the parent and fork
 * or clone inside glibc; a child that hangs before exec (an allocator lock copied held) or a
 * wrong output or status fails (exit 1); a hang ends with status 124 (watchdog). */
#include "../watchdog.h"
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static atomic_int stop, failures;

static void fail(const char *what, int n)
{
    fprintf(stderr, "%s (%d)\n", what, n);
    atomic_fetch_add(&failures, 1);
}

/* vfork+execve in a function of its own, so no local of the caller lives across vfork */
static __attribute__((noinline)) int vfork_true(void)
{
    char *args[] = {"/bin/true", NULL};
    pid_t pid = vfork();
    if (pid == 0) {
        execve("/bin/true", args, environ);
        _exit(127);
    }
    int status = -1;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return status;
}

static void *starter(void *arg)
{
    int id = (int)(size_t)arg;
    for (int i = 0; i < 15; i++) {
        char command[64], want[64], line[64] = "";
        snprintf(command, sizeof command, "echo t%d-%d", id, i);
        snprintf(want, sizeof want, "t%d-%d\n", id, i);
        FILE *p = popen(command, "r");
        if (p == NULL) {
            fail("popen", i);
            continue;
        }
        if (fgets(line, sizeof line, p) == NULL || strcmp(line, want) != 0)
            fail("popen output", i);
        if (pclose(p) != 0)
            fail("pclose status", i);

        snprintf(command, sizeof command, "exit %d", (id + i) % 7);
        int status = system(command);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != (id + i) % 7)
            fail("system status", status);

        char *args[] = {"/bin/true", NULL};
        pid_t pid;
        if (posix_spawn(&pid, "/bin/true", NULL, NULL, args, environ) != 0)
            fail("posix_spawn", i);
        else if (waitpid(pid, &status, 0) != pid || status != 0)
            fail("posix_spawn status", status);

        if ((status = vfork_true()) != 0)
            fail("vfork+exec", status);
    }
    return NULL;
}

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    FILE *null = fopen("/dev/null", "w");
    void *blocks[64] = {0};
    while (!atomic_load(&stop)) {
        int i = (int)(rand_r(&seed) % 64);
        free(blocks[i]);
        blocks[i] = malloc(8 + (size_t)(rand_r(&seed) % 20000));
        fprintf(null, "%d %p\n", i, blocks[i]);
    }
    for (int i = 0; i < 64; i++)
        free(blocks[i]);
    fclose(null);
    return NULL;
}

int main(void)
{
    start_watchdog("spawn_threads", 25);
    pthread_t starters[4], churners[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&churners[i], NULL, churn, (void *)(size_t)(i + 1));
    for (int i = 0; i < 4; i++)
        pthread_create(&starters[i], NULL, starter, (void *)(size_t)i);
    for (int i = 0; i < 4; i++)
        pthread_join(starters[i], NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(churners[i], NULL);
    return atomic_load(&failures) ? 1 : 0;
}
