/* guard.c - guarded allocations (CMALLOC_GUARD_RATE=N): on average one small allocation in N
 * gets a page of its own, ending against an inaccessible guard page, so that an overflow past
 * its end faults at once; when it is freed its page is made inaccessible and stays so while the
 * rest of the pool is cycled through, so that a use after free faults too. prof.c decides which
 * allocations (the slow-path countdown) and hands over their allocation and free stacks.
 *
 *   pool: reserved once, inaccessible (PAGE = 4 KiB); each data page is a mapping of its own
 *   (cm_os_separate), so that changing its protection never splits or merges mappings
 *   | guard | slot 0 data | guard | slot 1 data | guard | ... | slot n-1 data | guard |
 *                  [....object]^ the object ends at its page's end (its start rounded down to
 *                               16 bytes, as malloc promises), so its next byte is the guard
 *
 * Owns: the pool, the slot array (metadata, never malloc), the cursor, the SIGSEGV handler.
 * Slots are handed out in ring (address) order from the cursor, skipping live ones: a freed
 * slot is used again only once the cursor has gone round the pool, so it stays inaccessible for
 * about as many guarded allocations as there are slots not live. When every slot is live the
 * allocation is served normally: CMALLOC_GUARD_SLOTS bounds the memory (one resident page per
 * slot used) and the slot array.
 *
 * System calls per guarded block: one mprotect to close its page on free, and a share of one
 * to open it. Where the kernel has guard markers (MADV_GUARD_INSTALL, Linux 6.13), every guard
 * page gets one at init; a marked page faults whatever its protection, so when the cursor
 * reaches a closed slot, the next OPEN_RUN slots are opened together by one mprotect over them
 * and the guard pages between (live slots in the run are open already: harmless). Without
 * markers (an older kernel, or CMALLOC_GUARD_MARKERS=0) such a call would open the guards
 * too, so each slot is opened alone. The price of a run: a freed slot in it is accessible from
 * the opening until it is used again, up to OPEN_RUN - 1 guarded allocations, so a use after
 * free in that window goes unseen. Runs are opened at the cursor when it gets there (as late as
 * possible), and the slots ahead of the cursor were handed out a whole pass ago, so for most
 * of them a run trims the end of a long closed time.
 * Invariants: a slot's open flag says whether its data page is accessible: always for a live
 * slot; for a freed or never-used slot only once a run opened it ahead of the cursor. A free
 * closes the page before the slot can be handed out again, and the slot is not handed out
 * while its freeing flag is set (from the free's marking to just after its unlock; a child
 * forked in between revives the slot, cm_guard_fork).
 *
 * Faults: a SIGSEGV handler installed at init looks the faulting address up. Inside the pool it
 * prints (write(2), prof.c's printers; nothing allocates) the address, overflow or use after
 * free, the block's address and size, the stack of the faulting access (unwound from the
 * signal's context), and the block's allocation and free stacks, then passes the signal on: to
 * the handler the program installed before cmalloc, or by restoring the default action and
 * returning, so that the access faults again and the process dies as it would have. A handler
 * the program installs later replaces this one (its choice). Faults elsewhere pass on untouched,
 * and a SIGSEGV that was sent (kill, raise: it does not repeat) is raised again with the
 * default action, so the process dies of it as it would without cmalloc.
 * Lock: guard_lock guards the slots, the cursor and the count of openings, with mprotect done
 * under it so a slot is never handed out before its page is open, nor again before it is
 * closed; taken alone. The fault handler reads the slots without it: the faulting thread may
 * hold it.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <signal.h>
#include <string.h>

#define PAGE ((size_t)4096) /* the kernel's page: the unit of protection */
/* Slots opened by one mprotect where guard markers allow. The kernel's work per data page (a
 * mapping each) stays, so the cost per slot stops falling at about 16: 0.45 us against 0.9-1.1
 * alone, no lower with 64 (build/bench/guard_calls separate 16 1, separate 1 1). A freed slot
 * opened ahead of its reuse goes unseen for at most 15 guarded allocations, short next to the
 * pass of the pool (256 slots by default) it was closed for before. */
#define OPEN_RUN  16

enum { SLOT_NEVER = 0, SLOT_LIVE, SLOT_FREED };

typedef struct guard_slot {
    uint32_t state;       /* SLOT_* */
    uint32_t size;        /* bytes requested (live or freed) */
    uint32_t alloc_stack; /* prof.c stack ids, 0: none */
    uint32_t free_stack;
    bool open;    /* its data page is accessible */
    bool freeing; /* FREED by a free that has not returned yet (__atomic builtins) */
} guard_slot;

