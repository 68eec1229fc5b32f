/* prof.c - the sampling heap profiler (CMALLOC_PROF and friends) and the sampling decision it
 * shares with guard.c (CMALLOC_GUARD_RATE). Everything here is off unless asked for.
 *
 * Where samples are taken. Each thread has two countdowns in bytes allocated (a small
 * allocation counts its class's size, a large one its request): to the next profile sample
 * point, drawn from an exponential distribution of mean CMALLOC_PROF_RATE (the points are a
 * Poisson process over the bytes allocated, so a periodic pattern cannot line up with them),
 * and to the next guard point, of mean about 16 * CMALLOC_GUARD_RATE (guard_mean). The nearer of
 * the two is handed to the thread's cache (sample_left). While either is on, the malloc fast
 * path's class table is no_class, so every allocation comes to api.c's alloc_sampling, which pops
 * the list as the fast path would and counts down by cm_sample_charge[class]: when an allocation
 * would take it below 0, that allocation goes on to cm_sample_alloc, which takes back what was
 * spent, finds which point the allocation holds, samples it, and hands the next point over.
 * With both off the fast path has no countdown; frees are never counted, so they stay on the
 * fast path whatever is on.
 *
 *     sample_left: |---- 64 ----|--- 64 ---|-- 40 --|   an allocation of 64 holds the point:
 *                  popped        popped      sampled, the next point handed over
 *
 * A guard point is kept with probability guard_keep[class] = (1/rate) / P(a point falls in an
 * object of the class), so that one small allocation in CMALLOC_GUARD_RATE is guarded whatever
 * the mix of sizes (classes above CM_GUARD_MAX_SIZE: 0). Aligned allocations above 16 bytes
 * (cm_alloc_aligned) bypass the sampler.
 *
 * A sampled allocation gets whole pages of its own from the page heap (a LARGE span even for a
 * small size), so its free cannot take the fast path and cm_sample_free drops it from the table.
 * Freed one-page samples wait in a stash of PAGE_STASH pages for the next samples instead of
 * going back to the page heap: a sample then costs neither the heap lock nor a cold page
 * (window-mixed samples about 120,000 times a second). Freeing a stashed page again is
 * reported as a double free. A page enters the stash marked STASH_UNFINISHED, unmarked once its
 * free has released prof_lock: a child forked while the free had not returned drops it again
 * (the program there still holds the block; see cm_prof_fork).
 * It weighs 1 / (1 - e^(-charge/rate)) allocations, the inverse of its chance to be sampled, so
 * sums over the samples estimate the real heap.
 *
 * Tables, never from malloc (one block of metadata memory taken at init; fixed size, shown in
 * the stats):
 *   samples  open addressing by address, SAMPLE_SLOTS, at most SAMPLE_MAX used (more samples are
 *            counted as dropped); deletion shifts entries back, so there are no tombstones
 *   stacks   open addressing by a hash of the frames, STACK_SLOTS of up to STACK_DEPTH return
 *            addresses, never removed (guard.c keeps their ids); when full, new stacks share
 *            stack 1, which has no frames
 * Lock: prof_lock guards both tables. It is taken alone: unwinding, allocation, guard.c's lock
 * and anything that asks the loader (naming frames) happen outside it, so fork may take it
 * first and a thread inside dlopen, holding the loader's lock, may always take it.
 * Output: the profile (cmalloc_prof_dump, CMALLOC_PROF_DUMP at exit, CMALLOC_PROF_SIGNAL) is
 * pprof's legacy heap-profile text followed by /proc/self/maps, to per-process names (the
 * at-exit profile's file, below); the leak report (CMALLOC_PROF_LEAKS) and guard.c's reports
 * name frames from each object's symbol table, read at report time (naming frames, below). The
 * signal handler only sets a flag; the next sampling slow path writes the file. Output is
 * formatted on the stack, written through os.c or straight to a descriptor of its own.
 */
#define _GNU_SOURCE
#include "internal.h"
#include "cmalloc.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdlib.h>
#include <ucontext.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unwind.h>

#define STACK_DEPTH       32
#define STACK_SLOTS       2048                   /* a power of two */
#define SAMPLE_SLOTS      16384                  /* a power of two */
#define SAMPLE_MAX        (SAMPLE_SLOTS / 4 * 3) /* load factor bound of the open addressing */
#define PAGE_STASH        16                     /* freed one-page samples kept for the next ones */
#define LEAK_STACKS_SHOWN 20
#define LN2               0.6931471805599453
/* The smallest class: guard points are spaced so that one of these objects holds a point with
 * probability exactly 1/CMALLOC_GUARD_RATE (guard_mean), the widest spacing that still lets
 * every class be guarded at the rate (guard_keep <= 1); closer points cost more slow paths. */
#define GUARD_UNIT        16

typedef struct stack_entry {
    uint64_t hash;                 /* of depth and frames; 0: an empty slot */
    uint32_t depth;                /* frames used */
    uint32_t samples_live;         /* scratch of a report: live samples with this stack */
    double alloc_count;            /* estimated allocations made from this stack so far */
    double alloc_bytes;            /* and their estimated bytes */
    double live_count;             /* scratch of a report: estimated live allocations */
    double live_bytes;             /* and their bytes */
    uintptr_t frames[STACK_DEPTH]; /* return addresses, the allocating function's first */
} stack_entry;

typedef struct sample {
    uintptr_t address; /* 0: an empty slot */
    uint32_t stack;    /* index + 1 into stacks */
    uint32_t unused;
    size_t size;   /* bytes requested */
    double weight; /* allocations this sample stands for: 1 / P(sampled) */
} sample;

#define NEVER (INT64_MAX / 4) /* the countdown of a feature that is off */

/* A thread's two countdowns, in bytes of size class (or large request) allocated, and what its
 * cache's sample_left has of them. */
typedef struct sampler {
    int64_t prof_left;      /* bytes before the next profile sample point */
    int64_t guard_left;     /* bytes before the next guard point */
    int64_t handed;         /* the cache's sample_left when last handed over */
    cm_thread_cache *cache; /* the live cache it was handed to, or NULL */
    uint64_t random;        /* xorshift state; 0 until the thread's first sampling */
    int busy;               /* inside the sampler: allocations it causes are plain */
    uint32_t unwinds;       /* stacks this thread has unwound (FAST_UNWIND_AFTER) */
} sampler;

int cm_sampling;
static int prof_on, guard_on;
static cm_lock prof_lock = CM_LOCK_INIT;
static stack_entry *stacks; /* STACK_SLOTS entries */
static sample *samples;     /* SAMPLE_SLOTS entries */
static size_t stack_count, sample_count, samples_dropped, table_bytes;
/* Freed one-page samples, still LARGE spans: page addresses, STASH_UNFINISHED set while the
 * free that stashed it has not released prof_lock (__atomic builtins: the unmarking is not
 * under it). */
static uintptr_t page_stash[PAGE_STASH];
static unsigned stashed;
#define STASH_UNFINISHED ((uintptr_t)1)
uint32_t cm_sample_charge[CM_CLASSES_MAX];
/* The malloc fast path's class table while sampling: every size "not small", so that every
 * allocation comes to the slow path (api.c), which counts it down. */
static const cm_class_lookup no_class;
static double prof_mean;  /* the mean distance between profile sample points, in bytes */
static double guard_mean; /* the same for guard points: GUARD_UNIT / -ln(1 - 1/GUARD_RATE) */
static double guard_keep[CM_CLASSES_MAX];  /* P(guarded | a guard point in an allocation) */
static double prof_weight[CM_CLASSES_MAX]; /* weight_of() each class's size, computed once */
static uint64_t guards_chosen; /* allocations chosen for the guard so far (__atomic builtins) */
static uintptr_t own_text_start, own_text_end; /* libcmalloc.so's code; empty when linked in */
static volatile sig_atomic_t dump_requested;
static unsigned dump_sequence; /* read and bumped with __atomic builtins */
static CM_THREAD_LOCAL sampler thread_sampler;

/* ---- random intervals ------------------------------------------------------------------
 * Our own logarithm and exponential: libm is not a dependency of the library (the static
 * library is linked by programs that may not add -lm). */

/* ln(v) for v >= 1: v = m * 2^e with m in [1, 2), ln m = 2 atanh(t) with t = (m - 1) / (m + 1)
 * <= 1/3, its odd series to t^17 summed by Horner's rule with constant coefficients. Every
 * sample draws one: a single division (chained divisions cost more than the rest). */
static double log_of(uint64_t v)
{
    int e = 63 - __builtin_clzll(v);
    double m = (double)(v << (63 - e)) * 0x1p-63; /* exact scaling by a power of two */
    double t = (m - 1) / (m + 1), t2 = t * t;
    double sum = 1.0 / 17;
    static const double odd_inverse[] = {1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9,
                                         1.0 / 7,  1.0 / 5,  1.0 / 3,  1.0};
    for (unsigned k = 0; k < sizeof odd_inverse / sizeof odd_inverse[0]; k++)
        sum = sum * t2 + odd_inverse[k];
    return e * LN2 + 2 * t * sum;
}

/* e^-x for x >= 0: x = n ln2 + r, e^-r by its series (r < ln 2), halved n times. Used at
 * start (per-class tables) and for samples of large blocks. */
