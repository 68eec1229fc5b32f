/* fork_in_signal_release.c - the program of fork_in_signal.c (single-threaded; a timer signal
 * handler forks while main allocates) run with CMALLOC_BACKGROUND_RELEASE=1. What goes wrong:
 * cmalloc's own release thread makes the process multi-threaded (__libc_single_threaded
 * false), so a fork prepare handler that takes the allocator's locks - one of which the
 * interrupted main thread holds - waits for itself (cmalloc hung in every run until 8af513e).
 * The program the user wrote has one thread and forks safely without cmalloc. A parent process
 * (single-threaded, no watchdog thread, so glibc behaves as for the real program) runs the
 * test in a child with the option set and kills it after 10 s. Exit 0 when the child finished;
 * 1 when it hung. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static volatile sig_atomic_t forks;

static void on_timer(int signal_number)
{
    (void)signal_number;
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid > 0) {
        waitpid(pid, NULL, 0);
        forks++;
    }
}

static int test(void)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_timer;
    action.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &action, NULL);
    struct itimerval timer = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_REAL, &timer, NULL);
    time_t end = time(NULL) + 2;
    unsigned seed = 1;
    while (time(NULL) < end) {
        void *blocks[16];
        for (int i = 0; i < 16; i++) {
            size_t size = (size_t)1 << (rand_r(&seed) % 22);
            blocks[i] = malloc(size);
            if (blocks[i])
                memset(blocks[i], 1, size < 64 ? size : 64);
        }
        for (int i = 0; i < 16; i++)
            free(blocks[i]);
    }
    return forks > 0 ? 0 : 3;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("FORK_IN_SIGNAL_CHILD"))
        return test();
    pid_t pid = fork();
    if (pid == 0) {
        setenv("FORK_IN_SIGNAL_CHILD", "1", 1);
        setenv("CMALLOC_BACKGROUND_RELEASE", "1", 1);
        execve("/proc/self/exe", argv, environ);
        _exit(2);
    }
    for (int tenths = 0; tenths < 100; tenths++) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    printf("hung: the fork in the signal handler never returned (10 s)\n");
    return 1;
}