static cm_lock guard_lock = CM_LOCK_INIT;
static uintptr_t pool_start; /* the first guard page */
static size_t pool_bytes;    /* (2 * slot_count + 1) * PAGE */
static guard_slot *slots;
static uint32_t slot_count, live_count, cursor; /* cursor: the next slot to look at */
static uint32_t open_run = 1;                   /* slots per opening: OPEN_RUN with markers */
static uint64_t openings;                       /* mprotect calls that opened slots */
static uint32_t freeing_count;                  /* slots with freeing set (__atomic builtins) */
static cm_latest_free latest_frees[CM_LATEST_FREES]; /* each thread's latest free */
static struct sigaction previous_action;
static volatile sig_atomic_t fault_reported;

static size_t rounded_size(size_t size)
{
    return size == 0 ? 16 : (size + 15) & ~(size_t)15;
}

static char *slot_page(uint32_t slot)
{
    return (char *)(pool_start + (2 * (size_t)slot + 1) * PAGE);
}

static uintptr_t slot_object(uint32_t slot)
{
    return (uintptr_t)slot_page(slot) + PAGE - rounded_size(slots[slot].size);
}

bool cm_guard_owns(const void *p)
{
    return (uintptr_t)p - pool_start < pool_bytes;
}

/* Opens the run of slots from first (up to open_run, not past the pool's end) with one call;
 * false when the kernel refused (out of memory for page tables). */
static bool open_slots(uint32_t first)
{
    uint32_t end = first + open_run < slot_count ? first + open_run : slot_count;
    if (!cm_os_protect(slot_page(first), (size_t)(slot_page(end - 1) - slot_page(first)) + PAGE,
                       true))
        return false;
    openings++;
    for (uint32_t slot = first; slot < end; slot++)
        slots[slot].open = true;
    return true;
}

void *cm_guard_alloc(size_t size, uint32_t stack)
{
    if (size > CM_GUARD_MAX_SIZE)
        return NULL;
    void *p = NULL;
    cm_lock_acquire(&guard_lock);
    /* Slots still being freed are skipped like live ones, so the look is bounded: when every
     * slot is either, the allocation is served normally (at once when all are live). */
    uint32_t looked = live_count < slot_count ? 0 : slot_count;
    while (looked < slot_count && (slots[cursor].state == SLOT_LIVE ||
                                   __atomic_load_n(&slots[cursor].freeing, __ATOMIC_ACQUIRE))) {
        cursor = cursor + 1 < slot_count ? cursor + 1 : 0;
        looked++;
    }
    if (looked < slot_count) {
        uint32_t slot = cursor;
        /* A reused page keeps the old block's bytes, as any malloc'ed memory may (calloc
         * clears). When the kernel refuses to open it, the allocation is served normally. */
        if (slots[slot].open || open_slots(slot)) {
            slots[slot] = (guard_slot){
                .state = SLOT_LIVE, .size = (uint32_t)size, .alloc_stack = stack, .open = true};
            live_count++;
            cursor = slot + 1 < slot_count ? slot + 1 : 0;
            p = (void *)slot_object(slot);
        }
    }
    cm_lock_release(&guard_lock);
    return p;
}

/* The slot whose data page holds p, or slot_count for a guard page. */
static uint32_t slot_of(uintptr_t address)
{
    size_t page = (address - pool_start) / PAGE;
    return page % 2 == 1 ? (uint32_t)(page / 2) : slot_count;
}

static CM_COLD void report_bad_free(const char *caller, const void *p)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: ");
    cm_message_str(&m, caller);
    cm_message_str(&m, "(): invalid pointer ");
    cm_message_hex(&m, (uintptr_t)p);
    cm_message_str(&m, " (inside cmalloc's guarded pages, not a block's start)");
    cm_report_finish(&m);
}

