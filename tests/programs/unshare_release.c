/* unshare_release.c - REPRODUCER, not in the run list (fails under cmalloc with an option).
 * The kernel refuses unshare(CLONE_NEWUSER) with EINVAL in a process with more than one thread
 * (as `unshare -U`, bubblewrap, rootless containers and browser sandboxes do at start). With
 * CMALLOC_BACKGROUND_RELEASE=1 cmalloc's constructor starts its release thread in every
 * process it is preloaded into, so a single-threaded program's unshare fails. The program
 * re-executes itself with the option set, then unshares. Exit 0 when unshare worked, or when
 * user namespaces are not allowed here at all (checked first, before the option is set);
 * 1 when it failed only with the option. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int try_unshare(void)
{
    return unshare(CLONE_NEWUSER) == 0 ? 0 : errno;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("CMALLOC_BACKGROUND_RELEASE") != NULL) {
        int error = try_unshare();
        if (error != 0)
            printf("unshare(CLONE_NEWUSER) with CMALLOC_BACKGROUND_RELEASE=1: %s\n",
                   strerror(error));
        return error != 0;
    }
    pid_t pid = fork(); /* probe in a child: the namespace must not stick to this process */
    if (pid == 0)
        _exit(try_unshare() == 0 ? 0 : 1);
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || status != 0) {
        printf("user namespaces not allowed here; nothing to test\n");
        return 0;
    }
    setenv("CMALLOC_BACKGROUND_RELEASE", "1", 1);
    execve("/proc/self/exe", argv, environ);
    return 2;
}
