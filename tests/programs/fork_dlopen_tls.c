/* fork_dlopen_tls.c - fork beside threads whose creation frees a dlopen'd module's TLS.
 * The program dlopens a module with thread-local storage (libtls_module.so, argv[1]); two
 * threads start and join short threads that touch the module's TLS (glibc mallocs each thread's
 * block of it), so their pthread_create reuses cached stacks and frees the previous thread's
 * block inside glibc's get_cached_stack. Main forks 300 times; each child starts and joins one
 * thread and exits 0. What goes wrong: glibc's child frees again the blocks a thread was
 * freeing when the parent forked (it clears the stack's TLS table only after the frees), so
 * an allocator whose free marks a block before it waits on a lock that fork's prepare handler
 * holds aborts the child with "double free" in pthread_create -> get_cached_stack -> free
 * (cmalloc did: 2-9 of 300 children in every run, and 136-181 with CMALLOC_CHECK=1, fixed by
 * 9325959 and 8b3d3f9). glibc's window itself stays: a thread that is preempted after its
 * free returned and before glibc clears the table lets a child free the block again with any
 * allocator (glibc's own malloc then frees it twice, silently or aborting with "double free or
 * corruption": 3 of 300 children once, which test_user_programs.sh allows); cmalloc's report
 * of it was seen once in about 17,000 forks here. The child now takes such a block back when
 * it sits on the freeing thread's list or local lists, which the fork left behind
 * (cm_thread_cache_take_left_behind), and, when the guard or the debug mode freed it, when it
 * was the latest block that thread freed there (cm_latest_free_take); one that went on to the
 * central cache (the list full, the block another thread's) is still reported. So a run allows
 * one failed child and fails on two or more. With every block guarded, under three copies of
 * the program at once on 2 cores, 3 of 1,200 runs failed (two children each) before the
 * guard's and the debug mode's frees noted their latest blocks, none of 2,400 after.
 * The window is wider where a thread has two dlopen'd TLS blocks (glibc frees them in one loop
 * and clears the table after it: the first is freed while the second's free waits for a lock
 * the fork holds): with CMALLOC_PROF=1, libunwind's is the second, and with every block guarded
 * as well (CMALLOC_GUARD_RATE=1, whose frees take locks) 3 of 30 runs had one failed child.
 * The test runs twice: as started, then re-executed with CMALLOC_CHECK=1, whose free takes
 * the debug quarantine's lock. Exit 0 when each run had at most one failed child; 1 otherwise
 * (prints how many failed). The module is argv[1], by default libtls_module.so in the
 * program's own directory. */
#include "../watchdog.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static atomic_int stop;
static int (*touch)(int);

static void *short_lived(void *arg)
{
    touch((int)(size_t)arg);
    return NULL;
}

static void *spawner(void *arg)
{
    (void)arg;
    for (unsigned n = 1; !atomic_load(&stop); n++) {
        pthread_t t;
        if (pthread_create(&t, NULL, short_lived, (void *)(size_t)n) == 0)
            pthread_join(t, NULL);
    }
    return NULL;
}

static void *nothing(void *arg)
{
    return arg;
}

int main(int argc, char **argv)
{
    static char path[4096];
    if (argc > 1)
        snprintf(path, sizeof path, "%s", argv[1]);
    else {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 32);
        if (n <= 0)
            return 2;
        path[n] = '\0';
        strcpy(strrchr(path, '/') + 1, "libtls_module.so");
    }
    void *module = dlopen(path, RTLD_NOW);
    if (module == NULL || (touch = (int (*)(int))dlsym(module, "tls_touch")) == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 2;
    }
    start_watchdog("fork_dlopen_tls", 25);
    pthread_t spawners[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&spawners[i], NULL, spawner, NULL);
    int bad = 0;
    for (int i = 0; i < 300; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            pthread_t t;
            _exit(pthread_create(&t, NULL, nothing, NULL) == 0 && pthread_join(t, NULL) == 0 ? 0
                                                                                             : 3);
        }
        watchdog_child = pid;
        int status;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || status != 0)
            bad++;
        watchdog_child = 0;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(spawners[i], NULL);
    if (bad == 1)
        printf("1 of 300 children failed: glibc's own window, allowed once a run\n");
    if (bad > 1) {
        printf("%d of 300 children failed%s\n", bad,
               getenv("CMALLOC_CHECK") ? " (CMALLOC_CHECK=1)" : "");
        return 1;
    }
    if (getenv("CMALLOC_CHECK") == NULL) { /* again, with the debug mode's free */
        setenv("CMALLOC_CHECK", "1", 1);
        execve("/proc/self/exe", argv, environ);
        perror("execve");
        return 2;
    }
    return 0;
}