static double exp_negative(double x)
{
    if (x > 700)
        return 0;
    int n = (int)(x / LN2);
    double r = x - n * LN2, term = 1, sum = 1;
    for (int k = 1; k <= 16; k++) {
        term *= -r / k;
        sum += term;
    }
    return n >= 63 ? 0 : sum / (double)((uint64_t)1 << n);
}

static uint64_t next_random(sampler *s)
{
    s->random ^= s->random >> 12;
    s->random ^= s->random << 25;
    s->random ^= s->random >> 27;
    return s->random * 0x2545f4914f6cdd1dull;
}

/* -ln(u) for u uniform in (0, 1]: an exponential variable of mean 1. */
static double exponential(sampler *s)
{
    uint64_t v = (next_random(s) >> 11) + 1; /* 1 .. 2^53 */
    return 53 * LN2 - log_of(v);
}

/* The next distance in bytes, at least 1: exponential of mean scale (0: the next byte). */
static int64_t draw(sampler *s, double scale)
{
    return (int64_t)(exponential(s) * scale) + 1;
}

/* ---- stacks -------------------------------------------------------------------------------- */
typedef struct unwind_state {
    uintptr_t frames[STACK_DEPTH];
    unsigned depth;
    uintptr_t boundary; /* return address of the hook: frames before it are ours */
    int kept;           /* the boundary frame was seen */
    int boundary_ours;  /* the boundary frame is cmalloc's too (the hook was not tail-called) */
} unwind_state;

/* Takes the next return address, innermost first; false when the stack is complete. */
static bool keep_frame(unwind_state *state, uintptr_t ip)
{
    if (!state->kept) {
        if (ip != state->boundary)
            return true;
        state->kept = 1;
        if (state->boundary_ours)
            return true;
    }
    if (ip == 0)
        return false; /* the outermost frame (_start's caller) */
    if (ip - own_text_start < own_text_end - own_text_start && state->depth == 0)
        return true; /* still inside libcmalloc.so (an entry point, calloc, ...) */
    state->frames[state->depth++] = ip;
    return state->depth < STACK_DEPTH;
}

static _Unwind_Reason_Code unwind_step(struct _Unwind_Context *context, void *arg)
{
    return keep_frame(arg, _Unwind_GetIP(context)) ? _URC_NO_REASON : _URC_END_OF_STACK;
}

/* libunwind's unw_backtrace, when cm_prof_start could load it: it caches how to step
 * over each return address, where libgcc's _Unwind_Backtrace interprets the DWARF call-frame
 * rules of every frame every time (scripts/prof-cost.sh --instructions, profiler on,
 * malloc(1000)+free: 120 instructions a pair with libgcc, 98 with libunwind). */
static int (*fast_backtrace)(void **frames, int capacity);
#define OWN_FRAMES_MAX    16 /* frames inside cmalloc below the boundary, at most */
/* libunwind's cache is per thread: setting it up and tearing it down at thread exit (mmap,
 * munmap) costs more than libgcc's unwinds of a short-lived thread's few samples (thread churn
 * ran at 0.52 of off with the profiler on: scripts/prof-cost.sh), so a thread's first few
 * stacks come from libgcc. */
#define FAST_UNWIND_AFTER 8

static void unwind(unwind_state *state)
{
    if (fast_backtrace != NULL && thread_sampler.unwinds++ >= FAST_UNWIND_AFTER) {
        void *frames[STACK_DEPTH + OWN_FRAMES_MAX];
        int n = fast_backtrace(frames, STACK_DEPTH + OWN_FRAMES_MAX);
        for (int i = 0; i < n && keep_frame(state, (uintptr_t)frames[i]); i++)
            ;
    } else {
        _Unwind_Backtrace(unwind_step, state);
    }
}

static int find_own_text(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    uintptr_t self = (uintptr_t)cm_prof_init;
    for (unsigned i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + segment->p_vaddr;
        if (segment->p_type == PT_LOAD && self - start < segment->p_memsz) {
            if (info->dlpi_name[0] != '\0') { /* a shared library, not the program itself */
                own_text_start = start;
                own_text_end = start + segment->p_memsz;
            }
            return 1;
        }
    }
    return 0;
}

static uint64_t hash_frames(const uintptr_t *frames, unsigned depth)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ depth;
    for (unsigned i = 0; i < depth; i++)
        h = (h ^ frames[i]) * 0xff51afd7ed558ccdull;
    return h | 1; /* never 0, the empty mark */
}

/* The id of the stack above the frame that returns to boundary (from it on, or from the next
 * with boundary_ours), entered in the table. boundary_ours matters where no own_text range
 * drops cmalloc's leading frames: a program linked with libcmalloc.a. */
static uint32_t capture_stack(uintptr_t boundary, bool boundary_ours)
{
    /* The unwinders make system calls (libunwind probes memory with read() on a pipe): keep
     * errno, and keep a deferred pthread_cancel from acting in them, which would unwind the
     * thread out of the middle of malloc or free (tests/programs/cancel_prof.c). */
    int saved_errno = errno;
    int cancel_state = cm_os_cancel_off();
    unwind_state state = {
        .depth = 0, .boundary = boundary, .kept = 0, .boundary_ours = boundary_ours};
    unwind(&state);
    if (!state.kept) { /* the boundary frame was not found (inlined?): keep everything */
        state.kept = 1;
        state.boundary = 0;
        state.boundary_ours = 0;
        state.depth = 0;
        unwind(&state);
    }
    cm_os_cancel_restore(cancel_state);
    errno = saved_errno;
    uint64_t hash = hash_frames(state.frames, state.depth);
    cm_lock_acquire(&prof_lock);
    size_t i = hash & (STACK_SLOTS - 1);
    uint32_t id = 1; /* the shared stack of a full table */
    for (size_t probes = 0; probes < STACK_SLOTS; probes++, i = (i + 1) & (STACK_SLOTS - 1)) {
        stack_entry *entry = &stacks[i];
        if (entry->hash == hash && entry->depth == state.depth &&
            memcmp(entry->frames, state.frames, state.depth * sizeof(uintptr_t)) == 0) {
            id = (uint32_t)i + 1;
            break;
        }
        if (entry->hash == 0) {
            if (stack_count + 1 >= STACK_SLOTS - STACK_SLOTS / 8)
                break; /* keep probe chains short: the rest share stack 1 */
            entry->hash = hash;
            entry->depth = state.depth;
            memcpy(entry->frames, state.frames, state.depth * sizeof(uintptr_t));
            stack_count++;
            id = (uint32_t)i + 1;
            break;
        }
    }
    cm_lock_release(&prof_lock);
    return id;
}

/* ---- naming frames --------------------------------------------------------------------------
 * At report time only, and never with malloc or a lock of ours held (a guard fault's handler
 * names frames too). The object holding an address and its load bias come from the loader's
 * list (dl_iterate_phdr); the function from a symbol table read from a file mapped with mmap and
 * unmapped after: the object's .symtab, which dladdr never sees (a program built without
 * -rdynamic exports none of its functions); when the object has none (Debian's libc is
 * stripped), the .symtab of its separate debug file (libc6-dbg's), found by its build-id or its
 * .gnu_debuglink; else the object's .dynsym. Then dladdr's name; then none. A frame prints as
 *     0x<address> <function>+0x<off> (<object>+0x<vaddr>)    or    0x<address> (<object>+0x<vaddr>)
 * where vaddr is the looked-up address in the object's own numbering, so that
 * `addr2line -f -e <object> <vaddr>` (scripts/cmalloc-symbolize) gives function and line. A
 * return address is looked up one byte back, inside its call instruction (it may be the first
 * byte of the next function). */
typedef struct object_lookup {
    uintptr_t address; /* in: the address to place */
    uintptr_t bias;    /* out: the object's load bias (ELF addresses + bias = run-time ones) */
    const char *name;  /* out: its path as the loader has it ("" for the program), or NULL */
} object_lookup;

static int find_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    object_lookup *lookup = arg;
    for (unsigned i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        if (segment->p_type == PT_LOAD &&
            lookup->address - (info->dlpi_addr + segment->p_vaddr) < segment->p_memsz) {
            lookup->bias = info->dlpi_addr;
            lookup->name = info->dlpi_name;
            return 1;
        }
    }
    return 0;
}

/* An object file mapped for reading (elf_map): a 64-bit ELF file (the class of the objects
 * this library runs among) whose section headers lie inside it. */
typedef struct elf_file {
    const unsigned char *bytes;
    size_t size;
    const Elf64_Ehdr *header;
    const Elf64_Shdr *sections; /* header->e_shnum of them */
} elf_file;

static bool elf_map(const char *path, elf_file *elf)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat status;
    void *map = fstat(fd, &status) == 0 && (size_t)status.st_size >= sizeof(Elf64_Ehdr)
                    ? mmap(NULL, (size_t)status.st_size, PROT_READ, MAP_PRIVATE, fd, 0)
                    : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED)
        return false;
    *elf = (elf_file){.bytes = map, .size = (size_t)status.st_size, .header = map};
    const Elf64_Ehdr *header = elf->header;
    if (memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 || header->e_ident[EI_CLASS] != ELFCLASS64 ||
        header->e_shentsize != sizeof(Elf64_Shdr) || header->e_shoff >= elf->size ||
        header->e_shnum > (elf->size - header->e_shoff) / sizeof(Elf64_Shdr)) {
        munmap(map, elf->size);
        return false;
    }
    elf->sections = (const Elf64_Shdr *)(elf->bytes + header->e_shoff);
    return true;
}

