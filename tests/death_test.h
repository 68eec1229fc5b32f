/* death_test.h - death tests for the pool and arena tests (header only, after cmocka.h).
 *
 * expect_death(body, arg, expected) runs body(arg) in a forked child whose stderr goes into a
 * pipe, and asserts that the child was killed by SIGABRT (not SIGSEGV, not a clean exit) and
 * that its stderr holds the line `expected` exactly. The parent builds the objects and the
 * expected text before forking, so the child's addresses are the parent's.
 */
#ifndef TESTS_DEATH_TEST_H
#define TESTS_DEATH_TEST_H

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

#endif /* TESTS_DEATH_TEST_H */
