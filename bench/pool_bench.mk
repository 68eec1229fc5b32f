# bench/pool_bench.mk - the pool and arena benchmark (included by the top Makefile).
#
# build/bench/pool_bench includes cmalloc.h, as a program using the pool and arena would (its
# inline fast paths), and is linked with nothing of cmalloc's: it declares the API weak, and the
# symbols resolve when cmalloc is preloaded, so its malloc runs compare every allocator on the
# very same binary.
BENCH_BINS += build/bench/pool_bench

build/bench/pool_bench: bench/pool_bench.c bench/bench_util.h include/cmalloc.h | build/bench
	$(CC) $(CFLAGS) $(WARN) $(BENCH_CFLAGS) -Iinclude $< -o $@ -lpthread -lm
