/* policy.h - every tuning number of cmalloc, named, with why it has its value. The code uses
 * these names and nothing inline; the option table's defaults are the CM_DEFAULT_* below.
 * Changing one is a measurement: rerun the matrix (scripts/bench-matrix.sh, allocators
 * interleaved) and the memory tests (tests/test_release.c) before and after, in one run.
 * (Structural sizes that are not tuning, such as the page size and the number of size
 * classes, are in types.h.)
 */
#ifndef CM_POLICY_H
#define CM_POLICY_H

#include <stddef.h>

/* ---- options' defaults (src/options.c; README's option table) ------------------------------ */
/* glibc's default mmap threshold: blocks above it churned in a loop are the costly case, and
 * frees raise the threshold up to the maximum, as glibc's do. */
#define CM_DEFAULT_MMAP_THRESHOLD     ((size_t)1 << 20)
#define CM_DEFAULT_MMAP_THRESHOLD_MAX ((size_t)32 << 20)
/* A thread's cache and all of them together: large enough that a busy thread rarely meets
 * the central cache, small enough that 30 threads' caches fit in the total. */
#define CM_DEFAULT_THREAD_CACHE_MAX   ((size_t)2 << 20)
#define CM_DEFAULT_THREAD_CACHE_TOTAL ((size_t)64 << 20)
/* Free pages idle this long go back to the OS: long enough that a block churned in a loop is
 * not released and faulted in again each time (3x glibc's kernel time when it is). */
#define CM_DEFAULT_RELEASE_DELAY_MS   1000
#define CM_DEFAULT_PROF_RATE          ((size_t)512 << 10) /* bytes between samples, as tcmalloc */

/* ---- size classes (src/size_class.c) ------------------------------------------------------- */
/* From this size the classes step by a quarter of a doubling instead of an eighth (size_class.c):
 * from here to CM_SPAN_ONE_OBJECT_SIZE a span holds as few as CM_SPAN_OBJECTS_MIN objects, so a
 * class a program uses a little pins a span that is mostly empty, and half the classes pin half
 * those spans. mstress_bench (1% of blocks 1-64 KiB) 0.83-0.88x the peak RSS at 1-4 lanes at
 * 1.00-1.04x the speed; the whole matrix 0.984x the peak RSS, the speed of 54 cells 0.92-1.27x
 * (alloc-crossthread at 2 threads, bimodal, 5.0x), peak RSS x jemalloc 0.822 against 0.835
 * (`scripts/bench-matrix.sh --allocators cmalloc,jemalloc --extra coarse=<build> --reps 5`, then
 * `scripts/vs-best-peer.py <out>/matrix.csv --mine cmalloc,coarse`). From 128 B instead,
 * mstress and the rpmalloc-style row ran 1.04-1.10x but the mixed window at one thread
 * 0.92-0.97x and the server pattern 0.84-0.95x (the median ratios of four runs of
 * `scripts/bench-ab.sh --reps 7` or `--reps 9` with the rows server1, mixed1, mstress1, rpm2). */
#define CM_CLASS_COARSE_FROM     ((size_t)8 << 10)
/* A span holds at least this many objects (within CM_MAX_SMALL; one from CM_SPAN_ONE_OBJECT_SIZE
 * up), and its tail wastes at most
 * 1/CM_SPAN_WASTE_DIVISOR of it. 4 rather than 8: a program that uses many large classes a
 * little (mstress_bench: 1% of blocks 1-64 KiB) holds a partly used span in each, and with 8
 * objects those spans made up much of its memory: peak RSS 0.79-0.88x at 1-4 threads with the
 * same speed everywhere (scripts/bench-matrix.sh --threads 1,2,4 --reps 3 --seconds 0.4
 * --extra now=<8> --extra so4=<4> --allocators now,so4 --workloads mstress,larson,server,
 * alloc-window-mixed,alloc-window-powerlaw,python,sqlite,xmalloc,churn). */
