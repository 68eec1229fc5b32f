/* os.c - the one file that talks to the kernel: virtual memory, time, output, locks.
 *
 * Owns: the count of bytes mapped from the OS, and the helper-thread primitive. Called by every layer; holds no lock and takes
 * none. Everything here is async-signal-unsafe-free of malloc: no stdio, no getenv, no dlsym.
 * Mappings are aligned to at least one cmalloc page (8 KiB) because the pagemap works in
 * 8 KiB pages and the kernel only promises 4 KiB.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#ifndef __linux__
#error "cmalloc supports Linux only (mremap, MADV_DONTNEED semantics)"
#endif

static _Atomic size_t mapped_bytes;

size_t cm_os_mapped_bytes(void)
{
    return atomic_load_explicit(&mapped_bytes, memory_order_relaxed);
}

static void *map_raw(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void *cm_os_map(size_t size)
{
    return cm_os_map_aligned(size, CM_PAGE_SIZE);
}

/* Maps size bytes (a multiple of CM_PAGE_SIZE) at an address aligned to alignment (a power of
 * two >= CM_PAGE_SIZE): over-map, then trim both ends. NULL with errno ENOMEM on failure. */
void *cm_os_map_aligned(size_t size, size_t alignment)
{
    size_t padded = size + alignment - 4096;
    if (padded < size) {
        errno = ENOMEM;
        return NULL;
    }
    char *raw = map_raw(padded);
    if (raw == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    char *start = (char *)(((uintptr_t)raw + alignment - 1) & ~(uintptr_t)(alignment - 1));
    if (start > raw)
        munmap(raw, (size_t)(start - raw));
    char *end = start + size, *raw_end = raw + padded;
    if (raw_end > end)
        munmap(end, (size_t)(raw_end - end));
    atomic_fetch_add_explicit(&mapped_bytes, size, memory_order_relaxed);
    return start;
}

void cm_os_unmap(void *address, size_t size)
{
    munmap(address, size);
    atomic_fetch_sub_explicit(&mapped_bytes, size, memory_order_relaxed);
}

/* Gives the pages back: they stay mapped and read as zero when touched again. */
void cm_os_release(void *address, size_t size)
{
    madvise(address, size, MADV_DONTNEED);
}

/* Grows or shrinks a mapping where it lies; false when the pages after it are taken. */
bool cm_os_resize(void *address, size_t old_size, size_t new_size)
{
    if (mremap(address, old_size, new_size, 0) == MAP_FAILED)
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
    if (mremap(old_address, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, new_address) ==
        MAP_FAILED)
        return false;
    atomic_fetch_sub_explicit(&mapped_bytes, old_size, memory_order_relaxed);
    return true;
}

/* Starts a detached thread with every signal blocked (so the program's handlers never run
 * on it). Returns false when the thread cannot be made. */
bool cm_os_start_thread(void *(*body)(void *))
{
    pthread_t thread;
    pthread_attr_t attributes;
    sigset_t all, previous;
    sigfillset(&all);
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attributes, 64 << 10);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int error = pthread_create(&thread, &attributes, body, NULL);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    pthread_attr_destroy(&attributes);
    return error == 0;
}

void cm_os_sleep_ms(uint64_t ms)
{
    struct timespec delay = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&delay, &delay) != 0 && errno == EINTR)
        ;
}

void cm_os_yield(void)
{
    sched_yield();
}

/* A random word for keys; falls back to address and clock entropy without getrandom. */
uintptr_t cm_os_random(void)
{
    uintptr_t value = 0;
    if (getrandom(&value, sizeof value, GRND_NONBLOCK) == (ssize_t)sizeof value)
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

void cm_os_write(int fd, const char *text, size_t length)
{
    while (length > 0) {
        ssize_t written = write(fd, text, length);
        if (written <= 0) {
            if (written < 0 && errno == EINTR)
                continue;
            return;
        }
        text += written;
        length -= (size_t)written;
    }
}

/* ---- locks ---------------------------------------------------------------------------------
 * pthread mutexes: futex-based, never allocate, and sleep rather than spin, which matters when
 * more threads than cores contend on a 2-core machine. */
void cm_lock_acquire(cm_lock *lock) { pthread_mutex_lock(lock); }
void cm_lock_release(cm_lock *lock) { pthread_mutex_unlock(lock); }
void cm_lock_reinit(cm_lock *lock) { pthread_mutex_init(lock, NULL); }

/* The fork protocol for one lock: held across fork, released in the parent and made new in the
 * child (whose copy is owned by a thread that no longer exists there). */
void cm_lock_fork(cm_lock *lock, int phase)
{
    if (phase == CM_FORK_PREPARE)
        cm_lock_acquire(lock);
    else if (phase == CM_FORK_PARENT)
        cm_lock_release(lock);
    else
        cm_lock_reinit(lock);
}

/* ---- messages ------------------------------------------------------------------------------ */
void cm_message_str(cm_message *m, const char *s)
{
    while (*s && m->length < sizeof m->text)
        m->text[m->length++] = *s++;
}

static void message_digits(cm_message *m, uint64_t value, unsigned base)
{
    char digits[24];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[value % base];
        value /= base;
    } while (value);
    while (n > 0 && m->length < sizeof m->text)
        m->text[m->length++] = digits[--n];
}

void cm_message_uint(cm_message *m, uint64_t value) { message_digits(m, value, 10); }

void cm_message_hex(cm_message *m, uint64_t value)
{
    cm_message_str(m, "0x");
    message_digits(m, value, 16);
}

void cm_message_write(cm_message *m, int fd)
{
    cm_os_write(fd, m->text, m->length);
    m->length = 0;
}
