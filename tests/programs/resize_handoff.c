/* resize_handoff.c - message buffers built by one thread and resized by another: 4 producers
 * each make 12,000 messages, half with posix_memalign or aligned_alloc (alignment 32 B to 4 KiB,
 * size 1 B to 3 KiB), half with malloc, grow each by realloc to a random size (up to 40 KiB,
 * so some cross into page-heap blocks) and fill it with a pattern of the message's number,
 * then pass it through a locked queue of 256 slots to 4 consumers. A consumer checks the
 * alignment, the pattern and malloc_usable_size, reallocs the message to a smaller or larger
 * size (the old block, another thread's, freed in the move), checks the kept bytes, asks
 * malloc_usable_size again, and frees it. A realloc of a freed block, a block freed twice, a
 * lost byte or a wrong usable size shows as a failed check or an allocator report. Exit 0 when
 * every check held; "FAIL ..." and exit 1 otherwise; a hang ends with status 124 (watchdog). */
#include "../watchdog.h"
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PAIRS = 4, MESSAGES = 12000, SLOTS = 256 };

typedef struct message {
    unsigned char *data;
    size_t size, alignment;
    unsigned number;
} message;

static message queue[SLOTS];
static unsigned head, tail, count, producers_left = PAIRS;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static atomic_int failures;

static void fail(const char *what, unsigned number)
{
    if (atomic_fetch_add(&failures, 1) < 10)
        fprintf(stderr, "FAIL %s (message %u)\n", what, number);
}

static unsigned next(unsigned *seed)
{
    return *seed = *seed * 1103515245u + 12345u;
}

static void fill(unsigned char *data, size_t size, unsigned number)
{
    for (size_t i = 0; i < size; i++)
        data[i] = (unsigned char)(number + i * 7);
}

static size_t filled(const unsigned char *data, size_t size, unsigned number)
{
    for (size_t i = 0; i < size; i++)
        if (data[i] != (unsigned char)(number + i * 7))
            return i;
    return size;
}

static void *produce(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u;
    for (unsigned n = 0; n < MESSAGES; n++) {
        message m = {.number = (unsigned)(uintptr_t)arg * MESSAGES + n, .alignment = 16};
        size_t first = 1 + next(&seed) % 3072;
        void *p = NULL;
        unsigned how = next(&seed) % 4; /* 0: posix_memalign, 1: aligned_alloc, else malloc */
        if (how > 1) {
            p = malloc(first);
        } else {
            m.alignment = (size_t)32 << (next(&seed) % 8);
            if (how == 1)
                p = aligned_alloc(m.alignment, (first + m.alignment - 1) & ~(m.alignment - 1));
            else if (posix_memalign(&p, m.alignment, first) != 0)
                p = NULL;
        }
        if (p == NULL) {
            fail("allocation returned NULL", m.number);
            continue;
        }
        if ((uintptr_t)p % m.alignment != 0)
            fail("allocation not aligned", m.number);
        fill(p, first, m.number);
        m.size = 1 + next(&seed) % (next(&seed) % 8 == 0 ? 40960 : 2048);
        unsigned char *grown = realloc(p, m.size);
        if (grown == NULL) {
            fail("producer's realloc returned NULL", m.number);
            free(p);
            continue;
        }
        if (filled(grown, first < m.size ? first : m.size, m.number) <
            (first < m.size ? first : m.size))
            fail("producer's realloc lost bytes", m.number);
        fill(grown, m.size, m.number);
        m.data = grown;
        m.alignment = 16; /* what realloc keeps */
        pthread_mutex_lock(&lock);
        while (count == SLOTS)
            pthread_cond_wait(&changed, &lock);
        queue[tail] = m;
        tail = (tail + 1) % SLOTS;
        count++;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&lock);
    }
    pthread_mutex_lock(&lock);
    producers_left--;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void *consume(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 104729u;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (count == 0 && producers_left > 0)
            pthread_cond_wait(&changed, &lock);
        if (count == 0) {
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        message m = queue[head];
        head = (head + 1) % SLOTS;
        count--;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&lock);

        if ((uintptr_t)m.data % m.alignment != 0)
            fail("message not aligned", m.number);
        if (filled(m.data, m.size, m.number) < m.size)
            fail("message changed in the queue", m.number);
        if (malloc_usable_size(m.data) < m.size)
            fail("usable size below the size asked", m.number);
        size_t size = next(&seed) % 2 ? m.size / 3 + 1 : m.size + 1 + next(&seed) % 4096;
        unsigned char *moved = realloc(m.data, size);
        if (moved == NULL) {
            fail("consumer's realloc returned NULL", m.number);
            free(m.data);
            continue;
        }
        size_t kept = size < m.size ? size : m.size;
        if (filled(moved, kept, m.number) < kept)
            fail("consumer's realloc lost bytes", m.number);
        if (malloc_usable_size(moved) < size)
            fail("usable size below the size realloc asked", m.number);
        memset(moved, 0xee, size);
        free(moved);
    }
}

int main(void)
{
    start_watchdog("resize_handoff", 25);
    pthread_t producers[PAIRS], consumers[PAIRS];
    for (uintptr_t i = 0; i < PAIRS; i++)
        if (pthread_create(&producers[i], NULL, produce, (void *)(i + 1)) != 0 ||
            pthread_create(&consumers[i], NULL, consume, (void *)(i + 1)) != 0) {
            fprintf(stderr, "FAIL pthread_create\n");
            return 1;
        }
    for (int i = 0; i < PAIRS; i++) {
        pthread_join(producers[i], NULL);
        pthread_join(consumers[i], NULL);
    }
    if (atomic_load(&failures) != 0) {
        fprintf(stderr, "FAIL %d checks\n", atomic_load(&failures));
        return 1;
    }
    printf("resize_handoff: %d messages built, handed over and resized\n", PAIRS * MESSAGES);
    return 0;
}