static void elf_unmap(const elf_file *elf)
{
    munmap((void *)elf->bytes, elf->size);
}

/* The bytes of section i inside the file, NULL when they are not there (or it has none). */
static const unsigned char *section_bytes(const elf_file *elf, unsigned i)
{
    const Elf64_Shdr *section = &elf->sections[i];
    return section->sh_type != SHT_NOBITS && section->sh_offset <= elf->size &&
                   section->sh_size <= elf->size - section->sh_offset
               ? elf->bytes + section->sh_offset
               : NULL;
}

static bool has_section_type(const elf_file *elf, unsigned type)
{
    for (unsigned i = 0; i < elf->header->e_shnum; i++)
        if (elf->sections[i].sh_type == type && section_bytes(elf, i) != NULL)
            return true;
    return false;
}

/* The function holding vaddr in the file's symbol tables of the type given (SHT_SYMTAB or
 * SHT_DYNSYM): the one starting last where several do, and of aliases (libc's debug file has
 * __libc_start_main_impl, __libc_start_main_alias_2 and __libc_start_main@@GLIBC_2.34 at one
 * address) a global one, the name .dynsym gives. Its name is copied into name (bounded, without
 * a symbol version "@..."), its start into *start. False when none holds vaddr. */
static bool symbol_in_tables(const elf_file *elf, unsigned table_type, uintptr_t vaddr, char *name,
                             size_t capacity, uintptr_t *start)
{
    const Elf64_Sym *best = NULL;
    const char *best_names = NULL;
    size_t best_names_size = 0;
    for (unsigned i = 0; i < elf->header->e_shnum; i++) {
        const Elf64_Shdr *table = &elf->sections[i];
        const unsigned char *symbols = section_bytes(elf, i);
        if (table->sh_type != table_type || symbols == NULL ||
            table->sh_link >= elf->header->e_shnum || section_bytes(elf, table->sh_link) == NULL)
            continue;
        size_t count = table->sh_size / sizeof(Elf64_Sym);
        for (size_t k = 0; k < count; k++) {
            const Elf64_Sym *symbol = (const Elf64_Sym *)symbols + k;
            unsigned type = ELF64_ST_TYPE(symbol->st_info);
            if ((type != STT_FUNC && type != STT_GNU_IFUNC) || symbol->st_shndx == SHN_UNDEF ||
                vaddr < symbol->st_value || vaddr - symbol->st_value >= symbol->st_size)
                continue;
            if (best == NULL || symbol->st_value > best->st_value ||
                (symbol->st_value == best->st_value && ELF64_ST_BIND(best->st_info) == STB_LOCAL &&
                 ELF64_ST_BIND(symbol->st_info) != STB_LOCAL)) {
                best = symbol;
                best_names = (const char *)section_bytes(elf, table->sh_link);
                best_names_size = elf->sections[table->sh_link].sh_size;
            }
        }
    }
    if (best == NULL || best->st_name >= best_names_size)
        return false;
    const char *text = best_names + best->st_name;
    size_t n = 0;
    while (n + 1 < capacity && n < best_names_size - best->st_name && text[n] != '\0' &&
           text[n] != '@') {
        name[n] = text[n];
        n++;
    }
    name[n] = '\0';
    *start = best->st_value;
    return n > 0;
}

/* The descriptor of the file's note of the type given, owned by "GNU", from its SHT_NOTE
 * sections (a debug file keeps them, though its segments' offsets no longer hold them); its
 * size in *size. NULL when there is none. */
static const unsigned char *gnu_note(const elf_file *elf, uint32_t type, size_t *size)
{
    for (unsigned i = 0; i < elf->header->e_shnum; i++) {
        const unsigned char *note = section_bytes(elf, i);
        if (elf->sections[i].sh_type != SHT_NOTE || note == NULL)
            continue;
        size_t align = elf->sections[i].sh_addralign == 8 ? 8 : 4;
        const unsigned char *end = note + elf->sections[i].sh_size;
        while ((size_t)(end - note) >= sizeof(Elf64_Nhdr)) {
            const Elf64_Nhdr *header = (const Elf64_Nhdr *)note;
            size_t left = (size_t)(end - note) - sizeof *header;
            size_t name_size = ((size_t)header->n_namesz + align - 1) & ~(align - 1);
            size_t descriptor_size = ((size_t)header->n_descsz + align - 1) & ~(align - 1);
            if (name_size > left || descriptor_size > left - name_size)
                break;
            const unsigned char *owner = note + sizeof *header, *descriptor = owner + name_size;
            if (header->n_type == type && header->n_namesz == 4 && memcmp(owner, "GNU", 4) == 0 &&
                header->n_descsz > 0) {
                *size = header->n_descsz;
                return descriptor;
            }
            note = descriptor + descriptor_size;
        }
    }
    return NULL;
}

/* The name of the debug file the object's .gnu_debuglink names, and the CRC-32 of that file it
 * holds; NULL when there is none. */
static const char *debuglink(const elf_file *elf, uint32_t *crc)
{
    unsigned names = elf->header->e_shstrndx;
    const char *section_names =
        names < elf->header->e_shnum ? (const char *)section_bytes(elf, names) : NULL;
    if (section_names == NULL)
        return NULL;
    size_t names_size = elf->sections[names].sh_size;
    static const char wanted[] = ".gnu_debuglink";
    for (unsigned i = 0; i < elf->header->e_shnum; i++) {
        const char *link = (const char *)section_bytes(elf, i);
        size_t size = elf->sections[i].sh_size, at = elf->sections[i].sh_name;
        if (link == NULL || at >= names_size || names_size - at < sizeof wanted ||
            memcmp(section_names + at, wanted, sizeof wanted) != 0)
            continue;
        size_t length = strnlen(link, size);
        size_t crc_at = (length + 4) & ~(size_t)3; /* after the name's NUL, 4-byte aligned */
        if (length == 0 || crc_at > size || size - crc_at < sizeof *crc)
            return NULL;
        memcpy(crc, link + crc_at, sizeof *crc);
        return link;
    }
    return NULL;
}

/* The CRC-32 of .gnu_debuglink (zlib's: reflected, polynomial 0xedb88320), four bits a step. */
static uint32_t crc32_of(const unsigned char *bytes, size_t size)
{
    static const uint32_t step[16] = {0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac,
                                      0x76dc4190, 0x6b6b51f4, 0x4db26158, 0x5005713c,
                                      0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c,
                                      0x9b64c2b0, 0x86d3d2d4, 0xa00ae278, 0xbdbdf21c};
    uint32_t crc = ~(uint32_t)0;
    for (size_t i = 0; i < size; i++) {
        crc ^= bytes[i];
        crc = (crc >> 4) ^ step[crc & 15];
        crc = (crc >> 4) ^ step[crc & 15];
    }
    return ~crc;
}

#define DEBUG_ROOT     "/usr/lib/debug"
#define DEBUG_PATH_MAX 256

/* Appends n bytes of text to path (DEBUG_PATH_MAX, kept NUL-terminated); false when they do not
 * fit. */
static bool path_append(char *path, size_t *length, const char *text, size_t n)
{
    if (n >= DEBUG_PATH_MAX - *length)
        return false;
    memcpy(path + *length, text, n);
    *length += n;
    path[*length] = '\0';
    return true;
}

/* Appends the bytes as lowercase hex digits. */
static bool path_append_hex(char *path, size_t *length, const unsigned char *bytes, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    bool fits = true;
    for (size_t i = 0; i < n && fits; i++) {
        char pair[2] = {digits[bytes[i] >> 4], digits[bytes[i] & 15]};
        fits = path_append(path, length, pair, 2);
    }
    return fits;
}

/* Looks vaddr up in the .symtab of the file at candidate when it is object's debug file: the
 * same build-id, or where the object has none, the CRC-32 of its .gnu_debuglink (crc). */
static bool symbol_in_debug_candidate(const elf_file *object, const char *candidate, uint32_t crc,
                                      uintptr_t vaddr, char *name, size_t capacity,
                                      uintptr_t *start)
{
    elf_file debug;
    if (!elf_map(candidate, &debug))
        return false;
    size_t id_size, debug_id_size;
    const unsigned char *id = gnu_note(object, NT_GNU_BUILD_ID, &id_size);
    const unsigned char *debug_id = gnu_note(&debug, NT_GNU_BUILD_ID, &debug_id_size);
    bool same = id != NULL ? debug_id != NULL && id_size == debug_id_size &&
                                 memcmp(id, debug_id, id_size) == 0
                           : crc32_of(debug.bytes, debug.size) == crc;
    bool found = same && symbol_in_tables(&debug, SHT_SYMTAB, vaddr, name, capacity, start);
    elf_unmap(&debug);
    return found;
}

/* Looks vaddr up in the .symtab of the separate debug file of the object at path (one with no
 * .symtab of its own): DEBUG_ROOT/.build-id/<first byte>/<the other bytes>.debug by its
 * build-id, then the file its .gnu_debuglink names, in <its directory>/.debug/ and
 * DEBUG_ROOT/<its directory>/ (where gdb looks too). */
