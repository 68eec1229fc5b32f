/* os.c - the one file that talks to the kernel: virtual memory, time, output, locks.
 *
 * Owns: the count of bytes mapped from the OS (and of bytes asked to be populated), the
 * helper-thread primitive, the locks and the fork protocol's platform side (stdio's list lock,
 * whether the process is single-threaded).
 * Called by every layer; holds no lock of its own. Nothing here calls malloc: no stdio, no
 * getenv, no dlsym. Mappings are aligned to at least one cmalloc page (8 KiB) because the
 * pagemap works in 8 KiB pages and the kernel only promises 4 KiB.
 * errno: every function here but cm_os_open leaves it as it found it, so no entry point changes
 * errno except where an allocation fails and error.c's cm_out_of_memory sets ENOMEM (POSIX: free
 * and the rest never touch it).
 */
#define _GNU_SOURCE
#include "os.h" /* alone: error.c stands on this file */

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/single_threaded.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef __linux__
#error "cmalloc supports Linux only (mremap, MADV_DONTNEED semantics)"
#endif

static _Atomic size_t mapped_bytes;
static _Atomic size_t populated_bytes; /* asked of cm_os_populate (whatever the kernel did) */

size_t cm_os_mapped_bytes(void)
{
    return atomic_load_explicit(&mapped_bytes, memory_order_relaxed);
}

size_t cm_os_populated_bytes(void)
{
    return atomic_load_explicit(&populated_bytes, memory_order_relaxed);
}

/* Brackets a system call that may set errno: ERRNO_KEEP at the top, ERRNO_RESTORE on the way out.
 */
#define ERRNO_KEEP    int saved_errno = errno
#define ERRNO_RESTORE errno = saved_errno

