# cmalloc - a plain Makefile. Targets: all test bench install clean.
#
#   make                  build/libcmalloc.so, build/libcmalloc.a
#   make test             build and run every test (cmocka binaries, then shell tests)
#   make bench            the quick benchmark matrix (see scripts/bench-matrix.sh)
#   make install PREFIX=/usr/local
#
# Workload- and tool-specific rules live in *.mk fragments next to their sources (included
# before the test rule); each appends to TEST_BINS / BENCH_BINS.

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
LIBFLAGS := -std=gnu11 -fPIC -fvisibility=hidden -ftls-model=initial-exec \
            -fno-builtin-malloc -fno-builtin-free -fno-builtin-calloc -fno-builtin-realloc \
            -fexceptions -pthread -Iinclude -Isrc
PREFIX  ?= /usr/local
VERSION := 0.1.0
SONAME  := libcmalloc.so.0

# Layer order: platform, metadata, back end, middle end, front end, entry points.
SRCS := src/os.c src/options.c src/metadata.c src/size_class.c src/pagemap.c src/page_heap.c \
        src/central_cache.c src/thread_cache.c src/alloc.c src/check.c src/stats.c src/stats_json.c src/pool.c src/init.c \
        src/override.c
OBJS := $(patsubst src/%.c,build/obj/%.o,$(SRCS))

LIB_SO := build/libcmalloc.so
LIB_A  := build/libcmalloc.a

# Every tests/test_*.c is a cmocka binary linked with the static library (so cmalloc serves it);
# every tests/test_*.sh is run with sh from the top directory after them.
TEST_BINS    := $(patsubst tests/%.c,build/tests/%,$(wildcard tests/test_*.c))
TEST_SCRIPTS := $(sort $(wildcard tests/test_*.sh))
BENCH_BINS   :=
# -fno-builtin: the compiler must not elide or merge the malloc/free calls the tests exist to make.
TEST_CFLAGS  := -std=gnu11 -O1 -g -Wall -Wextra -pthread -fno-builtin -Iinclude -Isrc

all: $(LIB_SO) $(LIB_A)

build/obj/%.o: src/%.c src/internal.h src/types.h include/cmalloc.h | build/obj
	$(CC) $(CFLAGS) $(WARN) $(LIBFLAGS) -c $< -o $@

$(LIB_SO): $(OBJS)
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,-z,now -pthread -o $@ $(OBJS)
	ln -sf libcmalloc.so build/$(SONAME)

$(LIB_A): $(OBJS)
	rm -f $@
	ar rcs $@ $(OBJS)

build/obj build/tests:
	mkdir -p $@

build/tests/%: tests/%.c $(LIB_A) | build/tests
	$(CC) $(TEST_CFLAGS) $< -o $@ $(LIB_A) -lcmocka -lpthread

# The fragments come before `test`, whose prerequisites are expanded when it is read: the
# binaries they add to TEST_BINS / BENCH_BINS must be known by then.
.DEFAULT_GOAL := all
include $(wildcard bench/*.mk bench/*/*.mk tests/*.mk)

test: all $(TEST_BINS) $(BENCH_BINS)
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; $$t; done; \
	for s in $(TEST_SCRIPTS); do echo "== $$s"; sh $$s; done; echo "== all tests passed"

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/libcmalloc.so.$(VERSION)
	ln -sf libcmalloc.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libcmalloc.so
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/libcmalloc.a
	install -m 644 include/cmalloc.h $(DESTDIR)$(PREFIX)/include/cmalloc.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' cmalloc.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/cmalloc.pc

clean:
	rm -rf build

.PHONY: all test bench install clean
