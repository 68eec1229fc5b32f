/* remote_cycle.c - the remote-free cycle in lockstep: each round, the main thread allocates n
 * blocks and writes a word of each, then a second thread frees them all (every free remote:
 * outbox, mailbox post, the owner's take of its mailbox and its spans coming back), the two
 * taking turns at a barrier. Run twice under callgrind (rounds = R and R + dR); the difference
 * over dR * n is the instructions a block costs from its malloc to its free, both threads'
 * loops included. The rounds are whole and the turns fixed, so the count repeats run to run
 * (callgrind runs one thread at a time; at a barrier the other one always goes next).
 *   remote_cycle ROUNDS N SIZE           every block SIZE bytes, freed in allocation order
 *   remote_cycle ROUNDS N SIZE mixed     sizes drawn uniformly from 16 .. SIZE + 15
 *   remote_cycle ROUNDS N SIZE shuffled  SIZE bytes, freed in an order that jumps from span to
 *                                        span (N a power of two: block i * 2654435761 mod N) */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long rounds, blocks_per_round;
static int shuffled;
static void **blocks;
static pthread_barrier_t turn;

static void *freer(void *arg)
{
    (void)arg;
    for (long r = 0; r < rounds; r++) {
        pthread_barrier_wait(&turn); /* the round's blocks are out */
        if (shuffled)
            for (size_t i = 0; i < (size_t)blocks_per_round; i++)
                free(blocks[i * 2654435761u % (size_t)blocks_per_round]);
        else
            for (long i = 0; i < blocks_per_round; i++)
                free(blocks[i]);
        pthread_barrier_wait(&turn); /* all freed */
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: remote_cycle ROUNDS N SIZE [mixed|shuffled]\n");
        return 2;
    }
    rounds = atol(argv[1]);
    blocks_per_round = atol(argv[2]);
    size_t size = (size_t)atol(argv[3]);
    int mixed = argc > 4 && strcmp(argv[4], "mixed") == 0;
    shuffled = argc > 4 && strcmp(argv[4], "shuffled") == 0;
    blocks = malloc((size_t)blocks_per_round * sizeof *blocks);
    if (blocks == NULL || size < sizeof(uintptr_t) ||
        (shuffled && (blocks_per_round & (blocks_per_round - 1)) != 0))
        return 1;
    pthread_barrier_init(&turn, NULL, 2);
    pthread_t other;
    if (pthread_create(&other, NULL, freer, NULL) != 0)
        return 1;
    uint32_t state = 1;
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < blocks_per_round; i++) {
            size_t s = size;
            if (mixed) {
                state = state * 1103515245u + 12345u;
                s = 16 + (state >> 8) % size;
            }
            uintptr_t *block = malloc(s);
            if (block == NULL)
                return 1;
            *(volatile uintptr_t *)block = (uintptr_t)i;
            blocks[i] = block;
        }
        pthread_barrier_wait(&turn);
        pthread_barrier_wait(&turn);
    }
    pthread_join(other, NULL);
    free(blocks);
    return 0;
}
