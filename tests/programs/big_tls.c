/* big_tls.c - a program with 256 KiB of static TLS (glibc puts it on every thread's stack) asks
 * for cmalloc's release thread (it re-executes itself with CMALLOC_BACKGROUND_RELEASE=1, as
 * options are read once, at start). It allocates and frees 20 blocks of 600 KB (12 MB of free
 * pages resident), then checks /proc/self/status: the release thread must be running (2
 * threads). A thread started with a fixed small stack fails to start here, and an allocator
 * that retried the start on every slow path would pay a failed pthread_create per call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static __thread char big[256 << 10];
extern char **environ;

static int threads(void)
{
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    int count = -1;
    while (status && fgets(line, sizeof line, status))
        if (sscanf(line, "Threads: %d", &count) == 1)
            break;
    if (status)
        fclose(status);
    return count;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("CMALLOC_BACKGROUND_RELEASE") == NULL) {
        setenv("CMALLOC_BACKGROUND_RELEASE", "1", 1);
        execve("/proc/self/exe", argv, environ);
        return 2;
    }
    memset(big, 1, sizeof big);
    char *blocks[20];
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 20; i++)
            memset(blocks[i] = malloc(600000), 1, 600000);
        for (int i = 0; i < 20; i++)
            free(blocks[i]);
    }
    usleep(100 * 1000);
    int count = threads();
    /* Under glibc's malloc (the run without cmalloc) there is no release thread to find. */
    if (getenv("LD_PRELOAD") == NULL || strstr(getenv("LD_PRELOAD"), "cmalloc") == NULL)
        return count == 1 ? 0 : 1;
    if (count != 2)
        fprintf(stderr, "big_tls: %d threads, want 2 (the release thread)\n", count);
    return count == 2 ? 0 : 1;
}
