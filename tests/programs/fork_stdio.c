/* fork_stdio.c - fork() in a threaded program that uses stdio: two threads read long lines
 * with getline (whose buffers grow with realloc) from their own FILEs, one thread calls
 * fflush(NULL) in a loop, and main forks 300 times (each child _exits at once, as popen's
 * and system's children exec). glibc's fork takes stdio's list lock after the atfork prepare
 * handlers; an allocator whose prepare handler holds its locks then waits for stdio while a
 * getline holding a FILE lock waits for the allocator. Exit 0 when every fork returned. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int stop;
static char *text;
static size_t text_length;

static void *reader(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        FILE *f = fmemopen(text, text_length, "r");
        if (f == NULL)
            continue;
        char *line = NULL;
        size_t capacity = 0;
        while (getline(&line, &capacity, f) > 0) {
            free(line); /* start over, so every line grows a buffer again */
            line = NULL;
            capacity = 0;
        }
        free(line);
        fclose(f);
    }
    return NULL;
}

static void *flusher(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop))
        fflush(NULL);
    return NULL;
}

int main(void)
{
    text_length = 64 << 10;
    text = malloc(text_length);
    for (size_t i = 0; i < text_length; i++)
        text[i] = i % 3000 == 2999 ? '\n' : (char)('a' + i % 26);
    pthread_t threads[3];
    pthread_create(&threads[0], NULL, reader, NULL);
    pthread_create(&threads[1], NULL, reader, NULL);
    pthread_create(&threads[2], NULL, flusher, NULL);
    for (int i = 0; i < 300; i++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        if (pid < 0)
            return 2;
        waitpid(pid, NULL, 0);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(threads[i], NULL);
    free(text);
    return 0;
}
