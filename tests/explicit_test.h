/* explicit_test.h - what the pool and arena tests share (header only, after cmocka.h).
 *
 * expect_death(body, arg, expected) runs body(arg) in a forked child whose stderr goes into a
 * pipe, and asserts that the child was killed by SIGABRT (not SIGSEGV, not a clean exit) and
 * that its stderr holds the line `expected` exactly. The parent builds the objects and the
 * expected text before forking, so the child's addresses are the parent's.
 * expect_in_stats_and_released(make, destroy, bytes): make(bytes) builds an arena or pool
 * holding `bytes` of written memory; they must show in bytes_in_use, and destroy must take
 * them out of bytes_in_use and (three quarters at least) out of RSS at once.
 */
#ifndef TESTS_EXPLICIT_TEST_H
#define TESTS_EXPLICIT_TEST_H

#include "cmalloc.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef void (*death_body)(void *arg);

static void expect_death(death_body body, void *arg, const char *expected)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        body(arg);
        _exit(0); /* survived: the parent reports it */
    }
    close(fds[1]);
    char output[4096];
    size_t length = 0;
    for (;;) {
        ssize_t n = read(fds[0], output + length, sizeof output - 1 - length);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || (length += (size_t)n) == sizeof output - 1)
            break;
    }
    output[length] = '\0';
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT || strstr(output, expected) == NULL)
        fail_msg("expected SIGABRT and \"%s\"; got status 0x%x and \"%s\"", expected, status, output);
}

static size_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%lu %lu", &size, &resident), 2);
    fclose(f);
    return resident * (size_t)sysconf(_SC_PAGESIZE);
}

static void expect_in_stats_and_released(void *(*make)(size_t bytes), void (*destroy)(void *handle),
                                         size_t bytes)
{
    cmalloc_stats before, during, after;
    cmalloc_stats_get(&before);
    void *handle = make(bytes);
    assert_non_null(handle);
    size_t resident_during = resident_bytes();
    cmalloc_stats_get(&during);
    assert_true(during.bytes_in_use >= before.bytes_in_use + bytes);
    destroy(handle);
    cmalloc_stats_get(&after);
    assert_true(after.bytes_in_use + bytes <= during.bytes_in_use);
    assert_true(resident_bytes() + bytes * 3 / 4 <= resident_during);
}

#endif /* TESTS_EXPLICIT_TEST_H */
