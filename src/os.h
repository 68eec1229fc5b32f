/* os.h - the bottom of the library: what every file uses (branch hints, attributes, the debug
 * build's checks, the power-of-two test, the line fetch, the fork phases) and os.c's contract
 * with the kernel. os.c includes this file alone, error.c with error.h; every other file has it
 * through internal.h.
 */
#ifndef CM_OS_H
#define CM_OS_H

#include "types.h"
#include <stdbool.h>

#pragma GCC visibility push(hidden) /* as internal.h says */

#define CM_LIKELY(x)    __builtin_expect(!!(x), 1)
#define CM_UNLIKELY(x)  __builtin_expect(!!(x), 0)
#define CM_NOINLINE     __attribute__((noinline))
#define CM_ALWAYS_INLINE inline __attribute__((always_inline))
#define CM_COLD         __attribute__((cold, noinline))
#define CM_THREAD_LOCAL __thread __attribute__((tls_model("initial-exec")))
#define CM_EXPORT       __attribute__((visibility("default")))

/* Debug builds (-DCM_DEBUG, `make debug-test`): CM_ASSERT checks an invariant and aborts with
 * its text; the slow paths also walk the whole heap (cm_heap_check) every CM_DEBUG_WALK_EVERY
 * calls. Release builds compile both to nothing. Never used on the fast paths. */
#ifdef CM_DEBUG
CM_COLD __attribute__((noreturn)) void cm_assert_failed(const char *file, int line,
                                                        const char *what);
void cm_debug_walk(void);
#define CM_ASSERT(condition) \
    (CM_LIKELY(condition) ? (void)0 : cm_assert_failed(__FILE__, __LINE__, #condition))
#define CM_DEBUG_WALK() cm_debug_walk()
#else
#define CM_ASSERT(condition) ((void)0)
#define CM_DEBUG_WALK()      ((void)0)
#endif
#define CM_DEBUG_WALK_EVERY 50000

static inline bool cm_is_power_of_two(size_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

/* Loads the line at p and drops the value: a fetch the core may not drop, as it may a prefetch
 * instruction when its miss buffers are full (internal.h's cm_span_prefetch_objects). Written
 * as an instruction, not a C read: the line may hold a live object another thread writes, and
 * the value is never used. p must be mapped and resident (a prefetch never faults; this may). */
static inline void cm_fetch_line(const void *p)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("cmpb $0, %0" : : "m"(*(const char *)p) : "cc");
#elif defined(__aarch64__)
    unsigned value;
    __asm__ volatile("ldrb %w0, %1" : "=r"(value) : "Q"(*(const char *)p));
    (void)value;
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

enum { CM_FORK_PREPARE, CM_FORK_PARENT, CM_FORK_CHILD };

/* os.c: the only file that talks to the kernel */
void *cm_os_map(size_t size);
void *cm_os_map_aligned(size_t size, size_t alignment);
void *cm_os_map_sparse(size_t size);
void cm_os_unmap(void *address, size_t size);
void cm_os_release(void *address, size_t size);
void cm_os_populate(void *address, size_t size);
void *cm_os_reserve(size_t size);
bool cm_os_separate(void *address, size_t size);
bool cm_os_guard_pages(void *address, size_t size);
bool cm_os_protect(void *address, size_t size, bool accessible);
bool cm_os_resize(void *address, size_t old_size, size_t new_size);
bool cm_os_move(void *old_address, size_t old_size, void *new_address, size_t new_size);
uint64_t cm_os_now_ms(void);
uintptr_t cm_os_random(void);
void cm_os_yield(void);
void cm_os_sleep_ms(uint64_t ms);
bool cm_os_start_thread(void *(*body)(void *));
bool cm_os_write(int fd, const char *text, size_t length);
int cm_os_open(const char *path, bool for_writing);
int cm_os_open_append(const char *path);
int cm_os_duplicate(int fd);
bool cm_os_fd_is_open(int fd);
uint64_t cm_os_file_id(int fd);
const char *cm_os_program_name(void);
size_t cm_os_read(int fd, void *buffer, size_t capacity);
bool cm_os_close(int fd);
int cm_os_cancel_off(void);
void cm_os_cancel_restore(int previous);
int cm_os_process_id(void);
int cm_os_thread_id(void);
bool cm_os_thread_alive(int pid, int tid); /* pid: cm_os_process_id() */
size_t cm_os_mapped_bytes(void);
size_t cm_os_populated_bytes(void);
bool cm_os_fork(int phase);
void cm_os_fork_locked(void);
void cm_lock_acquire(cm_lock *lock);
void cm_lock_release(cm_lock *lock);
void cm_lock_reinit(cm_lock *lock);
bool cm_lock_is_mine(const cm_lock *lock);
void cm_lock_fork(cm_lock *lock, int phase);

#pragma GCC visibility pop

#endif /* CM_OS_H */
