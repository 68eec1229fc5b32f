/* join_user_stack.c - a thread runs on a stack the program supplies, allocates 12 MiB in
 * 4 KiB blocks and frees them (so more than 8 MiB of free pages are resident); a joiner thread
 * whose first allocator call is glibc freeing the dead thread's TLS (inside pthread_join, with
 * glibc's stack-cache lock held) joins it. An allocator that starts a thread from that free
 * waits on the lock its caller holds. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void *victim(void *arg)
{
    (void)arg;
    enum { BLOCKS = 3072 };
    static void *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++)
        memset(blocks[i] = malloc(4096), 1, 4096);
    for (int i = 0; i < BLOCKS; i++)
        free(blocks[i]);
    return NULL;
}

static void *joiner(void *arg)
{
    pthread_join(*(pthread_t *)arg, NULL);
    return NULL;
}

int main(void)
{
    for (int round = 0; round < 5; round++) {
        size_t stack_size = 1 << 20;
        void *stack = malloc(stack_size);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstack(&attr, stack, stack_size);
        pthread_t thread, join_thread;
        if (pthread_create(&thread, &attr, victim, NULL) != 0)
            return 2;
        if (pthread_create(&join_thread, NULL, joiner, &thread) != 0)
            return 2;
        pthread_join(join_thread, NULL);
        pthread_attr_destroy(&attr);
        free(stack);
    }
    return 0;
}
