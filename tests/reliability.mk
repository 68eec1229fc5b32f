# tests/reliability.mk - reliability tests and tools, included by the top Makefile.
#
#   make test                  also runs (through tests/test_*.c, tests/test_*.sh and the rules
#                              here): test_errors, test_oom, test_oom_cxx.sh, test_release,
#                              test_fork_stress, and the fuzz corpus replayed by
#                              build/tests/test_fuzz_replay (about 40 s of the total on 2 cores)
#   make fuzz                  libFuzzer over every entry point (FUZZ_SECONDS, default 60)
#   make sanitize              ThreadSanitizer, UBSan and ASan runs (about 3 minutes)
#   make soak                  minutes of mixed-size threads, RSS must stay flat (SOAK_SECONDS)

# ---- fuzzing ---------------------------------------------------------------------------------
# build/fuzz/fuzz_entry_points: libFuzzer (clang) against a prefixed copy of cmalloc
# (-DCM_PREFIX=cmfuzz_, coverage-instrumented, UBSan on), objects in build/fuzz/obj.
# build/tests/test_fuzz_replay: the same harness with a main() that replays tests/fuzz_corpus/
# against build/libcmalloc.a; run by `make test`.
#
#   make fuzz                      60 s (FUZZ_SECONDS=600 for longer); new inputs go to
#                                  build/fuzz/corpus, crashes to build/fuzz/crash-*
#   make fuzz FUZZ_ENV="CMALLOC_CHECK=1"         fuzz the debug mode
# A crash input goes into tests/fuzz_corpus/ (replayed by `make test`) with the fix of its bug.
#   build/tests/test_fuzz_replay FILE...   replay inputs (a crash, a directory)
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_ENV     ?=
FUZZ_SAN     := -fsanitize=undefined -fno-sanitize-recover=undefined
FUZZ_OBJS    := $(patsubst src/%.c,build/fuzz/obj/%.o,$(SRCS))

build/fuzz/obj build/fuzz/corpus:
	mkdir -p $@

build/fuzz/obj/%.o: src/%.c $(LIB_HEADERS) | build/fuzz/obj
	$(FUZZ_CC) -O1 -g $(LIBFLAGS) -DCM_PREFIX=cmfuzz_ -fsanitize=fuzzer-no-link $(FUZZ_SAN) -c $< -o $@

build/fuzz/fuzz_entry_points: tests/fuzz_entry_points.c $(FUZZ_OBJS)
	$(FUZZ_CC) -O1 -g -std=gnu11 -Wall -Wextra -Iinclude -fsanitize=fuzzer $(FUZZ_SAN) $< $(FUZZ_OBJS) -o $@ -lpthread

build/tests/test_fuzz_replay: tests/fuzz_entry_points.c $(LIB_A) | build/tests
	$(CC) $(TEST_CFLAGS) -DFUZZ_REPLAY_MAIN $< -o $@ $(LIB_A) -lpthread

TEST_BINS += build/tests/test_fuzz_replay
test: build/tests/test_fuzz_replay

fuzz: build/fuzz/fuzz_entry_points | build/fuzz/corpus
	env $(FUZZ_ENV) build/fuzz/fuzz_entry_points -max_total_time=$(FUZZ_SECONDS) -max_len=2048 -rss_limit_mb=4096 \
	    -timeout=30 -print_final_stats=1 -artifact_prefix=build/fuzz/ build/fuzz/corpus tests/fuzz_corpus

.PHONY: fuzz