void cm_guard_free(void *p, const char *caller, uint32_t stack)
{
    uint32_t slot = slot_of((uintptr_t)p);
    cm_lock_acquire(&guard_lock);
    if (slot == slot_count || slots[slot].state == SLOT_NEVER ||
        (uintptr_t)p != slot_object(slot)) {
        cm_lock_release(&guard_lock);
        report_bad_free(caller, p);
        return;
    }
    if (slots[slot].state == SLOT_FREED) {
        bool first_in_child = cm_latest_free_take(latest_frees, p);
        cm_lock_release(&guard_lock);
        if (!first_in_child)
            cm_report_double_free(caller, p);
        return;
    }
    /* Closed, not released: one system call per free, and the page (one of at most
     * CMALLOC_GUARD_SLOTS) is still there, without a fault, when the slot is used again. */
    slots[slot].open = !cm_os_protect(slot_page(slot), PAGE, false);
    slots[slot].state = SLOT_FREED;
    slots[slot].free_stack = stack;
    live_count--;
    cm_latest_free_note(latest_frees, p);
    /* Freed for good only once the lock is released: a fork whose prepare handler waited on
     * it may run before this thread returns, and its child, where the program (glibc's TLS
     * tables, say) still holds p, gets the block back live (cm_guard_fork). */
    slots[slot].freeing = true;
    __atomic_add_fetch(&freeing_count, 1, __ATOMIC_RELAXED);
    cm_lock_release(&guard_lock);
    /* An exchange: a child forked from a signal handler that interrupted this thread here
     * has revived the slot already, and the free resumed there must not count it again. */
    if (__atomic_exchange_n(&slots[slot].freeing, false, __ATOMIC_RELEASE))
        __atomic_sub_fetch(&freeing_count, 1, __ATOMIC_RELAXED);
}

/* The usable size of a live guarded block (its rounded size: all of it is before the guard);
 * anything else is reported as free would report it, and has size 0. */
size_t cm_guard_usable_size(const void *p, const char *caller)
{
    uint32_t slot = slot_of((uintptr_t)p);
    cm_lock_acquire(&guard_lock);
    bool start =
        slot < slot_count && slots[slot].state != SLOT_NEVER && (uintptr_t)p == slot_object(slot);
    uint32_t state = start ? slots[slot].state : SLOT_NEVER;
    size_t size = state == SLOT_LIVE ? rounded_size(slots[slot].size) : 0;
    cm_lock_release(&guard_lock);
    if (state == SLOT_FREED)
        cm_report_double_free(caller, p);
    else if (state == SLOT_NEVER)
        report_bad_free(caller, p);
    return size;
}

size_t cm_guard_bytes(size_t *live)
{
    cm_lock_acquire(&guard_lock);
    *live = live_count;
    size_t bytes = (size_t)slot_count * PAGE;
    cm_lock_release(&guard_lock);
    return bytes;
}

/* Openings so far (mprotect calls that opened slots), and how many slots each opens. */
uint64_t cm_guard_openings(size_t *slots_per_opening)
{
    cm_lock_acquire(&guard_lock);
    uint64_t count = openings;
    *slots_per_opening = open_run;
    cm_lock_release(&guard_lock);
    return count;
}

/* ---- the fault report ------------------------------------------------------------------- */
/* The stacks are prof.c's (the profiler interns them; guard.c keeps their ids): prof.c hands
 * its printer over at init, so guard.c, beneath the profiler, never calls up into it. */
static cm_stack_printer stack_printer;
static cm_context_printer access_printer;

/* The access first (where the program went wrong), then where the block came from. */
static void report_stacks(const guard_slot *slot, const void *context)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "  the access, at:\n");
    cm_message_write(&m, 2);
    access_printer(context, 2);
    cm_message_str(&m, "  allocated at:\n");
    cm_message_write(&m, 2);
    stack_printer(slot->alloc_stack, 2);
    if (slot->state == SLOT_FREED) {
        cm_message_str(&m, "  freed at:\n");
        cm_message_write(&m, 2);
        stack_printer(slot->free_stack, 2);
    }
}

/* What the access at address hit: the block before a guard page (overflow), a freed block
 * (use after free), or nothing cmalloc handed out. */
static void report_fault(uintptr_t address, const void *context)
{
    cm_message m = {.length = 0};
    size_t page = (address - pool_start) / PAGE;
    uint32_t slot = page % 2 == 1 ? (uint32_t)(page / 2) : (uint32_t)(page / 2) - 1;
    cm_message_str(&m, "cmalloc: guarded allocation: ");
    if (page == 0 || slot >= slot_count || slots[slot].state == SLOT_NEVER) {
        cm_message_str(&m, "invalid access to ");
        cm_message_hex(&m, address);
        cm_message_str(&m, ", in cmalloc's guard pages but next to no block\n");
        cm_message_write(&m, 2);
        return;
    }
    const guard_slot *s = &slots[slot];
    uintptr_t object = slot_object(slot), end = object + s->size;
    if (s->state == SLOT_FREED)
        cm_message_str(&m, "use after free: ");
    if (address >= end) {
        cm_message_str(&m, "heap buffer overflow: access to ");
        cm_message_hex(&m, address);
        cm_message_str(&m, ", ");
        cm_message_uint(&m, address - end);
        cm_message_str(&m, " bytes past the end of a ");
    } else if (address >= object) {
        cm_message_str(&m, "access to ");
        cm_message_hex(&m, address);
        cm_message_str(&m, ", ");
        cm_message_uint(&m, address - object);
        cm_message_str(&m, " bytes inside a ");
    } else {
        cm_message_str(&m, "access to ");
        cm_message_hex(&m, address);
        cm_message_str(&m, ", ");
        cm_message_uint(&m, object - address);
        cm_message_str(&m, " bytes before a ");
    }
    cm_message_uint(&m, s->size);
    cm_message_str(&m, s->state == SLOT_FREED ? "-byte block at " : "-byte live block at ");
    cm_message_hex(&m, object);
    cm_message_str(&m, s->state == SLOT_FREED ? ", freed\n" : "\n");
    cm_message_write(&m, 2);
    report_stacks(s, context);
}

