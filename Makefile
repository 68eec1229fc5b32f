# cmalloc - a plain Makefile. Targets: all test debug-test bench install uninstall
# deb examples deps clean.
#
#   make                  build/libcmalloc.so, build/libcmalloc.a
#   make test             build and run every test (cmocka binaries, then shell tests)
#   make debug-test       the same suite against a -DCM_DEBUG build (asserts, heap walks)
#   make bench            the quick benchmark matrix (see scripts/bench-matrix.sh)
#   make install PREFIX=/usr/local DESTDIR=   library (with soname links), static library,
#                         headers, the cmalloc launcher, cmalloc.pc, then ldconfig (or what to
#                         run); `make uninstall` (same PREFIX and DESTDIR) removes exactly those
#                         files and the directories install created, when empty
#   make deb              build/cmalloc_<version>_<arch>.deb (dpkg-deb)
#   make examples         the programs README's examples run, in build/examples/
#   make deps             the Debian packages building and testing need (scripts/deps.sh)
#
# `make test` and `make bench` first run scripts/deps.sh (a no-op once the packages are there;
# --bench for bench), so either works as the first command on a fresh Debian machine.
# Workload- and tool-specific rules live in *.mk fragments next to their sources (included
# before the test rule); each appends to TEST_BINS / BENCH_BINS.

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
LIBFLAGS := -std=gnu11 -fPIC -fvisibility=hidden -ftls-model=initial-exec \
            -fno-builtin-malloc -fno-builtin-free -fno-builtin-calloc -fno-builtin-realloc \
            -fexceptions -pthread -Iinclude -Isrc
PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
LIBDIR  ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
VERSION := 0.1.0
SONAME  := libcmalloc.so.0

# The packages a goal needs are installed while this file is read, before any rule runs (so
# before any compiler, whatever -j), and only for the goals that need them. DEPS="... --dry-run"
# shows what would be installed (tests/test_deps.sh).
DEPS     ?= ./scripts/deps.sh
DEPS_FOR := $(filter test bench,$(MAKECMDGOALS))
ifneq ($(DEPS_FOR),)
ifneq ($(shell $(DEPS) $(if $(filter bench,$(DEPS_FOR)),--bench) >&2 && echo ok),ok)
$(error scripts/deps.sh failed: install the packages it names, then run make again)
endif
endif

# Layer order: platform, metadata, back end, middle end, front end, entry points.
SRCS := src/os.c src/error.c src/options.c src/size_class.c src/metadata.c src/pagemap.c \
        src/page_heap.c src/central_cache.c src/remote.c src/thread_cache.c src/alloc.c \
        src/check.c src/guard.c src/prof.c src/api.c src/stats.c src/stats_json.c src/stats_exit.c \
        src/background.c src/init.c src/compound.c src/pool.c src/arena.c src/override.c \
        src/operator_new.c
# new_handler.cc: C++ only for what C cannot do (catch a new-handler's exception); the C++
# runtime symbols it names are made weak so C programs need no libstdc++.
CXX_SRCS := src/new_handler.cc
OBJS := $(patsubst src/%.c,build/obj/%.o,$(SRCS)) $(patsubst src/%.cc,build/obj/%.o,$(CXX_SRCS))
# The static archive's copies of the C++ pieces (operator new/delete, the new-handler call) name
# libstdc++'s functions strongly: a weak name pulls no member out of libstdc++.a, and a program
# linked with -static or -static-libstdc++ that used nothing else of the thrower's member had
# no std::bad_alloc to throw. Only a C++ program takes them out of the archive.
CXX_PIECES   := build/obj/operator_new.o build/obj/new_handler.o
STATIC_PIECES := build/obj/operator_new_static.o build/obj/new_handler_static.o
LIB_A_OBJS   := $(filter-out $(CXX_PIECES),$(OBJS)) $(STATIC_PIECES)

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