static bool symbol_in_debug_file(const elf_file *object, const char *path, uintptr_t vaddr,
                                 char *name, size_t capacity, uintptr_t *start)
{
    char candidate[DEBUG_PATH_MAX];
    size_t length = 0, id_size;
    const unsigned char *id = gnu_note(object, NT_GNU_BUILD_ID, &id_size);
    static const char build_ids[] = DEBUG_ROOT "/.build-id/", suffix[] = ".debug";
    if (id != NULL && id_size >= 2 &&
        path_append(candidate, &length, build_ids, sizeof build_ids - 1) &&
        path_append_hex(candidate, &length, id, 1) && path_append(candidate, &length, "/", 1) &&
        path_append_hex(candidate, &length, id + 1, id_size - 1) &&
        path_append(candidate, &length, suffix, sizeof suffix - 1) &&
        symbol_in_debug_candidate(object, candidate, 0, vaddr, name, capacity, start))
        return true;
    uint32_t crc;
    const char *link = debuglink(object, &crc);
    const char *slash = strrchr(path, '/');
    if (link == NULL || slash == NULL)
        return false;
    size_t directory = (size_t)(slash - path) + 1; /* with its final '/' */
    for (int place = 0; place < 2; place++) {
        length = 0;
        bool fits = place == 0
                        ? path_append(candidate, &length, path, directory) &&
                              path_append(candidate, &length, ".debug/", 7)
                        : path[0] == '/' &&
                              path_append(candidate, &length, DEBUG_ROOT, sizeof DEBUG_ROOT - 1) &&
                              path_append(candidate, &length, path, directory);
        if (fits && path_append(candidate, &length, link, strlen(link)) &&
            symbol_in_debug_candidate(object, candidate, crc, vaddr, name, capacity, start))
            return true;
    }
    return false;
}

/* The function of the object file at path holding vaddr, copied into name (bounded); its start
 * in *start: from the file's .symtab, else its separate debug file's, else its .dynsym. False
 * when the file cannot be read or no symbol holds vaddr. */
static bool symbol_in_file(const char *path, uintptr_t vaddr, char *name, size_t capacity,
                           uintptr_t *start)
{
    elf_file object;
    if (!elf_map(path, &object))
        return false;
    bool found = has_section_type(&object, SHT_SYMTAB)
                     ? symbol_in_tables(&object, SHT_SYMTAB, vaddr, name, capacity, start)
                     : symbol_in_debug_file(&object, path, vaddr, name, capacity, start);
    found = found || symbol_in_tables(&object, SHT_DYNSYM, vaddr, name, capacity, start);
    elf_unmap(&object);
    return found;
}

/* Appends "0x<address> <function>+0x<off> (<object>+0x<vaddr>)", or what of it can be known.
 * return_address: address is a return address (looked up one byte back). */
static void describe_address(cm_message *m, uintptr_t address, bool return_address)
{
    uintptr_t lookup_address = address - (return_address ? 1 : 0);
    cm_message_hex(m, address);
    object_lookup object = {.address = lookup_address, .bias = 0, .name = NULL};
    int saved = errno;
    dl_iterate_phdr(find_object, &object);
    char exe[256];
    const char *path = object.name;
    if (path != NULL && path[0] == '\0') { /* the program itself */
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[n > 0 ? n : 0] = '\0';
        path = n > 0 ? exe : NULL;
    }
    char function[160];
    uintptr_t start = 0, vaddr = lookup_address - object.bias;
    bool named = path != NULL && symbol_in_file(path, vaddr, function, sizeof function, &start);
    Dl_info info;
    if (!named && dladdr((void *)lookup_address, &info) != 0 && info.dli_sname != NULL) {
        size_t n = strlen(info.dli_sname);
        n = n < sizeof function - 1 ? n : sizeof function - 1;
        memcpy(function, info.dli_sname, n);
        function[n] = '\0';
        start = (uintptr_t)info.dli_saddr - object.bias;
        named = true;
    }
    errno = saved;
    if (named) {
        cm_message_str(m, " ");
        cm_message_str(m, function);
        cm_message_str(m, "+");
        cm_message_hex(m, vaddr - start);
    }
    if (path != NULL) {
        cm_message_str(m, " (");
        cm_message_str(m, path);
        cm_message_str(m, "+");
        cm_message_hex(m, vaddr);
        cm_message_str(m, ")");
    }
}

/* Writes frames one a line, innermost first; all return addresses but, with exact_first, the
 * first (a faulting instruction). */
static void print_frames(const uintptr_t *frames, unsigned depth, bool exact_first, int fd)
{
    cm_message m = {.length = 0};
    for (unsigned i = 0; i < depth; i++) {
        cm_message_str(&m, "    #");
        cm_message_uint(&m, i);
        cm_message_str(&m, " ");
        describe_address(&m, frames[i], i > 0 || !exact_first);
        cm_message_str(&m, "\n");
        cm_message_write(&m, fd);
    }
}

/* Writes a stack of the table. */
void cm_prof_stack_print(uint32_t stack, int fd)
{
    if (stack == 0 || stacks == NULL)
        return;
    const stack_entry *entry = &stacks[stack - 1];
    if (entry->depth == 0) {
        cm_message m = {.length = 0};
        cm_message_str(&m, "    (no stack: the profiler's stack table is full)\n");
        cm_message_write(&m, fd);
    }
    print_frames(entry->frames, entry->depth, false, fd);
}

/* The faulting instruction of a signal's context (a ucontext_t), 0 where not known. */
static uintptr_t context_pc(const void *context)
{
#if defined(__x86_64__)
    return (uintptr_t)((const ucontext_t *)context)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)((const ucontext_t *)context)->uc_mcontext.pc;
#else
    (void)context;
    return 0;
#endif
}

/* Writes the stack of the access a fault interrupted, from inside its SIGSEGV handler. libgcc's
 * unwinder steps from the handler through the kernel's signal frame into the faulting
 * function, whose frame's address is the faulting instruction itself; the frames before it
 * (the handler's) are dropped. It takes no lock of ours and does not allocate (the loader's
 * lock-free _dl_find_object finds each frame's tables). When it cannot step through the
 * signal frame, the faulting instruction alone is printed. */
static void print_access_stack(const void *context, int fd)
{
    uintptr_t pc = context_pc(context);
    unwind_state state = {.depth = 0, .boundary = pc, .kept = 0, .boundary_ours = 0};
    if (pc != 0)
        _Unwind_Backtrace(unwind_step, &state);
    if (!state.kept || state.depth == 0) {
        state.frames[0] = pc;
        state.depth = pc != 0;
    }
    print_frames(state.frames, state.depth, true, fd);
}

/* ---- the sample table ----------------------------------------------------------------------- */
static size_t sample_home(uintptr_t address)
{
    return (size_t)((address >> 4) * 0x9e3779b97f4a7c15ull >> 32) & (SAMPLE_SLOTS - 1);
}

/* How many allocations of charge bytes one sample stands for: 1 / P(a point falls in it). */
static double weight_of(size_t charge)
{
    return 1 / (1 - exp_negative((double)charge / (double)cm_option.prof_rate));
}

static void record_sample(void *p, size_t size, double weight, uint32_t stack)
{
    cm_lock_acquire(&prof_lock);
    stacks[stack - 1].alloc_count += weight;
    stacks[stack - 1].alloc_bytes += weight * (double)size;
    if (sample_count >= SAMPLE_MAX) {
        samples_dropped++;
    } else {
        size_t i = sample_home((uintptr_t)p);
        while (samples[i].address != 0)
            i = (i + 1) & (SAMPLE_SLOTS - 1);
        samples[i] =
            (sample){.address = (uintptr_t)p, .stack = stack, .size = size, .weight = weight};
        sample_count++;
    }
    cm_lock_release(&prof_lock);
}

/* Finds p's slot; the caller holds prof_lock. SAMPLE_SLOTS when p is not sampled. */
static size_t find_sample_locked(uintptr_t address)
{
    for (size_t i = sample_home(address); samples[i].address != 0; i = (i + 1) & (SAMPLE_SLOTS - 1))
        if (samples[i].address == address)
            return i;
    return SAMPLE_SLOTS;
}

/* Whether p may be a sample (or a stashed one) at all: samples start pages of their own. */
static bool may_be_sampled(const void *p)
{
    return prof_on && ((uintptr_t)p & (CM_PAGE_SIZE - 1)) == 0 &&
           (__atomic_load_n(&sample_count, __ATOMIC_RELAXED) != 0 ||
            __atomic_load_n(&stashed, __ATOMIC_RELAXED) != 0);
}

/* Whether address starts a LARGE span of one page: a sampled block's own page (not the class
 * object alloc_own_pages falls back to when the page heap is out of memory). */
static bool is_one_page_span(uintptr_t address)
{
    const cm_span *span = cm_span_of((const void *)address);
    return span != NULL && span->state == CM_SPAN_LARGE && span->pages == 1 &&
           (uintptr_t)cm_span_start(span) == address;
}

static uintptr_t stash_page_locked(unsigned i)
{
    return __atomic_load_n(&page_stash[i], __ATOMIC_RELAXED) & ~STASH_UNFINISHED;
}

static bool is_stashed_locked(uintptr_t address)
{
    for (unsigned i = 0; i < stashed; i++)
        if (stash_page_locked(i) == address)
            return true;
    return false;
}

static bool is_sampled(const void *p)
{
    if (!may_be_sampled(p))
        return false;
    cm_lock_acquire(&prof_lock);
    bool found = find_sample_locked((uintptr_t)p) != SAMPLE_SLOTS;
    cm_lock_release(&prof_lock);
    return found;
}