#define CM_SPAN_OBJECTS_MIN      4
#define CM_SPAN_WASTE_DIVISOR    8
/* Classes from this size get spans of one object: a span of several pins the pages of every
 * object in it that was ever used while one is, and a thread cache holding one object of each
 * of a dozen such classes pinned a dozen spans of 100-425 KiB (CPython's peak RSS 36.6 -> 35.5
 * MB, `/usr/bin/time -f %M env LD_PRELOAD=<build> /usr/bin/python3 bench/real_python.py`; 64 KiB
 * malloc/free loops at 1-2 threads unchanged: commit adbfd39 has the commands). */
#define CM_SPAN_ONE_OBJECT_SIZE  ((size_t)32 << 10)
/* Classes up to CM_SPAN_TIGHT_SIZE take up to CM_SPAN_TIGHT_PAGES pages for a tail of at most
 * 1/CM_SPAN_TIGHT_DIVISOR: a page holds few of them, so one page can waste 6-12%. With the
 * 1040-byte class (size_class.c), sqlite3's peak RSS 31.0 -> 29.9 MB (`/usr/bin/time -f %M
 * sqlite3 :memory: < bench/real_sqlite.sql`, LD_PRELOAD, builds interleaved); the class alone,
 * seven to a page like the 1152 class, changed nothing. */
#define CM_SPAN_TIGHT_SIZE       2048
#define CM_SPAN_TIGHT_DIVISOR    32
#define CM_SPAN_TIGHT_PAGES      4
/* A batch (objects per fill or flush between a thread and the central cache) is about this
 * many bytes, clamped to [CM_BATCH_MIN, CM_BATCH_MAX] objects. Larger batches (64 objects)
 * were measured: producer/consumer 1.2-1.5x faster, larson, mstress and server 0.6-0.8x
 * (scripts/bench-matrix.sh --reps 3 --seconds 0.4 --threads 1,2,4 --extra b64=<a build with
 * CM_BATCH_MAX 64> --allocators cmalloc,b64 --workloads xmalloc,larson,mstress,server). */
#define CM_BATCH_BYTES           ((size_t)64 << 10)
#define CM_BATCH_MIN             2
#define CM_BATCH_MAX             32
/* A class's transfer cache holds about CM_TRANSFER_BYTES of whole batches, clamped to
 * [CM_TRANSFER_MIN, CM_TRANSFER_BASE_SLOTS] batches; idle ones are drained by age. While other
 * threads take the batches a thread flushes (producer/consumer), the limit doubles on each
 * overflow up to about CM_TRANSFER_SHARED_BYTES (at most CM_TRANSFER_SLOTS batches), and it
 * halves back at each decay tick without such takes. Measured: a fixed 2 MiB made xmalloc
 * 1.21-1.35x faster at 1-4 threads (scripts/bench-matrix.sh --threads 1,2,4 --reps 3 --seconds
 * 0.4 --workloads server,larson,xmalloc,mstress, builds interleaved), but single-threaded
 * /usr/bin/python3 bench/real_python.py then ended holding 7.5 MB in central caches instead of
 * 4.0 MB (CMALLOC_STATS=1): its bursts of frees stayed there instead of emptying spans.
 * The start itself was 512 KiB until 128 KiB measured the same speed (geometric mean 0.999 over
 * server, larson, mstress, xmalloc, window-mixed, crossthread, churn, orderbook, python, sqlite
 * at 1, 2 and 4 threads) and python3's peak RSS 0.90x: every class it had freed in bulk held a
 * transfer cache of memory no other class could use (scripts/bench-matrix.sh --threads 1,2,4
 * --reps 3 --seconds 0.4 --extra t512=<512 KiB build> --extra t128=<this> ...). 64 KiB made
 * server_bench at one thread 0.84x. */
