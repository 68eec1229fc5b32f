/* helpers.h - what the cmocka test binaries share (header only; include it after cmocka.h).
 *
 *   opaque(p), opaque_size(n)  hide a value from the optimizer, so that it can neither delete
 *                      a malloc/free pair nor fold or warn about the bad calls a test makes
 *   clobber(p)         makes every store before it observable (a fill is not dropped)
 *   resident_bytes()   the resident set, from /proc/self/statm
 *   stats_now()        cmalloc_stats_get(), asserted to succeed
 *   seed_from_env(what)  TEST_SEED when set, else a fresh seed; printed with `what`, so a failing
 *                      run can be repeated
 *   run_child(spec, result)  runs spec->body(spec->arg) in a forked child, or re-executes this
 *                      binary (/proc/self/exe) with spec->self_args and spec->env added to the
 *                      environment: options are read once, when the allocator starts, and in
 *                      a forked child it has long started, so a fresh process is the only way
 *                      to run under other options. The child's stderr (and with
 *                      spec->with_stdout its stdout) is captured in result->output.
 *   exec_self(args, env)  that re-execution without the fork (a binary that must itself run
 *                      under an option); returns only if execve failed
 *   expect_aborted(result, expected)  the child was killed by SIGABRT (not SIGSEGV, not a
 *                      clean exit) and its output holds `expected` (the exact report line,
 *                      when the test knows the address); else the test fails, showing both
 *   expect_death(body, arg, expected)  run_child then expect_aborted: build the objects and
 *                      the expected text before, so the child's addresses are the parent's
 *   announce(p), expect_report(spec, format)  for a child that picks the address itself: it
 *                      announces it before the bad call, and the parent expects `format`
 *                      with that address for its %p
 *   expect_in_stats_and_released(make, destroy, bytes)  make(bytes) builds an arena or pool
 *                      holding `bytes` of written memory; they must show in bytes_in_use, and
 *                      destroy must take them out of bytes_in_use and (three quarters at least)
 *                      out of RSS at once
 *
 * Children never dump core (a death test aborts on purpose), and watchdog.h's thread kills the
 * child being waited for when the whole binary runs out of time.
 */
#ifndef TESTS_HELPERS_H
#define TESTS_HELPERS_H

#include "cmalloc.h"
#include "watchdog.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KiB
#define KiB ((size_t)1024)
#define MiB (KiB * 1024)
#endif

extern char **environ;

static inline void *opaque(void *p)
{
    __asm__ volatile("" : "+r"(p));
    return p;
}

static inline size_t opaque_size(size_t n)
{
    __asm__ volatile("" : "+r"(n));
    return n;
}

static inline void clobber(void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

static inline size_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%lu %lu", &size, &resident), 2);
    fclose(f);
    return resident * (size_t)sysconf(_SC_PAGESIZE);
}

static inline cmalloc_stats stats_now(void)
{
    cmalloc_stats s;
    memset(&s, 0, sizeof s);
    assert_int_equal(cmalloc_stats_get(&s), 0);
    return s;
}

/* The time and the process id, so that two runs started in the same second differ. */
static inline unsigned seed_from_env(const char *what)
{
    const char *fixed = getenv("TEST_SEED");
    unsigned seed = fixed != NULL ? (unsigned)strtoul(fixed, NULL, 0)
                                  : (unsigned)time(NULL) ^ ((unsigned)getpid() << 16);
    printf("%s: seed %u (set TEST_SEED=%u to repeat)\n", what, seed, seed);
    fflush(stdout);
    return seed;
}

/* ---- children ---------------------------------------------------------------------------- */

typedef struct child_spec {
    void (*body)(void *arg); /* runs in the forked child, which exits 0 if it returns */
    void *arg;
    char *const *self_args; /* when body is NULL: re-execute this binary with these */
    const char *env[3];     /* NAME=value, in front of ours in the re-executed child's */
    bool with_stdout;       /* capture stdout too, in the same pipe as stderr */
    unsigned alarm_seconds; /* a child that hangs dies of SIGALRM; 0: 20 */
} child_spec;

typedef struct child_result {
    int status;         /* from waitpid */
    char output[16384]; /* what the child wrote, cut at the buffer's end */
} child_result;

/* Execs /proc/self/exe with args and an environment of env (NULL-terminated NAME=value) in
 * front of ours less those names. Returns only if execve failed. */
static inline void exec_self(char *const args[], const char *const env[])
{
    static char *merged[1024];
    int n = 0;
    for (int i = 0; env[i] != NULL; i++)
        merged[n++] = (char *)env[i];
    for (char **e = environ; *e != NULL && n < 1023; e++) {
        bool replaced = false;
        for (int i = 0; env[i] != NULL; i++)
            replaced |= strncmp(*e, env[i], strcspn(env[i], "=") + 1) == 0;
        if (!replaced)
            merged[n++] = *e;
    }
    merged[n] = NULL;
    execve("/proc/self/exe", args, merged);
}