/* Drops p's sample, if any, shifting later entries of its probe chain back into the hole. With
 * own_pages (p is not a guarded block), a sample that is a one-page LARGE span then goes to the
 * stash if it has room. Returns true when p needs no more freeing: stashed, or a stashed page
 * freed again (reported). */
static bool forget_sample(uintptr_t address, bool own_pages, const char *caller)
{
    if (!may_be_sampled((const void *)address))
        return false;
    bool done = false;
    unsigned stash_index = 0;
    cm_lock_acquire(&prof_lock);
    size_t hole = find_sample_locked(address);
    if (hole == SAMPLE_SLOTS && own_pages && is_stashed_locked(address)) {
        cm_lock_release(&prof_lock);
        cm_report_double_free(caller, (const void *)address);
        return true;
    }
    if (hole != SAMPLE_SLOTS) {
        if (own_pages && stashed < PAGE_STASH && is_one_page_span(address)) {
            stash_index = stashed;
            __atomic_store_n(&page_stash[stash_index], address | STASH_UNFINISHED,
                             __ATOMIC_RELAXED);
            __atomic_store_n(&stashed, stashed + 1, __ATOMIC_RELAXED);
            done = true;
        }
        samples[hole].address = 0;
        sample_count--;
        for (size_t i = (hole + 1) & (SAMPLE_SLOTS - 1); samples[i].address != 0;
             i = (i + 1) & (SAMPLE_SLOTS - 1)) {
            size_t home = sample_home(samples[i].address);
            /* movable when its home is not in the cyclic range (hole, i] */
            if (((i - home) & (SAMPLE_SLOTS - 1)) >= ((i - hole) & (SAMPLE_SLOTS - 1))) {
                samples[hole] = samples[i];
                samples[i].address = 0;
                hole = i;
            }
        }
    }
    cm_lock_release(&prof_lock);
    /* The entry may have been taken meanwhile (by an allocation, a release): then the
     * exchange fails, as it should. */
    uintptr_t unfinished = address | STASH_UNFINISHED;
    if (done)
        __atomic_compare_exchange_n(&page_stash[stash_index], &unfinished, address, false,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return done;
}

/* ---- the sampling decision ---------------------------------------------------------------- */
/* Seeds a thread's generator without a system call (thread churn pays for every one): a
 * process-wide random key, the thread's own address and a count, mixed (splitmix64). */
static void start_thread(sampler *s)
{
    static uint64_t threads_started; /* __atomic builtins, as for dump_sequence */
    uint64_t z =
        cm_list_key ^ (uintptr_t)s ^
        (__atomic_fetch_add(&threads_started, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    s->random = (z ^ (z >> 31)) | 1; /* xorshift needs a state other than 0 */
    s->prof_left = prof_on ? draw(s, prof_mean) : NEVER;
    s->guard_left = guard_on ? draw(s, guard_mean) : NEVER;
}

/* Takes in what the pops counted down since the last hand-over: it never passes 0, so
 * neither countdown has run out on the way. */
static void take_countdown(sampler *s)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    if (cache != s->cache || cache->max_size == 0)
        return;
    int64_t spent = s->handed - cache->sample_left;
    s->prof_left -= spent;
    s->guard_left -= spent;
}

/* Hands the nearer point to the thread's live cache, whose pops count down to it. The
 * shared empty cache (a thread with no cache yet, or exiting; max_size 0) is never written. */
static void hand_countdown(sampler *s)
{
    cm_thread_cache *cache = cm_thread_cache_current;
    s->cache = cache->max_size != 0 ? cache : NULL;
    if (s->cache != NULL)
        cache->sample_left = s->handed =
            s->prof_left < s->guard_left ? s->prof_left : s->guard_left;
}

/* Whether an allocation of charge bytes holds a point of the countdown at *left; draws the
 * next point when it does (the process is memoryless: the rest of the allocation is ignored). */
static bool point_in(sampler *s, int64_t *left, double mean, int64_t charge)
{
    if (*left - charge >= 0) {
        *left -= charge;
        return false;
    }
    *left = draw(s, mean);
    return true;
}

/* A guard point fell in an allocation of size_class: it is guarded with the probability that
 * makes one small allocation in CMALLOC_GUARD_RATE guarded whatever the sizes (guard_keep). */
static bool guard_taken(sampler *s, unsigned size_class)
{
    double keep = guard_keep[size_class];
    if (keep < 1 && (double)(next_random(s) >> 11) >= keep * 0x1p53)
        return false;
    __atomic_fetch_add(&guards_chosen, 1, __ATOMIC_RELAXED);
    return true;
}

/* A sampled allocation's own pages, so that freeing it comes to cm_sample_free: a stashed page
 * when one page holds it. */
static void *alloc_own_pages(size_t size)
{
    if (size <= CM_PAGE_SIZE && __atomic_load_n(&stashed, __ATOMIC_RELAXED) != 0) {
        cm_lock_acquire(&prof_lock);
        void *page = NULL;
        if (stashed > 0) { /* written under the lock, read without it by may_be_sampled */
            page = (void *)stash_page_locked(stashed - 1);
            __atomic_store_n(&stashed, stashed - 1, __ATOMIC_RELAXED);
        }
        cm_lock_release(&prof_lock);
        if (page != NULL)
            return page;
    }
    if (size <= CM_MAX_SMALL) {
        cm_span *span =
            cm_page_heap_alloc(size ? (size + CM_PAGE_SIZE - 1) >> CM_PAGE_SHIFT : 1, 1, 0);
        if (span != NULL)
            return cm_span_start(span);
    }
    return cm_alloc_unchecked(size); /* large sizes have whole pages anyway; errno on failure */
}

static void dump_on_signal(void);

/* Every allocation alloc_sampling does not serve comes here: a miss of the thread's list
 * (charged here), an allocation on which a countdown runs out, a large one. */
void *cm_sample_alloc(size_t size)
{
    sampler *s = &thread_sampler;
    if (s->busy)
        return cm_alloc_unchecked(size);
    if (CM_UNLIKELY(s->random == 0))
        start_thread(s);
    if (CM_UNLIKELY(dump_requested))
        dump_on_signal();
    take_countdown(s);
    unsigned size_class = size <= CM_MAX_SMALL ? cm_size_class(size) : 0;
    size_t bytes = size_class ? cm_classes[size_class].size : size;
    int64_t charge = size_class ? cm_sample_charge[size_class] : prof_on ? (int64_t)size : 0;
    bool prof_due = prof_on && point_in(s, &s->prof_left, prof_mean, charge);
    bool guard_due = guard_on && point_in(s, &s->guard_left, guard_mean, charge) &&
                     size_class != 0 && guard_taken(s, size_class);
    void *p;
    if (!prof_due && !guard_due) {
        p = cm_alloc_unchecked(size);
    } else {
        s->busy = 1;
        /* reached by a tail call from the entry point: the boundary is the program's */
        uint32_t stack = capture_stack((uintptr_t)__builtin_return_address(0), false);
        p = guard_due ? cm_guard_alloc(size, stack) : NULL;
        if (prof_due) {
            if (p == NULL)
                p = alloc_own_pages(size);
            if (p != NULL)
                record_sample(p, size, size_class ? prof_weight[size_class] : weight_of(bytes),
                              stack);
        } else if (p == NULL) {
            p = cm_alloc_unchecked(size); /* every guard slot is taken */
        }
        s->busy = 0;
    }
    hand_countdown(s);
    return p;
}

/* A free the fast path did not take: a guarded block goes back to guard.c, a sampled one
 * leaves the table (and is then freed by the ordinary path, which its own pages send here). */
bool cm_sample_free(void *p, const char *caller)
{
    if (cm_guard_owns(p)) {
        sampler *s = &thread_sampler;
        uint32_t stack = 0;
        if (!s->busy) {
            s->busy = 1;
            /* called from inside cm_free_slow: the boundary frame is cmalloc's */
            stack = capture_stack((uintptr_t)__builtin_return_address(0), true);
            s->busy = 0;
        }
        if (prof_on)
            forget_sample((uintptr_t)p, false, caller);
        cm_guard_free(p, caller, stack);
        return true;
    }
    return forget_sample((uintptr_t)p, true, caller);
}

/* realloc while sampling: whether p is a guarded or sampled block, which always moves (through
 * the sampler again, its free through cm_sample_free; *old_size: the bytes to copy). Any other
 * block is left to the ordinary path: one that stays in place was charged when it was
 * allocated, one that moves is charged by its new allocation. */
bool cm_sample_realloc_moves(const void *p, size_t *old_size)
{
    if (cm_guard_owns(p))
        *old_size = cm_guard_usable_size(p, "realloc");
    else if (is_sampled(p))
        *old_size = cm_usable_size_unchecked(p, "realloc");
    else
        return false;
    return true;
}

/* ---- output ----------------------------------------------------------------------------- */
typedef struct writer {
    int fd;
    bool failed;
    size_t length;
    char buffer[4096];
} writer;

static void put_bytes(writer *w, const char *bytes, size_t length)
{
    while (length > 0) {
        if (w->length == sizeof w->buffer) {
            w->failed |= !cm_os_write(w->fd, w->buffer, w->length);
            w->length = 0;
        }
        size_t n = sizeof w->buffer - w->length < length ? sizeof w->buffer - w->length : length;
        memcpy(w->buffer + w->length, bytes, n);
        w->length += n;
        bytes += n;
        length -= n;
    }
}

static void put(writer *w, cm_message *m)
{
    put_bytes(w, m->text, m->length);
    m->length = 0;
}

/* Adds up the live samples per stack into the stacks' scratch fields; holds prof_lock. */
static void sum_live_locked(double *count, double *bytes)
{
    *count = *bytes = 0;
    for (size_t i = 0; i < STACK_SLOTS; i++) {
        stacks[i].live_count = stacks[i].live_bytes = 0;
        stacks[i].samples_live = 0;
    }
    for (size_t i = 0; i < SAMPLE_SLOTS; i++) {
        const sample *x = &samples[i];
        if (x->address == 0)
            continue;
        stack_entry *entry = &stacks[x->stack - 1];
        entry->live_count += x->weight;
        entry->live_bytes += x->weight * (double)x->size;
        entry->samples_live++;
        *count += x->weight;
        *bytes += x->weight * (double)x->size;
    }
}

static uint64_t rounded(double x)
{
    return (uint64_t)(x + 0.5);
}

/* "<count>: <bytes> [<count>: <bytes>]", pprof's pair of in-use and allocated totals. */
static void put_counts(cm_message *m, double live_count, double live_bytes, double count,
                       double bytes)
{
    cm_message_uint(m, rounded(live_count));
    cm_message_str(m, ": ");
    cm_message_uint(m, rounded(live_bytes));
    cm_message_str(m, " [");
    cm_message_uint(m, rounded(count));
    cm_message_str(m, ": ");
    cm_message_uint(m, rounded(bytes));
    cm_message_str(m, "]");
}

static int write_profile(int fd)
{
    writer w = {.fd = fd, .failed = false, .length = 0};
    cm_message m = {.length = 0};
    double live_count, live_bytes, count = 0, bytes = 0;
    cm_lock_acquire(&prof_lock);
    sum_live_locked(&live_count, &live_bytes);
    for (size_t i = 0; i < STACK_SLOTS; i++) {
        count += stacks[i].alloc_count;
        bytes += stacks[i].alloc_bytes;
    }
    cm_message_str(&m, "heap profile: ");
    put_counts(&m, live_count, live_bytes, count, bytes);
    cm_message_str(&m, " @ heapprofile\n");
    put(&w, &m);
    for (size_t i = 0; i < STACK_SLOTS; i++) {
        const stack_entry *entry = &stacks[i];
        if (entry->hash == 0 || entry->alloc_count == 0)
            continue;
        put_counts(&m, entry->live_count, entry->live_bytes, entry->alloc_count,
                   entry->alloc_bytes);
        cm_message_str(&m, " @");
        for (unsigned f = 0; f < entry->depth; f++) {
            cm_message_str(&m, " ");
            cm_message_hex(&m, entry->frames[f]);
            if (m.length > sizeof m.text - 24)
                put(&w, &m);
        }
        cm_message_str(&m, "\n");
        put(&w, &m);
    }
    cm_lock_release(&prof_lock);
    /* The mappings let pprof find each address's object file and symbolise it. */
    cm_message_str(&m, "\nMAPPED_LIBRARIES:\n");
    put(&w, &m);
    int maps = cm_os_open("/proc/self/maps", false);
    if (maps >= 0) {
        char chunk[1024];
        size_t n;
        while ((n = cm_os_read(maps, chunk, sizeof chunk)) > 0)
            put_bytes(&w, chunk, n);
        cm_os_close(maps);
    }
    w.failed |= !cm_os_write(fd, w.buffer, w.length);
    return w.failed ? -1 : 0;
}

CM_EXPORT int cmalloc_prof_dump(const char *path)
{
    if (!prof_on) {
        errno = EINVAL; /* nothing sampled: CMALLOC_PROF is off */
        return -1;
    }
    /* Not a cancellation point (open and read are, and prof_lock is held across them): a
     * thread cancelled in the middle would leave the lock held for good. */
    int cancel_state = cm_os_cancel_off(), result = -1;
    int fd = cm_os_open(path, true);
    if (fd >= 0) {
        thread_sampler.busy++;
        result = write_profile(fd);
        thread_sampler.busy--;
        if (!cm_os_close(fd))
            result = -1;
        if (result != 0)
            errno = EIO; /* the file is incomplete */
    }
    cm_os_cancel_restore(cancel_state);
    return result;
}

/* ---- the at-exit profile's file ----------------------------------------------------------
 * Every process of a command inherits CMALLOC_PROF_DUMP (a wrapper such as timeout, a shell,
 * make, the program, its children), so no process's exit may destroy another's profile:
 *   %p and %e in it stand for the process id and the program's name (its executable's base
 *   name), %% for a %;
 *   without %p, the first process to start claims the name: a write lock on CLAIM_BYTE (far
 *   past the end), held until it exits (close-on-exec: a program it execs no longer holds it).
 *   The claimer empties the file, dropping an earlier run's profile. At exit a process writes
 *   the name, unless the file already holds a profile with samples (another process's, since
 *   the claim): then it writes <name>.<pid> and says so on stderr. The look and the write hold
 *   the lock on CLAIM_BYTE + 1, so two processes exiting together cannot both take the name.
 * A process that starts after the claimer has exited claims the name again (and empties it).
 * Plain system calls on a descriptor of its own: nothing allocates. */
#define CLAIM_BYTE ((off_t)1 << 40)
static int claim_fd = -1; /* the claimed file, or -1 */
/* The file the exit's profile went to (empty until then), or that it could not be written, for
 * the leak report and the stats report, which run after it (CM_EXIT_PROFILE). */
static cm_message exit_profile;
static bool exit_profile_failed;

/* The template with %p and %e replaced; false when it does not fit. *per_process: %p was used. */
static bool expand_dump_path(cm_message *name, const char *template, bool *per_process)
{
    name->length = 0;
    *per_process = false;
    for (const char *c = template; *c != '\0'; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            cm_message_uint(name, (uint64_t)cm_os_process_id());
            *per_process = true;
            c++;
        } else if (c[0] == '%' && c[1] == 'e') {
            char exe[512];
            int saved = errno;
            ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
            errno = saved;
            exe[n > 0 ? n : 0] = '\0';
            const char *base = strrchr(exe, '/');
            cm_message_str(name, base != NULL ? base + 1 : n > 0 ? exe : "unknown");
            c++;
        } else {
            if (c[0] == '%' && c[1] == '%')
                c++;
            char one[2] = {c[0], '\0'};
            cm_message_str(name, one);
        }
    }
    if (name->length >= sizeof name->text - 16) /* room for ".<pid>" and the NUL */
        return false;
    name->text[name->length] = '\0';
    return true;
}

static bool lock_byte(int fd, off_t offset, bool wait)
{
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = offset, .l_len = 1};
    int result;
    do
        result = fcntl(fd, wait ? F_SETLKW : F_SETLK, &lock);
    while (result != 0 && wait && errno == EINTR);
    return result == 0;
}

