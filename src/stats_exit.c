/* stats_exit.c - the stats report at exit, CMALLOC_STATS=1 (stats.c's cmalloc_stats_print) or
 * json (stats_json.c's cmalloc_stats_print_json): above both, which it chooses between (the
 * JSON stands on stats.c's numbers, so neither may call the other for it). It runs after the
 * profile at exit is written (CM_EXIT_STATS), so the report names the profile's file.
 *
 * Where the report goes: CMALLOC_STATS_FILE's path (%p, %e expanded), appended to, so
 * processes sharing a path all land in it; else stderr. Programs such as coreutils' close
 * stderr in an atexit handler, before this library's destructor runs, so when the report is
 * on and goes to stderr, a copy of fd 2 is made at load (close-on-exec, fd 3 or above) and
 * used at exit when fd 2 is closed by then (and the copy is still the file it was: a program
 * may close every descriptor and open others). While fd 2 is open it is used, wherever the
 * program has pointed it.
 */
#include "internal.h"
#include "cmalloc.h"

static int stderr_copy = -1;   /* fd 2 as it was at load, when the report at exit goes there */
static uint64_t stderr_copy_id; /* which file that is, so that a reused number is not taken */

/* From the library's constructor (init.c), once the options are read. The call is also what
 * brings this file into a program linked with libcmalloc.a, which nothing else here would. */
void cm_stats_exit_init(void)
{
    if (cm_is_initialized() && cm_option.stats_at_exit && cm_option.stats_file == NULL) {
        stderr_copy = cm_os_duplicate(2);
        stderr_copy_id = stderr_copy >= 0 ? cm_os_file_id(stderr_copy) : 0;
    }
}

/* fd 2 while it is open, else the copy made at load while it is still that file (or 2, which
 * then writes nothing, when there is none). */
static int stderr_fd(void)
{
    if (cm_os_fd_is_open(2) || stderr_copy < 0 || cm_os_file_id(stderr_copy) != stderr_copy_id)
        return 2;
    return stderr_copy;
}

/* The report's destination at exit: the stats file, opened for appending, or stderr (also
 * when the file cannot be opened, after one line saying so). Closed by the caller when it is
 * not stderr_fd's. */
static int report_fd(void)
{
    if (cm_option.stats_file == NULL)
        return stderr_fd();
    cm_message path = {.length = 0};
    cm_message_path(&path, cm_option.stats_file);
    if (path.length < sizeof path.text) {
        path.text[path.length] = '\0';
        int fd = cm_os_open_append(path.text);
        if (fd >= 0)
            return fd;
    }
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: could not open CMALLOC_STATS_FILE '");
    cm_message_str(&m, cm_option.stats_file);
    cm_message_str(&m, path.length < sizeof path.text ? "'; the report follows here\n"
                                                      : "' (too long); the report follows here\n");
    int fd = stderr_fd();
    cm_message_write(&m, fd);
    return fd;
}

__attribute__((destructor(CM_EXIT_STATS))) static void stats_at_exit(void)
{
    if (!cm_is_initialized() || !cm_option.stats_at_exit)
        return;
    int fd = report_fd();
    (cm_option.stats_at_exit == CM_STATS_JSON ? cmalloc_stats_print_json : cmalloc_stats_print)(fd);
    if (fd != stderr_fd())
        cm_os_close(fd);
}