#define CM_TRANSFER_BYTES        ((size_t)128 << 10)
#define CM_TRANSFER_MIN          2
#define CM_TRANSFER_BASE_SLOTS   64
#define CM_TRANSFER_SHARED_BYTES ((size_t)2 << 20)
#define CM_TRANSFER_SLOTS        1024

/* ---- thread caches (src/thread_cache.c) ---------------------------------------------------- */
/* A new thread's budget: a thread that allocates a little holds little (slow start). */
#define CM_THREAD_START_BUDGET ((size_t)64 << 10)
/* The longest a list may grow: this many bytes of its class, and never more objects than
 * CM_LIST_OBJECTS_MAX (a longer list only costs memory). */
#define CM_LIST_BYTES_MAX      ((size_t)256 << 10)
#define CM_LIST_OBJECTS_MAX    8192
/* What a cache's lists may hold (the sum of max_length * class size) is kept within this many
 * budgets: the fast paths count no bytes, so this bounds what frees can push between two slow
 * paths. A cache that allocates many classes grows each list's max_length by a batch per miss;
 * held to one budget, server_bench (1 thread) ran at 0.65-0.9x of the build that counted bytes
 * on the fast paths, its lists halved over and over while holding little; at 4 it ran at
 * 1.02-1.17x (build/bench/server_bench --slots 16384 --max-size 8192 --threads 1, builds
 * interleaved). */
#define CM_CAPACITY_PER_BUDGET 4
/* Registry entries the orphan sweep looks at per cache created: more than the one orphan a
 * new thread can add, so orphans drain; but only once CM_SWEEP_LIVE_MIN caches are
 * registered, so fewer orphans than that may wait (until stats are read, which sweeps them
 * all). Each entry looked at is a system call: with 2 and 3 live caches (a thread started at
 * a time) a thread's start made two for nothing (`strace -f -c env LD_PRELOAD=<build>
 * build/bench/churn_bench --objects 256 --max-size 4096 --threads 1 --seconds 0.5`: 2 tgkill a
 * thread before, none since). */
#define CM_SWEEP_PER_CREATE    2
#define CM_SWEEP_LIVE_MIN      8

/* ---- page heap and release (src/page_heap.c, src/central_cache.c, src/background.c) -------- */
/* The heap grows from the OS in chunks of at least this: few mappings, and the kernel can back
 * them with huge pages. */
#define CM_HEAP_GROW_MIN        ((size_t)2 << 20)
/* Release by age is checked at most twice per delay, and never more often than this: the
 * release floor of the central caches' decay and of the release thread's sleep. */
#define CM_RELEASE_CHECK_MIN_MS 10

/* ---- realloc (src/alloc.c) ------------------------------------------------------------------ */
/* A block realloc moves to at least this many bytes gets whole pages (a LARGE span) rather than
 * a size class, and later reallocs grow it where it lies while the pages after it are free, as
 * glibc grows a chunk into the top of its heap. In a size class, a buffer grown by an eighth at a
 * time (CPython's bytearrays and lists) is copied into the next class at each step: in
 * bench/real_python.py 195 of 200 reallocs to 32-256 KiB moved, copying 19 MB, now 23 (glibc
 * 6; `LD_PRELOAD="build/bench/realloc_moves.so <build>" /usr/bin/python3 bench/real_python.py`).
 * At these sizes whole pages also waste less than the classes' spacing. (The heap is not grown
 * for the free pages after such a block: tried, it touched more memory, peak RSS 36.4 -> 38.2
 * MB, `/usr/bin/time -f %M`.) */
#define CM_REALLOC_PAGES_MIN ((size_t)32 << 10)

/* ---- debug mode (src/check.c) -------------------------------------------------------------- */
/* Freed blocks wait this long (in objects and bytes, whichever is reached first) before
 * reuse, so a use after free is caught while the block is still quarantined. */
#define CM_QUARANTINE_OBJECTS 4096
#define CM_QUARANTINE_BYTES   ((size_t)16 << 20)