# ---- sanitizers ------------------------------------------------------------------------------
#   make sanitize        all three below; each logs to build/<tsan|ubsan|asan>/*.log
#   make sanitize-tsan   ThreadSanitizer over the allocator's internals: src/*.c compiled with
#                        -fsanitize=thread -DCM_PREFIX=cmtsan_ (so TSan keeps its own malloc),
#                        stressed by tests/stress_tsan.c: the allocation paths, then with a
#                        thread reading cmalloc_stats_get, then with lazy init raced by 8 threads
#   make sanitize-ubsan  UndefinedBehaviorSanitizer in the allocator: a copy of libcmalloc.a built
#                        with -fsanitize=undefined -fno-sanitize-recover, linked into every
#                        tests/test_*.c (but test_orderbook, which does not use it) and the fuzz
#                        replay, all run as in `make test` (the test code is not instrumented:
#                        some tests overrun blocks on purpose)
#   make sanitize-asan   AddressSanitizer + UBSan over the order-book driver (its own objects,
#                        built into build/asan/; ASan replaces malloc, so cmalloc is not in it):
#                        its cmocka tests, then gen and replay (1 thread, 2 threads, pipeline)
# A report fails the target; races are fixed in src, not suppressed (tests/tsan.supp holds
# only genuine false positives, each with its reason).
SAN_CC    ?= clang
TSAN_OBJS := $(patsubst src/%.c,build/tsan/obj/%.o,$(SRCS))
UBSAN_OBJS := $(patsubst src/%.c,build/ubsan/obj/%.o,$(SRCS))
# new_handler.cc, the one C++ object, goes in as the release build made it (weak C++ symbols).
UBSAN_OBJS   += $(patsubst src/%.cc,build/obj/%.o,$(CXX_SRCS))
UBSAN_FLAGS := -fsanitize=undefined -fno-sanitize-recover=undefined
UBSAN_TESTS := $(patsubst tests/%.c,build/ubsan/tests/%,$(filter-out tests/test_orderbook.c,$(wildcard tests/test_*.c))) \
               build/ubsan/tests/test_fuzz_replay
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
ASAN_OB_OBJS := $(patsubst $(OB_DIR)/%.c,build/asan/orderbook-obj/%.o,$(OB_LIB_SRCS))
TSAN_RUN := TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp $(TSAN_OPTIONS)"
SAN_ENV  := UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 $(UBSAN_OPTIONS)" \
            ASAN_OPTIONS="detect_leaks=1 abort_on_error=0 $(ASAN_OPTIONS)"

build/tsan/obj build/ubsan/obj build/ubsan/tests build/asan/orderbook-obj build/asan/tests:
	mkdir -p $@

build/tsan/obj/%.o: src/%.c $(LIB_HEADERS) | build/tsan/obj
	$(SAN_CC) -O1 -g $(LIBFLAGS) -DCM_PREFIX=cmtsan_ -fsanitize=thread -c $< -o $@

build/tsan/stress_tsan: tests/stress_tsan.c tests/rng.h $(TSAN_OBJS)
	$(SAN_CC) -O1 -g -std=gnu11 -Wall -Wextra -pthread -Iinclude -fsanitize=thread $< $(TSAN_OBJS) -o $@

build/ubsan/obj/%.o: src/%.c $(LIB_HEADERS) | build/ubsan/obj
	$(CC) -O1 -g $(WARN) $(LIBFLAGS) $(UBSAN_FLAGS) -c $< -o $@

build/ubsan/libcmalloc.a: $(UBSAN_OBJS)
	rm -f $@
	ar rcs $@ $(UBSAN_OBJS)

# The tests themselves are compiled without UBSan (some overrun a block on purpose, which
# -fsanitize=object-size would report); only the library is instrumented, and the UBSan runtime
# is linked in.
build/ubsan/tests/test_fuzz_replay: tests/fuzz_entry_points.c build/ubsan/libcmalloc.a | build/ubsan/tests
	$(CC) $(TEST_CFLAGS) -DFUZZ_REPLAY_MAIN -c $< -o $@.o
	$(CC) $(UBSAN_FLAGS) $@.o -o $@ build/ubsan/libcmalloc.a -lpthread

# The pool and arena tests are the exception: cmalloc.h's inline fast paths are compiled into
# them, so they are instrumented too (object-size left out, as above).
build/ubsan/tests/test_pool build/ubsan/tests/test_arena: TEST_SAN := $(UBSAN_FLAGS) -fno-sanitize=object-size
build/ubsan/tests/%: tests/%.c build/ubsan/libcmalloc.a | build/ubsan/tests
	$(CC) $(TEST_CFLAGS) $(TEST_SAN) -c $< -o $@.o
	$(CC) $(UBSAN_FLAGS) -pthread $@.o -o $@ build/ubsan/libcmalloc.a -lcmocka -lpthread