static void *map_raw(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void *cm_os_map(size_t size)
{
    return cm_os_map_aligned(size, CM_PAGE_SIZE);
}

/* Maps size bytes of zeros for a table that is read anywhere and written in few places (the
 * pagemap's leaves): resident only where written, and not counted as mapped, as its owner
 * counts what it writes. NULL on failure. */
void *cm_os_map_sparse(size_t size)
{
    ERRNO_KEEP;
    void *p = map_raw(size);
    ERRNO_RESTORE;
    return p;
}

/* Maps size bytes (a multiple of CM_PAGE_SIZE) at an address aligned to alignment (a power of
 * two >= CM_PAGE_SIZE): over-map, then trim both ends. NULL on failure. */
void *cm_os_map_aligned(size_t size, size_t alignment)
{
    size_t padded = size + alignment - CM_SYSTEM_PAGE; /* the kernel aligns to its page already */
    if (padded < size)
        return NULL;
    ERRNO_KEEP;
    char *raw = map_raw(padded), *start = NULL;
    if (raw != NULL) {
        start = (char *)(((uintptr_t)raw + alignment - 1) & ~(uintptr_t)(alignment - 1));
        if (start > raw)
            munmap(raw, (size_t)(start - raw));
        char *end = start + size, *raw_end = raw + padded;
        if (raw_end > end)
            munmap(end, (size_t)(raw_end - end));
        atomic_fetch_add_explicit(&mapped_bytes, size, memory_order_relaxed);
    }
    ERRNO_RESTORE;
    return start;
}

/* munmap fails when splitting a mapping needs a new one past the process's mapping limit: the
 * pages then stay mapped (and counted), given back to the OS at least. */
void cm_os_unmap(void *address, size_t size)
{
    ERRNO_KEEP;
    if (munmap(address, size) == 0)
        atomic_fetch_sub_explicit(&mapped_bytes, size, memory_order_relaxed);
    else
        madvise(address, size, MADV_DONTNEED);
    ERRNO_RESTORE;
}

/* Gives the pages back: they stay mapped and read as zero when touched again. */
void cm_os_release(void *address, size_t size)
{
    ERRNO_KEEP;
    madvise(address, size, MADV_DONTNEED);
    ERRNO_RESTORE;
}

/* Faults in [address, address + size) for writing with one system call (MADV_POPULATE_WRITE,
 * Linux 5.14) where writing to it would take a fault a page: 9.4 us a page by faults against
 * 6.6 us for a single page and 4.8 us a page for 16 by the call, on the VMs the committed
 * matrix ran on (`build/bench/fault_cost`). What the call cannot do changes nothing: the
 * writes then fault as they would have. A refusal that will not change (an older kernel's
 * EINVAL, a sandbox's EPERM or ENOSYS: seccomp filters that allow madvise only for the advice
 * they know) stops the asking for the process; only a passing one (ENOMEM, EAGAIN, EINTR) is
 * asked again. */
void cm_os_populate(void *address, size_t size)
{
    atomic_fetch_add_explicit(&populated_bytes, size, memory_order_relaxed);
#ifdef MADV_POPULATE_WRITE
    static _Atomic bool unsupported;
    if (atomic_load_explicit(&unsupported, memory_order_relaxed))
        return;
    ERRNO_KEEP;
    if (madvise(address, size, MADV_POPULATE_WRITE) != 0 && errno != ENOMEM && errno != EAGAIN &&
        errno != EINTR)
        atomic_store_explicit(&unsupported, true, memory_order_relaxed);
    ERRNO_RESTORE;
#else
    (void)address;
#endif
}

/* Reserves size bytes of address space with no access (guard.c's slot pool): nothing resident
 * until cm_os_protect opens a page. Not counted as mapped. NULL when refused. */
void *cm_os_reserve(size_t size)
{
    ERRNO_KEEP;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ERRNO_RESTORE;
    return p == MAP_FAILED ? NULL : p;
}

/* Makes part of a reservation a mapping of its own, still inaccessible. Its flags differ from
 * the reservation's, so the kernel never merges it with its neighbours: changing its protection
 * later rewrites one mapping instead of splitting and merging three (2 us against 5 us for an
 * open and a close here). */
bool cm_os_separate(void *address, size_t size)
{
    ERRNO_KEEP;
    bool done =
        mmap(address, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == address;
    ERRNO_RESTORE;
    return done;
}

/* Linux 6.13's guard markers, for headers that predate them. */
#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

/* Puts a kernel guard marker on each page (Linux 6.13+): a touch faults whatever the mapping's
 * protection, and the marker stays through mprotect, so a range that spans guard pages can be
 * opened in one call. False when the kernel has none (EINVAL before 6.13). */
bool cm_os_guard_pages(void *address, size_t size)
{
    ERRNO_KEEP;
    bool done = madvise(address, size, MADV_GUARD_INSTALL) == 0;
    ERRNO_RESTORE;
    return done;
}

/* Opens pages for reading and writing, or closes them so that any touch faults. */
bool cm_os_protect(void *address, size_t size, bool accessible)
{
    ERRNO_KEEP;
    bool done = mprotect(address, size, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) == 0;
    ERRNO_RESTORE;
    return done;
}

/* Grows or shrinks a mapping where it lies; false when the pages after it are taken. */
bool cm_os_resize(void *address, size_t old_size, size_t new_size)
{
    ERRNO_KEEP;
    bool done = mremap(address, old_size, new_size, 0) != MAP_FAILED;
    ERRNO_RESTORE;
    if (!done)
        return false;
    if (new_size > old_size)
        atomic_fetch_add_explicit(&mapped_bytes, new_size - old_size, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&mapped_bytes, old_size - new_size, memory_order_relaxed);
    return true;
}

/* Moves the pages of a mapping, without copying them, over a reservation made by cm_os_map
 * (the kernel alone would pick an address only 4 KiB aligned). The old range is gone after. */
bool cm_os_move(void *old_address, size_t old_size, void *new_address, size_t new_size)
{
    ERRNO_KEEP;
    bool done = mremap(old_address, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED,
                       new_address) != MAP_FAILED;
    ERRNO_RESTORE;
    if (done)
        atomic_fetch_sub_explicit(&mapped_bytes, old_size, memory_order_relaxed);
    return done;
}

/* Starts a detached thread with every signal blocked (so the program's handlers never run
 * on it). Its stack starts small and doubles while glibc refuses it as too small for the
 * program's static TLS, which glibc places on every thread's stack. Called only where no
 * allocator or glibc lock is held (background.c). False when no thread could be made. */
bool cm_os_start_thread(void *(*body)(void *))
{
    ERRNO_KEEP;
    pthread_t thread;
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int error = EINVAL;
    for (size_t stack = 64 << 10; error == EINVAL && stack <= ((size_t)64 << 20); stack *= 2) {
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attributes, stack);
        error = pthread_create(&thread, &attributes, body, NULL);
        pthread_attr_destroy(&attributes);
    }
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    ERRNO_RESTORE;
    return error == 0;
}

void cm_os_sleep_ms(uint64_t ms)
{
    ERRNO_KEEP;
    struct timespec delay = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&delay, &delay) != 0 && errno == EINTR)
        ;
    ERRNO_RESTORE;
}

void cm_os_yield(void)
{
    sched_yield();
}

