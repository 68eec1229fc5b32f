# bench/pool_bench.mk - the pool and arena benchmark (included by the top Makefile).
#
# build/bench/pool_bench is built by bench.mk's rule like every bench/<name>.c, and linked with
# nothing of cmalloc's: it finds the pool and arena API with dlsym when cmalloc is preloaded, so
# its malloc runs compare every allocator on the very same binary.
BENCH_BINS += build/bench/pool_bench