/* ---- guarded allocations (src/guard.c) ------------------------------------------------------ */
#define CM_GUARD_SLOTS_MAX 65536 /* CMALLOC_GUARD_SLOTS takes no more: 512 MiB of reservation */

/* A fill that asks for at least a 1/CM_PREFETCH_DIVISOR of a span's objects, from a span that
 * has as many given back, first fetches the lines of the span's first CM_PREFETCH_LINES
 * objects' links (internal.h's cm_span_prefetch_objects). */
#define CM_PREFETCH_DIVISOR 4
#define CM_PREFETCH_LINES   256

/* ---- remote frees (remote.c) ---------------------------------------------------------------
 * Slots for thread caches' mailboxes (the pagemap's owner field is 16 bits; threads beyond
 * them free the central way). A run a list gives back is split among at most this many owners
 * (objects of further owners in the same run go the central way); a mailbox whose owner has
 * not taken it refuses posts above its bound, so that an owner that stops allocating holds at
 * most that much of what others freed. */
#define CM_REMOTE_SLOTS         1024
#define CM_REMOTE_DESTINATIONS  4
/* Caches of exited threads kept with their lists for the next threads to start with
 * (thread_cache.c, "stocked caches"), each trimmed to at most CM_STOCKED_BYTES; a stocked
 * cache gives its lists back after a release delay unused. What they hold is memory no other
 * thread reuses meanwhile: `scripts/bench-ab.sh --reps 7 --rows churn1,churn2,churn4,churn8,
 * larson8`, against no stock, threads/s and peak RSS: 4 of 128 KiB +12%, +12%, +4%, +6% with
 * +3%, +9%, +9%, +23% peak RSS; 8 of 256 KiB +20%, +24%, -3%, +9% with up to +51%; 8 of 64 KiB
 * within the spread of no stock (a churning thread of that row ends with 100-250 KiB listed). */
#define CM_STOCKED_CACHES 4
#define CM_STOCKED_BYTES  ((size_t)128 << 10)
/* ...and its lists' max_lengths halved until they add up to at most this (thread_cache.c's
 * trim_for_stock): halved once only, larson's peak RSS at 2-8 threads rose 1.10-1.12x, so
 * the next thread's lists may grow back to twice what the stock keeps before they slow-start
 * (`scripts/bench-ab.sh --reps 11 --rows mstress1,mstress2,mstress4,mstress8,larson2,larson8
 * base=<lib> once=<lib> capped=<lib>`: larson at 2 and 8 threads 11.4 and 41.5 MiB halved
 * once, 10.7 and 38.2 capped, 10.4 and 37.7 halving until the bytes fitted). */
#define CM_STOCKED_CAPACITY (2 * CM_STOCKED_BYTES)
/* Slots of exited caches kept, with the spans they own, for the next caches to start (a thread
 * that replaces one that exited takes over its pages, as larson's and mstress's do); each is
 * shared out after a release delay unused. */
#define CM_PARKED_SLOTS         64
/* The newest batches of a transfer cache a fill looks through for one no other
 * live owner's spans hold (central_cache.c's batch_for). */
#define CM_TRANSFER_OWN_SCAN 8
/* Before it carves a fresh span, a fill borrows a span with room from another owner
 * (central_cache.c's borrow_from_another): the one with the most room of the first
 * CM_BORROW_SCAN behind the head of its list; a live owner keeps its head and CM_LENDER_KEEPS
 * more. Peak RSS (`scripts/bench-ab.sh --reps 5 --seconds 0.3 --rows larson2,larson8,rpm8`):
 * larson at 8 threads 33.6 against 39.2 MiB, the rpmalloc-style row 64.9 against 73.5, larson
 * at 2 threads 10.1 against 11.8 MiB at the same speed. Lending with none kept cost larson at 2
 * threads 4-9% (its lanes' blocks shared pages again). */