/* A random word for keys; falls back to address and clock entropy without getrandom. */
uintptr_t cm_os_random(void)
{
    ERRNO_KEEP;
    uintptr_t value = 0;
    ssize_t got = getrandom(&value, sizeof value, GRND_NONBLOCK);
    ERRNO_RESTORE;
    if (got == (ssize_t)sizeof value)
        return value;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    value = (uintptr_t)&now ^ ((uintptr_t)now.tv_nsec << 32) ^ (uintptr_t)now.tv_sec;
    return value * 0x9e3779b97f4a7c15ull;
}

uint64_t cm_os_now_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    return (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
}

int cm_os_process_id(void)
{
    return (int)getpid();
}

int cm_os_thread_id(void)
{
    return (int)gettid();
}

/* Whether the thread with kernel id tid is still running in this process. A thread's id
 * leaves the process only once the thread has run its last instruction. */
bool cm_os_thread_alive(int pid, int tid)
{
    ERRNO_KEEP;
    bool alive = syscall(SYS_tgkill, pid, tid, 0) == 0 || errno != ESRCH;
    ERRNO_RESTORE;
    return alive;
}

/* ---- thread cancellation -------------------------------------------------------------------
 * malloc and free are not cancellation points; a system call cmalloc makes on their behalf
 * that is one (write, the profiler's unwinder reading a pipe, a dump's open and read) runs
 * with cancellation off. */
int cm_os_cancel_off(void)
{
    int previous = PTHREAD_CANCEL_ENABLE;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &previous);
    return previous;
}

void cm_os_cancel_restore(int previous)
{
    pthread_setcancelstate(previous, NULL);
}

/* Not a cancellation point, unlike write(2): a thread with a pending cancel still gets its
 * report or malloc_stats out, as with glibc. True when every byte was written. */
bool cm_os_write(int fd, const char *text, size_t length)
{
    ERRNO_KEEP;
    int cancel_state = cm_os_cancel_off();
    while (length > 0) {
        ssize_t written = write(fd, text, length);
        if (written <= 0) {
            if (written < 0 && errno == EINTR)
                continue;
            break;
        }
        text += written;
        length -= (size_t)written;
    }
    cm_os_cancel_restore(cancel_state);
    ERRNO_RESTORE;
    return length == 0;
}

/* ---- files (the profiler's dumps and /proc/self/maps) ---------------------------------------
 * Opened close-on-exec. cm_os_open is the one function here that reports through errno: its
 * failure is what cmalloc_prof_dump returns to the program. */
int cm_os_open(const char *path, bool for_writing)
{
    return open(path, for_writing ? O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDONLY | O_CLOEXEC,
                0644);
}

/* For reports appended to by every process of a command that shares the path (the stats
 * report's STATS_FILE): a later process's report never truncates an earlier one's. */
int cm_os_open_append(const char *path)
{
    ERRNO_KEEP;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ERRNO_RESTORE;
    return fd;
}

/* A close-on-exec copy of fd numbered 3 or above (stderr kept for the report at exit, should
 * the program close fd 2 first), or -1. */
int cm_os_duplicate(int fd)
{
    ERRNO_KEEP;
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    ERRNO_RESTORE;
    return copy;
}

/* Which open file fd is (device and inode folded into one number), 0 when fd is not open: so
 * that a kept copy whose number the program closed and reused for another file is not
 * taken for stderr. */
uint64_t cm_os_file_id(int fd)
{
    ERRNO_KEEP;
    struct stat st;
    uint64_t id = fstat(fd, &st) == 0 ? ((uint64_t)st.st_dev << 40) ^ (uint64_t)st.st_ino ^ 1 : 0;
    ERRNO_RESTORE;
    return id;
}

bool cm_os_fd_is_open(int fd)
{
    ERRNO_KEEP;
    bool open = fcntl(fd, F_GETFD) != -1;
    ERRNO_RESTORE;
    return open;
}

/* The program's name as it was started (argv[0] without its directory), kept by glibc. */
const char *cm_os_program_name(void)
{
    return program_invocation_short_name ? program_invocation_short_name : "";
}

/* Up to capacity bytes; 0 at the end of the file or on an error. */
size_t cm_os_read(int fd, void *buffer, size_t capacity)
{
    ERRNO_KEEP;
    ssize_t n;
    do
        n = read(fd, buffer, capacity);
    while (n < 0 && errno == EINTR);
    ERRNO_RESTORE;
    return n > 0 ? (size_t)n : 0;
}

