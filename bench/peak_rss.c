/* peak_rss - run a command and report its peak resident set size (a helper, not a workload).
 *
 *   build/bench/peak_rss [--append FILE] -- command [args...]
 *
 * Runs the command as a child (fork + execvp), waits for it with wait4 and reports the child's
 * ru_maxrss in KiB: appended as one line to FILE with --append (so hyperfine can time
 * `peak_rss --append f -- env LD_PRELOAD=... prog` and every timed run leaves its figure), else
 * printed as "peak_rss_kib=N" on stderr. The exit status is the command's (128+signal when it
 * was killed). scripts/bench-matrix.sh uses it for the programs that do not report their own
 * peak RSS: the order-book replay and the unmodified real programs. Its own cost (one fork and
 * exec, about a millisecond) is the same under every allocator; it runs without LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *append = NULL;
    int i = 1;
    if (i + 1 < argc && !strcmp(argv[i], "--append")) {
        append = argv[i + 1];
        i += 2;
    }
    if (i < argc && !strcmp(argv[i], "--"))
        i++;
    if (i >= argc) {
        fprintf(stderr, "usage: peak_rss [--append FILE] -- command [args...]\n");
        return 2;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("peak_rss: fork");
        return 2;
    }
    if (pid == 0) {
        execvp(argv[i], &argv[i]);
        fprintf(stderr, "peak_rss: cannot run %s: %s\n", argv[i], strerror(errno));
        _exit(127);
    }
    int status;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        perror("peak_rss: wait4");
        return 2;
    }
    if (append) {
        int fd = open(append, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            char line[32];
            int n = snprintf(line, sizeof line, "%ld\n", ru.ru_maxrss);
            if (write(fd, line, (size_t)n) != n)
                perror("peak_rss: write");
            close(fd);
        }
    } else {
        fprintf(stderr, "peak_rss_kib=%ld\n", ru.ru_maxrss);
    }
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