#define CM_BORROW_SCAN  8
#define CM_LENDER_KEEPS 2
/* Allocation misses a new cache fills without a slot while the one owning what it freed is
 * still on its way to being parked (its thread exiting). */
#define CM_SLOT_WAIT_MISSES 8
/* The fewest objects a fill asks for to take the spans it fills from as its own
 * (central_cache.c's cm_central_fill). A thread's first fills of a class are small (its list
 * grows by one object a miss), and a thread that uses a class for a few objects only would
 * otherwise hold a span of it to itself: churn_bench at 8 threads (256 blocks of 16-4096 B a
 * thread) had 8 live owners holding 4 MiB of spans with room for 1.2 MiB of objects out. Peak
 * RSS with 8 against none (`scripts/bench-matrix.sh --quick --seconds 0.3 --reps 5 --threads
 * 1,2,4,8 --workloads larson,mstress,churn,rpmalloc,server,orderbook,orderbook-pipeline,xmalloc,
 * alloc-crossthread` with both builds as --extra): churn at 4 and 8 threads 0.73x and 0.56x,
 * mstress 0.76x and 0.69x, the rpmalloc-style row at 8 0.88x, 0.95x over those 36 cells at the
 * same speed (1.03x); 4 and 6 gave 0.97x and 0.96x. */
#define CM_CLAIM_FILL 8
/* The most bytes a slot's mailboxes hold (remote.c; posts past it go to the central cache): what
 * an owner that stops allocating strands at most (snmalloc's and mimalloc's owners strand all of
 * it). At 2 MiB (and a word's count of 15 bits, 32,767 64-byte objects, the same bound) a producer
 * asleep on xmalloc_bench's full queue had its mailbox full while 2-8 consumers freed its objects,
 * and their posts went to the central cache under the class's lock, which the producer's fills
 * take too. With 8 MiB and an 18-bit count: xmalloc at 2, 4 and 8 pairs 1.08x, 1.57x and 1.56x at
 * the same or a lower peak RSS (4 MiB: 1.03x, 1.25x, 1.16x; 16 MiB: 1.06x, 1.52x, 1.85x), larson
 * and mstress at 8 threads 0.98-1.02x (`scripts/bench-ab.sh --reps 9 --rows
 * xmalloc2,xmalloc4,xmalloc8,larson8,mstress8 main=<lib> m4=<lib> m8=<lib> m16=<lib>`). 16 MiB (a
 * word's count holds 262,143 objects, 16 MiB of 64 bytes) since the spans a take hands back whole
 * stay with their owner (CM_SPARE_BYTES): a post past 8 MiB, refused, sent the next few lists of
 * its freeing thread to the central cache too, 2.4M and 6.1M objects in two 1.2 s runs at 8 pairs
 * (a counting build: `LD_PRELOAD=<lib> build/bench/xmalloc_bench --batch 4096 --size 64 --queue
 * 100 --threads 8 --seconds 1`); xmalloc at 8 pairs 1.19x [0.87 1.60] and 1.21x [1.08 1.60] with
 * the spares, at 0.65-0.70x the peak RSS, 4 pairs 1.04-1.07x, larson8, mstress8 and rpm8
 * 1.00-1.05x (`scripts/bench-ab.sh --reps 9 --rows
 * xmalloc2,xmalloc4,xmalloc8,larson8,mstress8,rpm8,xthr8` and `--reps 11 --rows
 * xmalloc4,xmalloc8`). */
#define CM_REMOTE_MAILBOX_BYTES ((size_t)16 << 20)
/* What one fill of a thread cache's list asks for, when a batch is less (thread_cache.c's
 * fill_most): 256 objects of 64 B. xmalloc_bench ran 45M objects/s with fills of 128 objects,
 * 48M with 256 and 512, against 31M with a batch of 32 (medians of 5 interleaved runs). */