build/asan/orderbook-obj/%.o: $(OB_DIR)/%.c $(OB_DIR)/book.h include/cmalloc.h | build/asan/orderbook-obj
	$(SAN_CC) -O1 -g $(WARN) $(OB_CFLAGS) $(ASAN_FLAGS) -c $< -o $@

build/asan/orderbook: $(ASAN_OB_OBJS) build/asan/orderbook-obj/main.o
	$(SAN_CC) $(ASAN_FLAGS) -o $@ $^ $(OB_LIBS)

build/asan/tests/test_orderbook: tests/test_orderbook.c $(ASAN_OB_OBJS) | build/asan/tests
	$(SAN_CC) -std=gnu11 -O1 -g -pthread -Iinclude -I$(OB_DIR) $(ASAN_FLAGS) $< -o $@ $(ASAN_OB_OBJS) -lcmocka $(OB_LIBS)

sanitize-tsan: build/tsan/stress_tsan
	@status=0; for mode in "" "--stats" "--init-race"; do \
	    echo "== TSan: build/tsan/stress_tsan $$mode (log: build/tsan/stress$${mode:-plain}.log)"; \
	    $(TSAN_RUN) build/tsan/stress_tsan $$mode > build/tsan/stress$${mode:-plain}.log 2>&1; rc=$$?; \
	    grep -E "^stress_tsan|^SUMMARY|^ThreadSanitizer: reported" build/tsan/stress$${mode:-plain}.log; \
	    if [ $$rc -ne 0 ]; then echo "   FAILED (exit status $$rc)"; status=1; else echo "   clean"; fi; \
	done; exit $$status

sanitize-ubsan: $(UBSAN_TESTS)
	@status=0; for t in $(UBSAN_TESTS); do \
	    echo "== UBSan: $$t (log: $$t.log)"; \
	    $(SAN_ENV) $$t > $$t.log 2>&1; rc=$$?; \
	    if [ $$rc -ne 0 ] || grep -q "runtime error" $$t.log; then \
	        echo "   FAILED (exit status $$rc)"; grep -m5 -E "runtime error|FAILED|ERROR" $$t.log; status=1; \
	    else echo "   clean"; fi; \
	done; exit $$status

sanitize-asan: build/asan/orderbook build/asan/tests/test_orderbook
	@set -e; echo "== ASan+UBSan: build/asan/tests/test_orderbook"; \
	$(SAN_ENV) build/asan/tests/test_orderbook > build/asan/test_orderbook.log 2>&1 || \
	    { tail -30 build/asan/test_orderbook.log; exit 1; }; echo "   clean"; \
	echo "== ASan+UBSan: build/asan/orderbook gen + replay"; \
	$(SAN_ENV) build/asan/orderbook gen --messages 300000 --seed 5 > build/asan/orders.txt; \
	$(SAN_ENV) build/asan/orderbook gen --messages 100000 --seed 6 --depth 400 > build/asan/orders-deep.txt; \
	for args in "build/asan/orders.txt" "build/asan/orders.txt --threads 2" \
	            "build/asan/orders.txt --pipeline" "build/asan/orders-deep.txt --trades build/asan/trades.txt"; do \
	    echo "   replay $$args"; \
	    $(SAN_ENV) build/asan/orderbook replay $$args > build/asan/replay.log 2>&1 || \
	        { tail -30 build/asan/replay.log; exit 1; }; \
	done; echo "   clean"

sanitize:
	@start=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory sanitize-tsan || status=1; \
	$(MAKE) --no-print-directory sanitize-ubsan || status=1; \
	$(MAKE) --no-print-directory sanitize-asan || status=1; \
	echo "== make sanitize: $$(( $$(date +%s) - start )) s, $$( [ $$status -eq 0 ] && echo clean || echo FAILED)"; \
	exit $$status

.PHONY: sanitize sanitize-tsan sanitize-ubsan sanitize-asan

# ---- soak ------------------------------------------------------------------------------------
#   make soak SOAK_SECONDS=300   4 threads mixing sizes for minutes; RSS once a second must
#                                stay flat (build/tests/test_release --soak); not in `make test`
SOAK_SECONDS ?= 300
soak: build/tests/test_release
	build/tests/test_release --soak $(SOAK_SECONDS)

.PHONY: soak