/* Passes a SIGSEGV on as if cmalloc had installed no handler: to the program's earlier handler,
 * or to the default action. A fault (sent false) returns and faults again, now with the default
 * action in place; a signal sent by kill, raise, pthread_kill or sigqueue does not repeat, so
 * it is raised again (SA_NODEFER: it is not blocked here) and kills the process at once. One
 * the program ignored stays ignored; a real fault is never ignored by the kernel either. */
static void pass_on(int signal_number, siginfo_t *info, void *context, bool sent)
{
    if ((previous_action.sa_flags & SA_SIGINFO) && previous_action.sa_sigaction != NULL) {
        previous_action.sa_sigaction(signal_number, info, context);
        return;
    }
    if (previous_action.sa_handler == SIG_IGN && sent)
        return;
    if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
        previous_action.sa_handler(signal_number);
        return;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, NULL);
    if (sent)
        raise(SIGSEGV);
}

static void on_fault(int signal_number, siginfo_t *info, void *context)
{
    uintptr_t address = (uintptr_t)info->si_addr;
    /* si_code <= 0: sent by a process (SI_USER, SI_QUEUE, SI_TKILL), not a fault; its si_addr
     * means nothing. A closed page faults with SEGV_ACCERR, a guard marker with SEGV_MAPERR
     * (the kernel treats it as no page); the whole pool is mapped, so either is cmalloc's. */
    bool sent = info->si_code <= 0;
    if (!sent && (info->si_code == SEGV_ACCERR || info->si_code == SEGV_MAPERR) &&
        cm_guard_owns((void *)address) && !fault_reported) {
        fault_reported = 1;
        report_fault(address, context);
    }
    pass_on(signal_number, info, context, sent);
}

/* Reserves the pool and installs the fault handler; false (guarding stays off) on failure. */
bool cm_guard_init(cm_stack_printer print_stack, cm_context_printer print_access)
{
    stack_printer = print_stack;
    access_printer = print_access;
    size_t count = cm_option.guard_slots; /* 1..CM_GUARD_SLOTS_MAX: options.c keeps the range */
    slots = cm_metadata_alloc(count * sizeof(guard_slot));
    char *pool = slots ? cm_os_reserve((2 * count + 1) * PAGE) : NULL;
    if (pool == NULL)
        return false;
    /* Each data page a mapping of its own; each guard page marked, unless the kernel refuses
     * (a kernel without markers refuses the first, and no more are tried). */
    bool markers = cm_option.guard_markers && cm_os_guard_pages(pool, PAGE);
    for (size_t slot = 0; slot < count; slot++) {
        if (!cm_os_separate(pool + (2 * slot + 1) * PAGE, PAGE))
            return false;
        markers = markers && cm_os_guard_pages(pool + (2 * slot + 2) * PAGE, PAGE);
    }
    open_run = markers ? OPEN_RUN : 1;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, &previous_action) != 0)
        return false;
    slot_count = (uint32_t)count;
    pool_bytes = (2 * count + 1) * PAGE;
    __atomic_store_n(&pool_start, (uintptr_t)pool, __ATOMIC_RELEASE);
    return true;
}

/* In the child, a slot whose free had not returned at the fork is the program's again: the
 * free never happened there (the thread that made it is gone). */
static void revive_unfinished_frees(void)
{
    for (uint32_t slot = 0; freeing_count > 0 && slot < slot_count; slot++) {
        if (!slots[slot].freeing)
            continue;
        slots[slot].freeing = false;
        slots[slot].state = SLOT_LIVE;
        slots[slot].free_stack = 0;
        slots[slot].open = cm_os_protect(slot_page(slot), PAGE, true);
        live_count++;
        freeing_count--;
    }
}

void cm_guard_fork(int phase)
{
    cm_lock_fork(&guard_lock, phase);
    if (phase == CM_FORK_CHILD && slots != NULL) {
        revive_unfinished_frees();
        cm_latest_free_fork_child(latest_frees);
    }
}
