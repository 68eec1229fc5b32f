/* rng.h - the tests' random numbers: xorshift64*, small and seedable, one state per thread
 * (header only, no cmocka: the ThreadSanitizer stress uses it too).
 *
 * rng_next(&state): the next 64-bit number; state must not start at 0 (it would stay 0).
 */
#ifndef TESTS_RNG_H
#define TESTS_RNG_H

#include <stdint.h>

static inline uint64_t rng_next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

#endif /* TESTS_RNG_H */
