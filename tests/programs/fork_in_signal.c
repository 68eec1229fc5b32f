/* fork_in_signal.c - a single-threaded program whose timer signal handler forks (the child
 * _exits at once) while main allocates and frees blocks of every kind in a loop, so the
 * handler often interrupts malloc or free holding an allocator lock. glibc skips its malloc
 * locks in fork when the process is single-threaded; an allocator that takes them anyway
 * waits for itself. After 2 s of this the program runs again (re-executed) with
 * CMALLOC_BACKGROUND_RELEASE=1, whose release thread makes the process multi-threaded for
 * glibc although the program has one thread: cmalloc's prepare handler took the locks then
 * and hung in every run until 8af513e. Exit 0 when both runs end. The handler forks at most
 * half the time (see on_timer), so the run ends on a loaded machine too. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static volatile sig_atomic_t forks;

static struct timespec next_fork; /* the handler forks no earlier than this */

static long long nanoseconds(const struct timespec *t)
{
    return (long long)t->tv_sec * 1000000000 + t->tv_nsec;
}

/* Forks at most half the time: on a loaded machine a fork and its wait take longer than the
 * timer's period, and a handler that forked on every tick left main no time at all (the run
 * then never ended, with or without cmalloc). After a fork that took d, the next waits d. */
static void on_timer(int signal_number)
{
    (void)signal_number;
    struct timespec start, done;
    clock_gettime(CLOCK_MONOTONIC, &start);
    if (nanoseconds(&start) < nanoseconds(&next_fork))
        return;
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid > 0) {
        waitpid(pid, NULL, 0);
        forks++;
    }
    clock_gettime(CLOCK_MONOTONIC, &done);
    long long next = 2 * nanoseconds(&done) - nanoseconds(&start);
    next_fork.tv_sec = (time_t)(next / 1000000000);
    next_fork.tv_nsec = (long)(next % 1000000000);
}

int main(int argc, char **argv)
{
    (void)argc;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_timer;
    action.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &action, NULL);
    struct itimerval every = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &every, NULL);
    time_t end = time(NULL) + 2;
    unsigned seed = 1;
    void *slots[64] = {0};
    while (time(NULL) < end) {
        int i = rand_r(&seed) % 64;
        free(slots[i]);
        size_t size = (size_t)1 << (rand_r(&seed) % 22);
        slots[i] = malloc(size + (size_t)(rand_r(&seed) % 64));
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    for (int i = 0; i < 64; i++)
        free(slots[i]);
    if (forks == 0)
        return 3;
    if (getenv("CMALLOC_BACKGROUND_RELEASE") == NULL) { /* again, with the release thread */
        setenv("CMALLOC_BACKGROUND_RELEASE", "1", 1);
        execve("/proc/self/exe", argv, environ);
        return 2;
    }
    return 0;
}