#define CM_FILL_BYTES ((size_t)16 << 10)
/* What a thread cache's outbox of a class gathers for one owner before it is posted
 * (thread_cache.c, "outboxes"): 128 objects of 64 B, one compare-and-swap for them all; at
 * least one object. 16 and 32 KiB ran xmalloc at one pair 4-7% faster and within the spread
 * elsewhere, with up to 9% and 23% more peak RSS on alloc-crossthread at 4 threads
 * (`scripts/bench-ab.sh --reps 9 --rows xmalloc1,xmalloc2,xmalloc4,xthr2,xthr4,larson2`). */
#define CM_OUTBOX_BYTES ((size_t)8 << 10)
/* ... but at least this many objects in classes up to CM_OUTBOX_OBJECTS_SIZE: a post (its
 * compare-and-swap on the owner's word, the byte count, the last run's header, the stats)
 * costs about 300 instructions (`outbox_post`'s inclusive count over its calls: 296 before
 * this floor, 280 with it, in `valgrind --tool=callgrind env LD_PRELOAD=build/libcmalloc.so
 * build/tests/remote_cycle 120 4096 1024 mixed`, then `callgrind_annotate --tree=caller`),
 * which 8 KiB of 1 KiB objects shared 8 ways. The remote-free cycle of sizes 16-1039 B ran
 * 154 -> 144 instructions a block (tests/data/remote_cycle.c,
 * `sh tests/test_fastpath_budget.sh`; since the plain posts' 32, 142 with 16 and 136 with 32
 * objects, whose outboxes then hold 32 KiB), and `scripts/bench-ab.sh --reps 9 --rows
 * xthrpin1,xthr2,xthr4,rpm2,rpm8,mstress2,larson2,server2,obp2` moved within the spread
 * (0.95-1.09x, peak RSS within 0.2 MiB). */
#define CM_OUTBOX_OBJECTS      16
#define CM_OUTBOX_OBJECTS_SIZE ((size_t)1 << 10)
/* A full span that runs come back to is listed for fills again once this share of it is free
 * (central_cache.c's cm_central_take_runs): at a quarter, xmalloc_bench's fills took spans a
 * run or two had come back to, and chased their links (1 thread: 32.1M against 40.9M objects/s
 * at a half); larson and alloc-crossthread moved within their spread. */
#define CM_SPAN_WAKE_DIVISOR 2
/* A mailbox whose runs hold this many objects on average goes back to its spans; shorter runs
 * (frees in no order: larson, mstress) become the list as they are (thread_cache.c's
 * take_mailbox). Given back, they only had the fill walk them out of their spans again: larson
 * ran 35.5M against 40.2M ops/s at 2 threads, mstress 23.8M against 25.7M (medians of 5); 4,
 * 8 and 16 were alike but for alloc-crossthread (16.1M, 15.4M, 13.4M). */
#define CM_RUN_LONG 4
/* Long runs go back to their spans only in classes whose spans hold at least this many objects
 * (up to 128 B); in the others they become the list as they are, as short runs do. A span of
 * a few objects (4-28 from 256 B up) is whole again after a few frees and gone to the page
 * heap, and the fill that follows carves a fresh one: a page-heap round trip and a span-list
 * move for every few objects that came home, where the list costs nothing. alloc-crossthread
 * (sizes of 16 B-1 KiB) at 2 threads: 112.9 instructions a malloc+free pair against 144.4
 * (malloc 34.7 against 67.8; its slow paths had taken a span from the page heap at almost
 * every fill); malloc's count on larson, mstress and xmalloc within 1%, 4% lower on the
 * rpmalloc-style row (`valgrind --tool=callgrind --trace-children=yes env
 * LD_PRELOAD=<build> build/bench/alloc_bench --mode=crossthread --size-dist=mixed --size 1024
 * --threads 2 --seconds 1 --warmup 0`, malloc's and free's inclusive counts over their calls;
 * the same for the commands of larson2, mstress2, rpm2 and xmalloc2 in scripts/bench-ab.sh).
 * Wall clock against the build before (3dda3c1), `scripts/bench-ab.sh --reps 9 --rows
 * xthr2,xthr4,xthr8`: 1.29x, 1.26x and 1.10x at 2, 4 and 8 threads. `--reps 7 --rows
 * xthr4,xthr8,xmalloc4,xmalloc8,larson8,mstress8,rpm8`: 1.24x and 1.29x, the others within
 * their spread; a bound of 128 objects (up to 64 B) gave 0.89x and 1.66x there, 32 (up to
 * 256 B) 1.11x and 1.50x. */
