/* dlopen_cycle.c - loads and unloads a plugin (libdlopen_lib.so: mallocs in its constructor,
 * frees in its destructor, registers allocating atfork handlers) 150 times from main and 150
 * times from each of 2 threads at once, calling into it each time, and forks while it is
 * loaded (the child calls the plugin and exits). dlopen and dlclose allocate with the
 * loader's lock held. Exit 0 when every call returned the right length and every child exited
 * 0; a hang ends with status 124 (watchdog). The plugin is argv[1], by default
 * libdlopen_lib.so in the program's own directory. */
#include "../watchdog.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *path;
static atomic_int failures;

static int cycle(int rounds, int forks)
{
    for (int i = 0; i < rounds; i++) {
        void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (handle == NULL) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 1;
        }
        int (*work)(int) = (int (*)(int))dlsym(handle, "plugin_work");
        if (work == NULL || work(i) != (i % 100) * 37 + 1)
            return 1;
        if (forks && i % 10 == 0) {
            pid_t pid = fork();
            if (pid == 0)
                _exit(work(i + 1) == ((i + 1) % 100) * 37 + 1 ? 0 : 1);
            int status;
            if (pid < 0 || waitpid(pid, &status, 0) != pid || status != 0)
                return 1;
        }
        if (dlclose(handle) != 0)
            return 1;
    }
    return 0;
}

static void *worker(void *arg)
{
    (void)arg;
    if (cycle(150, 0) != 0)
        atomic_fetch_add(&failures, 1);
    return NULL;
}

int main(int argc, char **argv)
{
    static char own[4096];
    if (argc > 1)
        path = argv[1];
    else {
        ssize_t n = readlink("/proc/self/exe", own, sizeof own - 32);
        if (n <= 0)
            return 2;
        own[n] = '\0';
        strcpy(strrchr(own, '/') + 1, "libdlopen_lib.so");
        path = own;
    }
    start_watchdog("dlopen_cycle", 25);
    if (cycle(50, 1) != 0) /* single-threaded, with forks */
        return 1;
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, worker, NULL);
    int bad = cycle(100, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    return bad || atomic_load(&failures) ? 1 : 0;
}