/* Reads a decimal number at *text, advancing past it. */
static uint64_t read_number(const char **text)
{
    uint64_t value = 0;
    for (; **text >= '0' && **text <= '9'; (*text)++)
        value = value * 10 + (uint64_t)(**text - '0');
    return value;
}

/* Whether the file holds a profile with samples: "heap profile: <live>: <bytes> [<count>: ..." */
static bool file_holds_samples(int fd)
{
    char head[96];
    ssize_t n = pread(fd, head, sizeof head - 1, 0);
    if (n <= 0)
        return false;
    head[n] = '\0';
    const char *text = head;
    if (strncmp(text, "heap profile: ", 14) != 0)
        return n > 0; /* not a profile of ours: someone's file, not to be destroyed either */
    text += 14;
    uint64_t live = read_number(&text);
    while (*text == ':' || *text == ' ')
        text++;
    read_number(&text);
    while (*text == ' ' || *text == '[')
        text++;
    return live > 0 || read_number(&text) > 0;
}

/* From the constructor: the first process of a command to start claims the name (above). */
static void claim_dump_path(void)
{
    cm_message name;
    bool per_process;
    if (cm_option.prof_dump == NULL ||
        !expand_dump_path(&name, cm_option.prof_dump, &per_process) || per_process)
        return;
    int saved = errno;
    int fd = open(name.text, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && lock_byte(fd, CLAIM_BYTE, false) && ftruncate(fd, 0) == 0)
        claim_fd = fd;
    else if (fd >= 0)
        close(fd); /* this process holds no lock on it: closing drops none */
    errno = saved;
}

static void say_dump_failed(const char *path)
{
    const char *reason = strerrorname_np(errno); /* a constant string: nothing allocated */
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: could not write the heap profile to ");
    cm_message_str(&m, path);
    cm_message_str(&m, " (");
    cm_message_str(&m, reason != NULL ? reason : "error");
    cm_message_str(&m, ")\n");
    cm_message_write(&m, 2);
}

/* Writes the profile to path; a failure is said on stderr, once (each dump is one file). */
static bool dump_or_say(const char *path)
{
    if (cmalloc_prof_dump(path) == 0)
        return true;
    say_dump_failed(path);
    return false;
}

