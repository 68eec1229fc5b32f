/* watchdog.h - ends a test binary that hangs, for the reliability tests (header only).
 *
 * A deadlock inside the allocator can happen with every signal blocked (pthread_create blocks
 * them while it allocates the new thread's TLS), so alarm() alone may never fire. A thread that
 * only sleeps ends the process instead: it reports, SIGKILLs the child being waited for (if
 * any, in watchdog_child) and _exits with status 124. TEST_WATCHDOG_SECONDS overrides the
 * budget given to start_watchdog. Included by helpers.h, so every test that waits for a child
 * can name it here. */
#ifndef TESTS_WATCHDOG_H
#define TESTS_WATCHDOG_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile pid_t watchdog_child;
static const char *watchdog_name = "test";

static void *watchdog(void *arg)
{
    unsigned seconds = (unsigned)(uintptr_t)arg;
    struct timespec left = {(time_t)seconds, 0};
    while (nanosleep(&left, &left) != 0)
        ;
    char text[160];
    int n = snprintf(text, sizeof text,
                     "%s: watchdog: still running after %u s, a deadlock? "
                     "(exiting)\n",
                     watchdog_name, seconds);
    if (write(2, text, (size_t)n) < 0)
        n = 0;
    if (watchdog_child > 0)
        kill(watchdog_child, SIGKILL);
    _exit(124);
}

static inline void start_watchdog(const char *name, unsigned seconds)
{
    pthread_t thread;
    const char *override = getenv("TEST_WATCHDOG_SECONDS");
    if (override != NULL && atoi(override) > 0)
        seconds = (unsigned)atoi(override);
    watchdog_name = name;
    if (pthread_create(&thread, NULL, watchdog, (void *)(uintptr_t)seconds) == 0)
        pthread_detach(thread);
}

#endif /* TESTS_WATCHDOG_H */
