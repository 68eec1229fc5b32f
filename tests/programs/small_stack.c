/* small_stack.c - threads on the smallest stack glibc allows (PTHREAD_STACK_MIN, 16 KiB on
 * x86-64) allocate and free 16 B - 2 MB blocks, then call malloc_info, malloc_stats (to
 * /dev/null) and mallinfo2: 20 rounds of 4 threads. Then the program re-executes itself with
 * the profiler and guard pages on (CMALLOC_PROF=1, CMALLOC_PROF_RATE=4096,
 * CMALLOC_GUARD_RATE=20; options are read at start), whose sampled slow paths unwind the stack
 * and format reports on it. A slow path that put a big buffer on the stack overflows into the
 * guard page: SIGSEGV. Exit 0 when both passes finished. */
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void *work(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg;
    void *blocks[64] = {0};
    for (int i = 0; i < 20000; i++) {
        int k = (int)(rand_r(&seed) % 64);
        free(blocks[k]);
        size_t size = 16 + (size_t)(rand_r(&seed) % 5000);
        if (rand_r(&seed) % 100 == 0)
            size = 2000000;
        blocks[k] = malloc(size);
        if (blocks[k] == NULL)
            return (void *)1;
        memset(blocks[k], 1, 16);
    }
    for (int k = 0; k < 64; k++)
        free(blocks[k]);
    FILE *null = fopen("/dev/null", "w");
    if (null == NULL || malloc_info(0, null) != 0)
        return (void *)1;
    fclose(null);
    malloc_stats(); /* stderr: /dev/null, see main */
    return mallinfo2().arena > 0 ? NULL : (void *)1;
}

int main(int argc, char **argv)
{
    (void)argc;
    int quiet = open("/dev/null", O_WRONLY);
    dup2(quiet, 2);
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    if (pthread_attr_setstacksize(&attributes, PTHREAD_STACK_MIN) != 0)
        return 2;
    for (int round = 0; round < 20; round++) {
        pthread_t threads[4];
        for (int i = 0; i < 4; i++)
            if (pthread_create(&threads[i], &attributes, work, (void *)(size_t)(round * 4 + i + 1)))
                return 2;
        for (int i = 0; i < 4; i++) {
            void *result;
            pthread_join(threads[i], &result);
            if (result != NULL)
                return 1;
        }
    }
    if (getenv("SMALL_STACK_SECOND") != NULL)
        return 0;
    setenv("SMALL_STACK_SECOND", "1", 1);
    setenv("CMALLOC_PROF", "1", 1);
    setenv("CMALLOC_PROF_RATE", "4096", 1);
    setenv("CMALLOC_GUARD_RATE", "20", 1);
    pid_t pid = fork();
    if (pid == 0) {
        execve("/proc/self/exe", argv, environ);
        _exit(2);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return 2;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("second pass (profiler and guard pages on): status %#x\n", status);
        return 1;
    }
    return 0;
}