#define CM_RUN_SPAN_OBJECTS 64
/* The bytes of whole spans a cache keeps a class beyond its fresh run, for the runs after it
 * (thread_cache.c's cm_spare_spans; at least one span). A producer's mailbox take brings back
 * as many spans as its consumers freed whole since its last one (xmalloc_bench's batch of
 * 4,096 64-byte blocks is 32 spans); with one spare the rest went to the page heap under the
 * class's lock and the producer's next fills cut them again: counted at 8 pairs, 361K spans
 * each way against 377K takes in 1.2 s (`LD_PRELOAD=<lib> build/bench/xmalloc_bench --batch
 * 4096 --size 64 --queue 100 --threads 8 --seconds 1`, a counting build). 256 KiB (32 spans
 * of 64 bytes): the remote-free cycle 119 -> 108 instructions a 64-byte block (`sh
 * tests/test_fastpath_budget.sh`, 117 with 64 KiB); `scripts/bench-ab.sh --reps 11 --rows
 * xmalloc1,xmalloc2,xmalloc4,xmalloc8` over the build with 16 MiB mailboxes alone, 0.89x [0.70
 * 1.56], 1.09x, 1.10x [0.95 1.16] and 1.13x (64 KiB: 1.02x, 1.03x, 1.07x, 1.00x). */
#define CM_SPARE_BYTES ((size_t)256 << 10)
/* Runs whose headers that judgement reads at most (remote.c's cm_remote_runs_long): larson at
 * 2 threads 62.7M against 57.7M ops/s with every header read, the other rows level
 * (`scripts/bench-ab.sh --reps 7 --seconds 0.3 --rows larson2,mstress2,xthr2,larson8`). */
#define CM_RUN_SAMPLE 16
/* Posts an outbox gathers as plain chains (no runs, no headers: remote.c, "plain posts")
 * after one whose runs were short, before it measures them again: a measuring post of frees in
 * no order cuts a run at nearly every block, each a slow path. 8 -> 32: the remote-free cycle
 * of 64-byte blocks freed in no order 150 -> 145 instructions a block (64: 144; `sh
 * tests/test_fastpath_budget.sh`), `scripts/bench-ab.sh --reps 9 --rows obp2,obp4,larson2,
 * larson8,mstress2,xshuf1,xmalloc1,xthr2,rpm2` 0.99-1.18x at the same peak RSS. */
#define CM_PLAIN_POSTS 32
/* How far ahead an inbox's pop prefetches (internal.h, "ahead links"): the object this many
 * further down a plain post, so a line another core holds has 8 allocations' time to come.
 * Also how many objects at the top of each post no pop prefetches (nothing above a post links
 * into it; a post of 64-byte objects holds 128). */
#define CM_POST_AHEAD 8
/* Lists of a class given back unsorted after one that was mostly the thread's own
 * (thread_cache.c's send_home): larson 44.3M against 40.1M ops/s at 2 threads, the
 * rpmalloc-style row 20.9M against 19.5M, alloc-crossthread 17.7M against 16.8M, the others
 * alike (medians of 5); 32 measured alike to 8. */
#define CM_UNSORTED_LISTS 8

/* ---- limits that follow glibc ---------------------------------------------------------------- */
#define CM_SYSTEM_PAGE          4096 /* the kernel's page: valloc, pvalloc, mapping slack */

#endif /* CM_POLICY_H */
