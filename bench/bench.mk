# bench/bench.mk - the benchmark programs and `make bench` (included by the top Makefile).
#
# Each bench/<name>.c (except helpers) is one workload and builds to build/bench/<name>. They are
# linked against nothing but libc, libpthread and libm: the allocator under test is chosen at run
# time with LD_PRELOAD (scripts/bench-matrix.sh), so every allocator runs the very same binary.

BENCH_WORKLOADS := alloc_bench server_bench churn_bench peak_rss
BENCH_WORKLOADS += xmalloc_bench mstress_bench larson_bench rpmalloc_bench guard_calls
BENCH_WORKLOADS += fault_cost thread_stacks
BENCH_OWN_BINS  := $(addprefix build/bench/,$(BENCH_WORKLOADS))
BENCH_BINS      += $(BENCH_OWN_BINS)
BENCH_CFLAGS    := -std=gnu11 -pthread

build/bench:
	mkdir -p $@

build/bench/%: bench/%.c bench/bench_util.h | build/bench
	$(CC) $(CFLAGS) $(WARN) $(BENCH_CFLAGS) $< -o $@ -lpthread -lm

# A measuring tool preloaded in front of an allocator, not a workload: counts reallocs that move.
BENCH_BINS += build/bench/realloc_moves.so
build/bench/realloc_moves.so: bench/realloc_moves.c | build/bench
	$(CC) $(CFLAGS) $(WARN) $(BENCH_CFLAGS) -shared -fPIC $< -o $@ -ldl

# The quick matrix; the script ends with its summary (the full tables stay in
# bench/results/latest/matrix.md). BENCH_BINS is expanded when the recipe runs, so binaries
# that other fragments (read after this one) add are built too; a failure there only drops
# that workload from the matrix, the script says so.
bench: all $(BENCH_OWN_BINS)
	@others="$(filter-out $(BENCH_OWN_BINS),$(BENCH_BINS))"; [ -z "$$others" ] || \
	  $(MAKE) -s --no-print-directory $$others || \
	  echo "bench: some benchmark binaries did not build; the matrix skips them"
	sh scripts/bench-matrix.sh --quick $(BENCH_ARGS)