# Every object is rebuilt when a header of the library changes.
LIB_HEADERS := $(wildcard src/*.h) include/cmalloc.h
build/obj/%.o: src/%.c $(LIB_HEADERS) | build/obj
	$(CC) $(CFLAGS) $(WARN) $(LIBFLAGS) -c $< -o $@

CXX ?= g++
CXX_LIB_COMPILE = $(CXX) $(CFLAGS) -Wall -Wextra -std=c++17 -fPIC -fvisibility=hidden -fno-rtti
build/obj/%.o: src/%.cc | build/obj
	$(CXX_LIB_COMPILE) -c $< -o $@
	objcopy --weaken-symbol=__gxx_personality_v0 --weaken-symbol=__cxa_begin_catch \
	        --weaken-symbol=__cxa_end_catch --weaken-symbol=_Unwind_Resume $@
build/obj/new_handler_static.o: src/new_handler.cc | build/obj
	$(CXX_LIB_COMPILE) -c $< -o $@
build/obj/operator_new_static.o: src/operator_new.c $(LIB_HEADERS) | build/obj
	$(CC) $(CFLAGS) $(WARN) $(LIBFLAGS) -DCM_CXX_RUNTIME_LINKED -c $< -o $@

$(LIB_SO): $(OBJS)
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,-z,now -pthread -o $@ $(OBJS)
	ln -sf libcmalloc.so build/$(SONAME)

$(LIB_A): $(LIB_A_OBJS)
	rm -f $@
	ar rcs $@ $(LIB_A_OBJS)

build/obj build/tests:
	mkdir -p $@

# Every test is rebuilt when a shared header (tests/helpers.h, watchdog.h, pool_churn.h, rng.h)
# changes.
TEST_HEADERS := $(wildcard tests/*.h)
build/tests/%: tests/%.c $(TEST_HEADERS) $(LIB_A) | build/tests
	$(CC) $(TEST_CFLAGS) $< -o $@ $(LIB_A) -lcmocka -lpthread

# C++ tests (tests/test_*.cc): the header-only front ends compiled as strictly as users would.
CXX ?= c++
CXX_TEST_FLAGS := -std=c++17 -O1 -g -Wall -Wextra -Werror -pthread -Iinclude
TEST_BINS += $(patsubst tests/%.cc,build/tests/%,$(wildcard tests/test_*.cc))

build/tests/%: tests/%.cc include/cmalloc.hpp $(LIB_A) | build/tests
	$(CXX) $(CXX_TEST_FLAGS) $< -o $@ $(LIB_A) -lcmocka -lpthread

# The fragments come before `test`, whose prerequisites are expanded when it is read: the
# binaries they add to TEST_BINS / BENCH_BINS must be known by then.
.DEFAULT_GOAL := all
include $(wildcard bench/*.mk bench/*/*.mk tests/*.mk)

# The C++ tests under the UBSan build of the library too (make sanitize-ubsan).
build/ubsan/tests/%: tests/%.cc include/cmalloc.hpp build/ubsan/libcmalloc.a | build/ubsan/tests
	$(CXX) $(CXX_TEST_FLAGS) -c $< -o $@.o
	$(CXX) $(UBSAN_FLAGS) -pthread $@.o -o $@ build/ubsan/libcmalloc.a -lcmocka -lpthread
UBSAN_CXX_TESTS := $(patsubst tests/%.cc,build/ubsan/tests/%,$(wildcard tests/test_*.cc))
UBSAN_TESTS += $(UBSAN_CXX_TESTS)
sanitize-ubsan: $(UBSAN_CXX_TESTS)

# THREAD_SAFE pools under ThreadSanitizer (the allocator's TSan build, as sanitize-tsan), run by
# make sanitize too.
build/tsan/stress_pool_tsan: tests/stress_pool_tsan.c $(TSAN_OBJS)
	$(SAN_CC) -O1 -g -std=gnu11 -Wall -Wextra -pthread -Iinclude -fsanitize=thread $< $(TSAN_OBJS) -o $@

sanitize-tsan-pool: build/tsan/stress_pool_tsan
	@echo "== TSan: build/tsan/stress_pool_tsan (log: build/tsan/stress_pool.log)"; \
	$(TSAN_RUN) build/tsan/stress_pool_tsan > build/tsan/stress_pool.log 2>&1; rc=$$?; \
	grep -E "^stress_pool_tsan|^SUMMARY" build/tsan/stress_pool.log; \
	if [ $$rc -ne 0 ]; then echo "   FAILED (exit status $$rc)"; exit 1; fi; echo "   clean"

sanitize: sanitize-tsan-pool
.PHONY: sanitize-tsan-pool

test: all $(TEST_BINS) $(BENCH_BINS)
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; $$t; done; \
	for s in $(TEST_SCRIPTS); do echo "== $$s"; sh $$s; done; echo "== all tests passed"

# Every installed file, so that uninstall removes exactly what install wrote. The C++ header
# is installed when the tree has one. Install also lists, in $(MANIFEST), the directories it
# had to create, so that uninstall removes those (when empty) and no directory that was there
# before (Debian ships /usr/local/include empty). Without DESTDIR, install ends with
# scripts/install-finish.sh: ldconfig for a directory the loader searches (or the command to
# run when not root), else the -Wl,-rpath flag a program needs.
HEADERS   := include/cmalloc.h $(wildcard include/cmalloc.hpp)
DATADIR   ?= $(PREFIX)/share
MANIFEST  := $(DATADIR)/cmalloc/created-directories
INSTALLED := $(BINDIR)/cmalloc $(LIBDIR)/libcmalloc.so.$(VERSION) $(LIBDIR)/$(SONAME) \
             $(LIBDIR)/libcmalloc.so $(LIBDIR)/libcmalloc.a $(PKGCONFIGDIR)/cmalloc.pc \
             $(addprefix $(INCLUDEDIR)/,$(notdir $(HEADERS)))
INSTALL_DIRS := $(BINDIR) $(LIBDIR) $(INCLUDEDIR) $(PKGCONFIGDIR) $(DATADIR)/cmalloc
INSTALL_FINISH ?= $(if $(DESTDIR),,scripts/install-finish.sh $(LIBDIR))

install: all
	@created=""; for d in $(addprefix $(DESTDIR),$(INSTALL_DIRS)); do \
	    while [ ! -d "$$d" ] && [ "$$d" != "$(DESTDIR)" ]; do created="$$d $$created"; d=$$(dirname "$$d"); done; \
	done; install -d $(addprefix $(DESTDIR),$(INSTALL_DIRS)); \
	{ cat $(DESTDIR)$(MANIFEST) 2> /dev/null; for d in $$created; do echo "$${d#$(DESTDIR)}"; done; } | \
	    sort -u -r > $(DESTDIR)$(MANIFEST).new && mv $(DESTDIR)$(MANIFEST).new $(DESTDIR)$(MANIFEST)
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/libcmalloc.so.$(VERSION)
	ln -sf libcmalloc.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libcmalloc.so
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/libcmalloc.a
	install -m 644 $(HEADERS) $(DESTDIR)$(INCLUDEDIR)/
	sed -e 's|^installed_libdir=.*|installed_libdir=$(LIBDIR)|' scripts/cmalloc > $(DESTDIR)$(BINDIR)/cmalloc
	chmod 755 $(DESTDIR)$(BINDIR)/cmalloc
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@VERSION@|$(VERSION)|' \
	    cmalloc.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/cmalloc.pc
	@$(INSTALL_FINISH)

# The manifest's directories, deepest first, each removed only when empty.
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	@if [ -f $(DESTDIR)$(MANIFEST) ]; then \
	    dirs=$$(cat $(DESTDIR)$(MANIFEST)); rm -f $(DESTDIR)$(MANIFEST); \
	    for d in $$dirs; do rmdir "$(DESTDIR)$$d" 2> /dev/null || true; done; \
	fi

# make deb: build/cmalloc_$(VERSION)_<arch>.deb with dpkg-deb (no network): the library with
# its soname links, the static library, headers, launcher and cmalloc.pc under /usr; the
# loader's cache is updated by dpkg's ldconfig trigger on install and removal. The package's
# files are staged by `make install` itself, so the two never differ.
DEB_ARCH := $(shell dpkg --print-architecture 2> /dev/null)
DEB      := build/cmalloc_$(VERSION)_$(DEB_ARCH).deb
DEB_ROOT := build/deb/root
deb: all
	rm -rf build/deb
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(DEB_ROOT) PREFIX=/usr INSTALL_FINISH=
	rm -rf $(DEB_ROOT)/usr/share/cmalloc && rmdir --ignore-fail-on-non-empty $(DEB_ROOT)/usr/share
	mkdir -p $(DEB_ROOT)/DEBIAN
	printf '%s\n' 'Package: cmalloc' 'Version: $(VERSION)' 'Architecture: $(DEB_ARCH)' \
	    'Maintainer: cmalloc developers <cmalloc@localhost>' 'Section: libs' 'Priority: optional' \
	    'Depends: libc6' "Installed-Size: $$(du -sk $(DEB_ROOT)/usr | cut -f1)" \
	    'Description: cmalloc, a fast general-purpose malloc replacement' \
	    ' Thread caches, central caches and a page heap, preloaded (the cmalloc launcher)' \
	    ' or linked with -lcmalloc.' > $(DEB_ROOT)/DEBIAN/control
	echo 'activate-noawait ldconfig' > $(DEB_ROOT)/DEBIAN/triggers
	dpkg-deb --root-owner-group --build $(DEB_ROOT) $(DEB)

# make examples: the programs README's examples run, in build/examples/. prof_program
# (tests/data/prof_program.c) is linked with -rdynamic so that the profiler's and the guard's
# reports name its functions, and finds the library through its rpath.
EXAMPLES := build/examples/prof_program
examples: $(EXAMPLES)
build/examples:
	mkdir -p $@
build/examples/prof_program: tests/data/prof_program.c $(LIB_SO) | build/examples
	$(CC) -O1 -g -rdynamic -Iinclude $< -o $@ -Lbuild -lcmalloc -Wl,-rpath,'$$ORIGIN/..' -pthread

deps:
	$(DEPS)

# The whole suite against a debug build (-DCM_DEBUG: CM_ASSERT on, heap walks on slow paths;
# same -O2 code otherwise, so the fast-path budget holds), in a copy of the tree under
# build/debug so that the release build here is left alone.
DEBUG_TREE := Makefile README.md CHANGELOG.md cmalloc.pc.in src include tests bench scripts docs .ci
debug-test:
	rm -rf build/debug && mkdir -p build/debug
	cp -r $(wildcard $(DEBUG_TREE)) build/debug/
	$(MAKE) -C build/debug test CFLAGS="-O2 -g -DCM_DEBUG"

clean:
	rm -rf build

.PHONY: all test bench install uninstall deps clean debug-test deb examples