/* False when the file could not be closed cleanly (a written file may have lost data). */
bool cm_os_close(int fd)
{
    ERRNO_KEEP;
    bool done = close(fd) == 0;
    ERRNO_RESTORE;
    return done;
}

/* ---- locks ---------------------------------------------------------------------------------
 * pthread mutexes: futex-based, never allocate, and sleep rather than spin, which matters when
 * more threads than cores contend on a 2-core machine.
 * Between the fork prepare handler and the parent or child handler the forking thread holds
 * every allocator lock; other libraries' atfork handlers run in that window on the same thread
 * and may allocate, so for that thread taking and dropping a lock are no-ops then (it already
 * holds them all, and every other thread is kept out). */
static CM_THREAD_LOCAL bool holding_all_for_fork;
/* Allocator locks this thread holds: more than 0 at fork's prepare handler only when fork was
 * called from a signal handler that interrupted this thread inside the allocator. */
static CM_THREAD_LOCAL unsigned locks_held;

void cm_lock_acquire(cm_lock *lock)
{
    if (CM_LIKELY(!holding_all_for_fork)) {
        locks_held++; /* counted before and after: a signal in between errs toward "held" */
        pthread_mutex_lock(lock);
    }
}

void cm_lock_release(cm_lock *lock)
{
    if (CM_LIKELY(!holding_all_for_fork)) {
        pthread_mutex_unlock(lock);
        locks_held--;
    }
}

void cm_lock_reinit(cm_lock *lock)
{
    pthread_mutex_init(lock, NULL);
}

/* For CM_ASSERT in the _locked functions: whether the calling thread holds lock (glibc's
 * mutex records its owner's thread id; in a forked child, until the child handler, the locks
 * are still the parent's thread's, whose id the child's thread does not have). The id is the
 * one glibc records, read back from a mutex of our own: in a child made by clone() or
 * syscall(SYS_fork) glibc still gives the main thread its parent thread's id, not gettid(). */
bool cm_lock_is_mine(const cm_lock *lock)
{
    pthread_mutex_t probe = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&probe);
    int me = probe.__data.__owner;
    pthread_mutex_unlock(&probe);
    return holding_all_for_fork || lock->__data.__owner == me;
}

/* The fork protocol for one lock: held across fork, released in the parent and made new in the
 * child (whose copy is owned by a thread that no longer exists there). */
void cm_lock_fork(cm_lock *lock, int phase)
{
    if (phase == CM_FORK_PREPARE)
        pthread_mutex_lock(lock);
    else if (phase == CM_FORK_PARENT)
        pthread_mutex_unlock(lock);
    else
        cm_lock_reinit(lock);
}

/* glibc's stdio list lock, exported by glibc though declared in no public header (weak, so
 * another libc merely goes without). glibc's fork takes it after the atfork prepare handlers
 * and before its own malloc's locks: stdio first, then the allocator. A prepare handler that
 * took the allocator's locks first would wait in fork for a thread inside fflush(NULL), which
 * waits for a FILE whose owner, inside getline, waits for an allocator lock. */
extern void _IO_list_lock(void) __attribute__((weak));
extern void _IO_list_unlock(void) __attribute__((weak));
extern void _IO_list_resetlock(void) __attribute__((weak));

/* The fork protocol's platform side; returns (at PREPARE) whether the allocator must take its
 * locks. A single-threaded process skips them, as glibc does for its own malloc: no other
 * thread can hold one, and fork may come from a signal handler that interrupted this thread
 * inside the allocator, holding a lock it would wait on forever. So does a thread that holds
 * an allocator lock itself, which only such a handler can be: the process may be
 * multi-threaded only through cmalloc's own release thread (CMALLOC_BACKGROUND_RELEASE=1), or
 * through threads that cannot be waited for without this one waiting for itself. The child
 * then inherits the locks as they are, as a single-threaded process's child does
 * (tests/programs/fork_in_signal.c, its second run). */
bool cm_os_fork(int phase)
{
    if (phase == CM_FORK_PREPARE) {
        if (__libc_single_threaded || locks_held > 0)
            return false;
        if (_IO_list_lock)
            _IO_list_lock();
        return true;
    }
    if (phase == CM_FORK_PARENT) {
        holding_all_for_fork = false;
        if (_IO_list_unlock)
            _IO_list_unlock();
    } else {
        holding_all_for_fork = false;
        if (_IO_list_resetlock) /* stdio's list lock is recursive: glibc's child resets it too */
            _IO_list_resetlock();
    }
    return true;
}

/* Called by the prepare handler once every allocator lock is held. */
void cm_os_fork_locked(void)
{
    holding_all_for_fork = true;
}