/* Reads fd to its end; keeps what fits, drains the rest so the writer never blocks. */
static inline void read_all(int fd, char *buffer, size_t capacity)
{
    size_t length = 0;
    for (;;) {
        ssize_t n = read(fd, buffer + length, capacity - 1 - length);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        length += (size_t)n;
        if (length == capacity - 1) {
            char sink[512];
            while ((n = read(fd, sink, sizeof sink)) > 0 || (n < 0 && errno == EINTR))
                ;
            break;
        }
    }
    buffer[length] = '\0';
}

static inline void run_child(const child_spec *spec, child_result *result)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        close(fds[0]);
        if (spec->with_stdout)
            dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[1]);
        signal(SIGSEGV, SIG_DFL); /* not cmocka's handler: a crash must end the child */
        alarm(spec->alarm_seconds ? spec->alarm_seconds : 20);
        if (spec->body == NULL) {
            exec_self(spec->self_args, spec->env);
            _exit(127);
        }
        spec->body(spec->arg);
        _exit(0);
    }
    close(fds[1]);
    watchdog_child = pid;
    read_all(fds[0], result->output, sizeof result->output);
    close(fds[0]);
    while (waitpid(pid, &result->status, 0) < 0)
        assert_int_equal(errno, EINTR);
    watchdog_child = 0;
}

/* "exited with status 1", "killed by signal 11 (Segmentation fault)". */
static inline const char *describe_status(int status, char *buffer, size_t size)
{
    if (WIFEXITED(status))
        snprintf(buffer, size, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buffer, size, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buffer, size, "status 0x%x", status);
    return buffer;
}

static inline void expect_aborted(const child_result *result, const char *expected)
{
    if (getenv("TEST_VERBOSE") != NULL)
        fprintf(stderr, "child stderr:\n%s", result->output);
    bool aborted = WIFSIGNALED(result->status) && WTERMSIG(result->status) == SIGABRT;
    if (aborted && strstr(result->output, expected) != NULL)
        return;
    char how[96];
    fail_msg("expected SIGABRT and \"%s\"; the child %s; its stderr:\n%s", expected,
             describe_status(result->status, how, sizeof how), result->output);
}

static inline void expect_death(void (*body)(void *arg), void *arg, const char *expected)
{
    static child_result result;
    child_spec spec = {.body = body, .arg = arg};
    run_child(&spec, &result);
    expect_aborted(&result, expected);
}

/* In a death test's child, before the bad call: writes "address 0x<hex>\n" to stderr without
 * stdio (the child's heap is what is on trial), so that the parent knows the address the
 * report must name even when the child chose it. */
static inline void announce(const void *p)
{
    char text[64];
    int n = snprintf(text, sizeof text, "address %p\n", p);
    if (write(2, text, (size_t)n) < 0)
        _exit(90);
}

/* run_child, then expect_aborted with the report for the address the child announced: the
 * one %p in `format` stands for it. */
static inline void expect_report(const child_spec *spec, const char *format)
{
    static child_result result;
    run_child(spec, &result);
    void *p = NULL;
    const char *line = strstr(result.output, "address ");
    char expected[256];
    /* cmalloc prints addresses as 0x followed by lower-case hex, as %p does with glibc. */
    if (line != NULL && sscanf(line, "address %p", &p) == 1)
        snprintf(expected, sizeof expected, format, p);
    else
        snprintf(expected, sizeof expected, "(no address announced) %s", format);
    expect_aborted(&result, expected);
}

/* For bodies that take no argument: expect_death(call_void, &function, ...). */
static inline void call_void(void *function)
{
    (*(void (**)(void))function)();
}

/* ---- arenas and pools ---------------------------------------------------------------------- */

static inline void expect_in_stats_and_released(void *(*make)(size_t bytes),
                                                void (*destroy)(void *handle), size_t bytes)
{
    cmalloc_stats before = stats_now();
    void *handle = make(bytes);
    assert_non_null(handle);
    size_t resident_during = resident_bytes();
    cmalloc_stats during = stats_now();
    assert_true(during.bytes_in_use >= before.bytes_in_use + bytes);
    destroy(handle);
    cmalloc_stats after = stats_now();
    assert_true(after.bytes_in_use + bytes <= during.bytes_in_use);
    assert_true(resident_bytes() + bytes * 3 / 4 <= resident_during);
}

#endif /* TESTS_HELPERS_H */