/* The profile at exit, to CMALLOC_PROF_DUMP's file for this process (above); true when written. */
static bool write_exit_profile(cm_message *name)
{
    bool per_process;
    if (!expand_dump_path(name, cm_option.prof_dump, &per_process)) {
        errno = ENAMETOOLONG;
        say_dump_failed(cm_option.prof_dump);
        return false;
    }
    int fd = per_process ? -1 : open(name->text, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) /* %p, or the name cannot be opened (the failure is said) */
        return dump_or_say(name->text);
    lock_byte(fd, CLAIM_BYTE + 1, true);
    if (!file_holds_samples(fd)) {
        bool written = ftruncate(fd, 0) == 0 && write_profile(fd) == 0;
        if (close(fd) != 0 || !written) { /* closing drops this process's locks on it */
            errno = EIO;
            say_dump_failed(name->text);
            return false;
        }
        return true;
    }
    cm_message taken = *name;
    cm_message_str(name, ".");
    cm_message_uint(name, (uint64_t)cm_os_process_id());
    name->text[name->length] = '\0';
    bool written = dump_or_say(name->text);
    if (written) {
        cm_message m = {.length = 0};
        cm_message_str(&m, "cmalloc: heap profile written to ");
        cm_message_str(&m, name->text);
        cm_message_str(&m, " (");
        cm_message_str(&m, taken.text);
        cm_message_str(&m, " holds another process's profile)\n");
        cm_message_write(&m, 2);
    }
    close(fd);
    return written;
}

static void on_dump_signal(int signal_number)
{
    (void)signal_number;
    dump_requested = 1;
}

/* <CMALLOC_PROF_DUMP (expanded) or "cmalloc">.<pid>.<sequence>.heap, written by the first sampling
 * slow path after the signal. */
static void dump_on_signal(void)
{
    if (!__atomic_exchange_n(&dump_requested, 0, __ATOMIC_ACQ_REL))
        return;
    cm_message name;
    bool per_process;
    int saved = errno; /* inside malloc: errno comes out as it went in */
    if (!expand_dump_path(&name, cm_option.prof_dump ? cm_option.prof_dump : "cmalloc",
                          &per_process))
        return;
    cm_message_str(&name, ".");
    cm_message_uint(&name, (uint64_t)cm_os_process_id());
    cm_message_str(&name, ".");
    cm_message_uint(&name, __atomic_fetch_add(&dump_sequence, 1, __ATOMIC_RELAXED));
    cm_message_str(&name, ".heap");
    if (name.length >= sizeof name.text)
        return;
    name.text[name.length] = '\0';
    dump_or_say(name.text);
    errno = saved;
}

/* A decimal number of at most 4 digits at *text, advanced past it; -1 when there is none. */
static int small_number(const char **text)
{
    int number = -1;
    for (int digits = 0; **text >= '0' && **text <= '9' && digits < 4; digits++, (*text)++)
        number = (number < 0 ? 0 : number * 10) + (**text - '0');
    return number;
}

/* A signal by name, with or without SIG (USR2, SIGINT, SIGRTMIN+3, RTMAX-1), or by number; 0
 * when the text names none. The names are the C library's (sigabbrev_np: every signal it knows,
 * no table of ours to fall behind). */
static int signal_number(const char *text)
{
    if (strncmp(text, "SIG", 3) == 0)
        text += 3;
    for (int number = 1; number < SIGRTMIN; number++) {
        const char *name = sigabbrev_np(number);
        if (name != NULL && strcmp(text, name) == 0)
            return number;
    }
    int base = strncmp(text, "RTMIN", 5) == 0   ? SIGRTMIN
               : strncmp(text, "RTMAX", 5) == 0 ? SIGRTMAX
                                                : 0;
    if (base != 0) {
        text += 5;
        int sign = *text == '+' ? 1 : *text == '-' ? -1 : 0;
        int offset = 0;
        if (sign != 0) {
            text++;
            offset = small_number(&text);
        }
        int number = base + sign * offset;
        return *text == '\0' && offset >= 0 && number >= SIGRTMIN && number <= SIGRTMAX ? number
                                                                                        : 0;
    }
    int number = small_number(&text);
    return *text == '\0' && number > 0 && number <= SIGRTMAX ? number : 0;
}

/* Installs the dump signal's handler, or says in one line why it cannot: the text names no
 * signal, the signal cannot be caught (SIGKILL, SIGSTOP), it reports faults (a handler that
 * only sets a flag and returns would make the faulting access repeat forever), or the system
 * refused (the C library keeps a few numbers below SIGRTMIN for itself). */
static void install_dump_signal(void)
{
    int number = signal_number(cm_option.prof_signal);
    const char *why = NULL;
    if (number == 0)
        why = "not a signal name or number on this system";
    else if (number == SIGKILL || number == SIGSTOP)
        why = "this signal cannot be caught";
    else if (number == SIGSEGV || number == SIGBUS || number == SIGFPE || number == SIGILL ||
             number == SIGTRAP)
        why = "this signal reports faults: a handler that returns would make them repeat";
    else {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = on_dump_signal;
        action.sa_flags = SA_RESTART;
        sigemptyset(&action.sa_mask);
        int saved = errno;
        if (sigaction(number, &action, NULL) != 0)
            why = "the system refused a handler for it: the C library keeps it";
        errno = saved;
    }
    if (why != NULL) {
        cm_message m = {.length = 0};
        cm_message_str(&m, "cmalloc: warning: ignoring CMALLOC_PROF_SIGNAL=");
        cm_message_str(&m, cm_option.prof_signal);
        cm_message_str(&m, " (");
        cm_message_str(&m, why);
        cm_message_str(&m, ")\n");
        cm_message_write(&m, 2);
        cm_option.prof_signal = NULL; /* not in force: CMALLOC_VERBOSE and the stats list none */
    }
}

/* The leak report: live samples grouped by stack, largest estimated bytes first. What it shows
 * is copied under prof_lock and the frames are named after its release: naming asks the loader
 * (dladdr, dl_iterate_phdr), whose lock a thread inside dlopen may hold while its sampled
 * allocation waits for prof_lock. Stack entries never change once made, so an id is enough. */
static void report_leaks(int fd)
{
    struct {
        uint32_t stack, samples;
        double count, bytes;
    } shown[LEAK_STACKS_SHOWN];
    unsigned shown_count = 0;
    cm_message m = {.length = 0};
    double live_count, live_bytes;
    cm_lock_acquire(&prof_lock);
    sum_live_locked(&live_count, &live_bytes);
    size_t live_samples = sample_count, live_stacks = 0;
    for (size_t i = 0; i < STACK_SLOTS; i++)
        live_stacks += stacks[i].samples_live != 0;
    for (; shown_count < LEAK_STACKS_SHOWN; shown_count++) {
        stack_entry *largest = NULL;
        for (size_t i = 0; i < STACK_SLOTS; i++)
            if (stacks[i].samples_live != 0 &&
                (largest == NULL || stacks[i].live_bytes > largest->live_bytes))
                largest = &stacks[i];
        if (largest == NULL)
            break;
        shown[shown_count].stack = (uint32_t)(largest - stacks) + 1;
        shown[shown_count].samples = largest->samples_live;
        shown[shown_count].count = largest->live_count;
        shown[shown_count].bytes = largest->live_bytes;
        largest->samples_live = 0;
    }
    cm_lock_release(&prof_lock);
    cm_message_str(&m, "cmalloc: leak report: about ");
    cm_message_uint(&m, rounded(live_bytes));
    cm_message_str(&m, " bytes in ");
    cm_message_uint(&m, rounded(live_count));
    cm_message_str(&m, " allocations still live at exit, from ");
    cm_message_uint(&m, live_stacks);
    cm_message_str(&m, " stacks (estimated from ");
    cm_message_uint(&m, live_samples);
    cm_message_str(&m, " samples, one per ");
    cm_message_uint(&m, cm_option.prof_rate);
    cm_message_str(&m, " bytes on average)\n");
    if (exit_profile.length != 0) {
        cm_message_str(&m, "  the heap profile at exit was written to ");
        cm_message_str(&m, exit_profile.text);
        cm_message_str(&m, "\n");
    }
    cm_message_write(&m, fd);
    for (unsigned i = 0; i < shown_count; i++) {
        cm_message_str(&m, "  about ");
        cm_message_uint(&m, rounded(shown[i].bytes));
        cm_message_str(&m, " bytes in ");
        cm_message_uint(&m, rounded(shown[i].count));
        cm_message_str(&m, " allocations (");
        cm_message_uint(&m, shown[i].samples);
        cm_message_str(&m, " samples) allocated at:\n");
        cm_message_write(&m, fd);
        cm_prof_stack_print(shown[i].stack, fd);
    }
}

/* Freed sample pages in the stash: LARGE spans to the page heap, free to the program. */
size_t cm_prof_stashed_pages(void)
{
    return __atomic_load_n(&stashed, __ATOMIC_RELAXED);
}

/* Gives the stashed pages back to the page heap (cmalloc_release). */
void cm_prof_release_stash(void)
{
    void *pages[PAGE_STASH];
    cm_lock_acquire(&prof_lock);
    unsigned count = stashed;
    for (unsigned i = 0; i < count; i++)
        pages[i] = (void *)stash_page_locked(i);
    __atomic_store_n(&stashed, 0, __ATOMIC_RELAXED);
    cm_lock_release(&prof_lock);
    for (unsigned i = 0; i < count; i++)
        cm_free_unchecked(pages[i], "cmalloc_release");
}

