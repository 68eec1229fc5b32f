# bench/orderbook/orderbook.mk - the order-book driver (included by the top Makefile).
#
#   build/orderbook              the CLI (gen, replay); runs under any allocator via LD_PRELOAD,
#                                so it is not linked with libcmalloc (the pool API is found
#                                with dlsym at run time)
#   build/tests/test_orderbook   cmocka tests of the engine, linked with the engine objects only
#
# Objects go to build/orderbook-obj/ (build/orderbook itself is the binary).

OB_DIR    := bench/orderbook
OB_OBJDIR := build/orderbook-obj
OB_LIB_SRCS := $(OB_DIR)/book.c $(OB_DIR)/parse.c $(OB_DIR)/gen.c $(OB_DIR)/latency.c \
               $(OB_DIR)/replay.c
OB_LIB_OBJS := $(patsubst $(OB_DIR)/%.c,$(OB_OBJDIR)/%.o,$(OB_LIB_SRCS))
OB_CFLAGS := -std=gnu11 -pthread -Iinclude -I$(OB_DIR) -Ibench
OB_LIBS   := -pthread -ldl

$(OB_OBJDIR):
	mkdir -p $@

$(OB_OBJDIR)/%.o: $(OB_DIR)/%.c $(OB_DIR)/book.h include/cmalloc.h bench/bench_util.h | $(OB_OBJDIR)
	$(CC) $(CFLAGS) $(WARN) $(OB_CFLAGS) -c $< -o $@

build/orderbook: $(OB_LIB_OBJS) $(OB_OBJDIR)/main.o
	$(CC) $(CFLAGS) -o $@ $^ $(OB_LIBS)

build/tests/test_orderbook: tests/test_orderbook.c $(OB_LIB_OBJS) $(OB_DIR)/book.h | build/tests
	$(CC) $(TEST_CFLAGS) $(WARN) -I$(OB_DIR) $< -o $@ $(OB_LIB_OBJS) -lcmocka $(OB_LIBS)

BENCH_BINS += build/orderbook