void cm_prof_stats_print(int fd)
{
    cm_message m = {.length = 0};
    if (prof_on) {
        cm_lock_acquire(&prof_lock);
        cm_message_str(&m, "  profiler:          ");
        cm_message_uint(&m, table_bytes);
        cm_message_str(&m, " bytes (fixed; in metadata): ");
        cm_message_uint(&m, sample_count);
        cm_message_str(&m, " live samples of at most ");
        cm_message_uint(&m, SAMPLE_MAX);
        cm_message_str(&m, ", ");
        cm_message_uint(&m, samples_dropped);
        cm_message_str(&m, " dropped, ");
        cm_message_uint(&m, stack_count);
        cm_message_str(&m, " stacks, ");
        cm_message_uint(&m, stashed);
        cm_message_str(&m, " freed sample pages kept, unwound by ");
        cm_message_str(&m, fast_backtrace ? "libunwind\n" : "libgcc\n");
        cm_lock_release(&prof_lock);
        if (exit_profile.length != 0) {
            cm_message_str(&m, "  heap profile:      written at exit to ");
            cm_message_str(&m, exit_profile.text);
            cm_message_str(&m, "\n");
        } else if (exit_profile_failed) {
            cm_message_str(&m, "  heap profile:      not written at exit (stderr says why)\n");
        }
        cm_message_write(&m, fd);
    }
    if (guard_on) {
        size_t live, bytes = cm_guard_bytes(&live);
        cm_message_str(&m, "  guarded:           ");
        cm_message_uint(&m, live);
        cm_message_str(&m, " live, ");
        cm_message_uint(&m, bytes);
        cm_message_str(&m, " bytes resident at most, of ");
        cm_message_uint(&m, cm_option.guard_slots);
        cm_message_str(&m, " slots; ");
        cm_message_uint(&m, __atomic_load_n(&guards_chosen, __ATOMIC_RELAXED));
        size_t run;
        uint64_t openings = cm_guard_openings(&run);
        cm_message_str(&m, " allocations chosen; ");
        cm_message_uint(&m, openings);
        cm_message_str(&m, " openings of ");
        cm_message_uint(&m, run);
        cm_message_str(&m, run > 1 ? " slots (kernel guard markers)\n" : " slot\n");
        cm_message_write(&m, fd);
    }
}

/* ---- set-up, fork, exit ------------------------------------------------------------------- */
static bool tables_init(void)
{
    if (stacks != NULL)
        return true;
    size_t bytes = STACK_SLOTS * sizeof(stack_entry) + SAMPLE_SLOTS * sizeof(sample);
    char *memory = cm_metadata_alloc(bytes); /* zeroed */
    if (memory == NULL)
        return false;
    stacks = (stack_entry *)memory;
    samples = (sample *)(memory + STACK_SLOTS * sizeof(stack_entry));
    stack_count = 1; /* stack 1: the shared one, no frames */
    stacks[0].hash = 1;
    table_bytes = bytes;
    dl_iterate_phdr(find_own_text, NULL);
    return true;
}

/* Whether the program is statically linked: it names no program interpreter. getauxval reads
 * what the kernel handed over, set up before libc's first allocation. */
static bool program_is_static(void)
{
    const ElfW(Phdr) *headers = (const ElfW(Phdr) *)getauxval(AT_PHDR);
    size_t count = getauxval(AT_PHNUM);
    for (size_t i = 0; headers != NULL && i < count; i++)
        if (headers[i].p_type == PT_INTERP)
            return false;
    return true;
}

static uint32_t capture_for_check(uintptr_t boundary)
{
    return capture_stack(boundary, true);
}

/* Writes the stack of the running call above the frame of boundary, a return address inside
 * cmalloc (the call that found an error), unwound now and not kept. */
static void print_caller_stack(uintptr_t boundary, int fd)
{
    int saved = errno;
    unwind_state state = {.depth = 0, .boundary = boundary, .kept = 0, .boundary_ours = 1};
    _Unwind_Backtrace(unwind_step, &state);
    if (!state.kept) { /* not found: everything but the leading frames of libcmalloc.so */
        state = (unwind_state){.depth = 0, .boundary = 0, .kept = 1, .boundary_ours = 0};
        _Unwind_Backtrace(unwind_step, &state);
    }
    errno = saved;
    print_frames(state.frames, state.depth, false, fd);
}

/* The debug mode's allocations record their stack, its reports print stacks. */
static void start_check_stacks(void)
{
    cm_check_init(capture_for_check, cm_prof_stack_print, print_caller_stack);
}

static void start_sampling(void)
{
    cm_sampling = prof_on || guard_on;
    if (cm_sampling)
        cm_fast_path_classes = &no_class;
}

/* Called by cm_init with the options read, before any allocation is served. */
void cm_prof_init(void)
{
    if (cm_option.check) {
        /* The debug mode wraps every block itself: no sampling beside it. Its reports carry
         * stacks from the table (in a static program from the constructor on, as sampling). */
        if (tables_init() && !program_is_static())
            start_check_stacks();
        return;
    }
    if (cm_option.prof_dump != NULL && cm_option.prof_dump[0] == '\0') {
        cm_message m = {.length = 0};
        cm_message_str(&m, "cmalloc: warning: ignoring CMALLOC_PROF_DUMP= (empty: it names no "
                           "file to write the profile to)\n");
        cm_message_write(&m, 2);
        cm_option.prof_dump = NULL;
    }
    if (cm_option.prof_leaks || cm_option.prof_dump || cm_option.prof_signal)
        cm_option.prof = 1;
    prof_mean = (double)cm_option.prof_rate; /* at least 1: options.c keeps the range */
    if (cm_option.guard_rate > 1) /* about GUARD_UNIT * rate bytes */
        guard_mean = GUARD_UNIT / (log_of(cm_option.guard_rate) - log_of(cm_option.guard_rate - 1));
    prof_on = cm_option.prof && tables_init();
    guard_on = cm_option.guard_rate && tables_init() &&
               cm_guard_init(cm_prof_stack_print, print_access_stack);
    for (unsigned c = 1; c < cm_class_count; c++) {
        uint32_t size = cm_classes[c].size;
        bool guardable = guard_on && size <= CM_GUARD_MAX_SIZE;
        if (guardable)
            guard_keep[c] = guard_mean == 0 ? 1
                                            : 1 / (double)cm_option.guard_rate /
                                                  (1 - exp_negative(size / guard_mean));
        if (prof_on)
            prof_weight[c] = weight_of(size);
        cm_sample_charge[c] = prof_on || guardable ? size : 0;
    }
    if (prof_on && cm_option.prof_signal)
        install_dump_signal();
    /* A static program's libc makes its first allocations before it can unwind (libgcc's
     * unwinder aborts there: no frame tables yet), so there sampling starts in the library's
     * constructor (cm_prof_start), once libc is set up. */
    if (!program_is_static())
        start_sampling();
}

/* From the library's constructor. Loads libunwind (Debian's libunwind8) for the profiler and the
 * guard, when either is on and the library is there; else stacks come from libgcc. Only here:
 * dlopen allocates and takes the loader's lock, which an allocation may already hold. RTLD_LOCAL
 * keeps its _Unwind_Backtrace and backtrace from interposing on the program's. A static program
 * loads nothing (libunwind's TLS cannot be set up by a static program's dlopen: it crashed in
 * __tls_get_addr) and starts sampling here. */
void cm_prof_start(void)
{
    bool check_stacks = cm_option.check && stacks != NULL;
    if (check_stacks && program_is_static())
        start_check_stacks();
    if (!prof_on && !guard_on && !check_stacks)
        return;
    if (prof_on)
        claim_dump_path();
    if (program_is_static()) {
        start_sampling();
        return;
    }
    thread_sampler.busy++;
    int saved_errno = errno;
    void *library = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    if (library != NULL)
        *(void **)&fast_backtrace = dlsym(library, "unw_backtrace");
    dlerror(); /* a failure here must not show in the program's next dlerror() */
    errno = saved_errno;
    thread_sampler.busy--;
}

/* In the child: a page stashed by a free that had not returned at the fork is the program's
 * block there (the thread that freed it is gone, the free never happened), a live LARGE span
 * its free will give back. */
static void drop_unfinished_stash(void)
{
    unsigned kept = 0;
    for (unsigned i = 0; i < stashed; i++)
        if (!(page_stash[i] & STASH_UNFINISHED))
            page_stash[kept++] = page_stash[i];
    stashed = kept;
}

void cm_prof_fork(int phase)
{
    /* libunwind guards its shared caches with a lock of its own, which another thread of the
     * parent may have held at the fork: a child of a threaded parent unwinds with libgcc (its
     * lookups take no lock: _dl_find_object) rather than risk waiting on it forever. */
    if (phase == CM_FORK_CHILD)
        fast_backtrace = NULL;
    cm_lock_fork(&prof_lock, phase);
    if (phase == CM_FORK_CHILD)
        drop_unfinished_stash();
    cm_guard_fork(phase);
}

__attribute__((destructor(CM_EXIT_PROFILE))) static void prof_at_exit(void)
{
    if (!prof_on)
        return;
    thread_sampler.busy++;
    cm_message name;
    if (cm_option.prof_dump && write_exit_profile(&name))
        exit_profile = name;
    else
        exit_profile_failed = cm_option.prof_dump != NULL;
    if (claim_fd >= 0)
        close(claim_fd); /* the claim ends with the profile written */
    if (cm_option.prof_leaks)
        report_leaks(2);
    thread_sampler.busy--;
}
