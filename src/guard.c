/* guard.c - guarded allocations (CMALLOC_GUARD_RATE=N): on average one small allocation in N
 * gets a page of its own, ending against an inaccessible guard page, so that an overflow past
 * its end faults at once; when it is freed its page is made inaccessible and stays so while the
 * rest of the pool is cycled through, so that a use after free faults too. prof.c decides which
 * allocations (the slow-path countdown) and hands over their allocation and free stacks.
 *
 *   pool: reserved once, PROT_NONE except the data pages of live slots (PAGE = 4 KiB); each
 *   data page is a mapping of its own (cm_os_separate), so opening and closing it is cheap
 *   | guard | slot 0 data | guard | slot 1 data | guard | ... | slot n-1 data | guard |
 *                  [....object]^ the object ends at its page's end (its start rounded down to
 *                               16 bytes, as malloc promises), so its next byte is the guard
 *
 * Slots go never used -> live -> freed (inaccessible) -> live again, taking
 * never-used slots first and then the one freed longest ago (a FIFO), so a freed slot stays
 * inaccessible for as long as the pool allows. When every slot is live the allocation is served
 * normally: CMALLOC_GUARD_SLOTS bounds the memory (one resident page per live slot, plus the
 * reserved address space) and the slot array (metadata, never malloc).
 *
 * Faults: a SIGSEGV handler installed at init looks the faulting address up. Inside the pool it
 * prints (write(2), dladdr; nothing allocates) the address, overflow or use after free, the
 * block's address and size and its allocation and free stacks, then passes the signal on: to
 * the handler the program installed before cmalloc, or by restoring the default action and
 * returning, so that the access faults again and the process dies as it would have. A handler
 * the program installs later replaces this one (its choice). Faults elsewhere pass on untouched.
 * Lock: guard_lock guards the slot states and the freed FIFO, with mprotect done under
 * it so a slot is never handed out before its page is closed; taken alone. The fault handler
 * reads the slots without it: the faulting thread may hold it.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <signal.h>
#include <string.h>

#define PAGE      ((size_t)4096) /* the kernel's page: the unit of protection */
#define SLOTS_MAX 65536

enum { SLOT_NEVER = 0, SLOT_LIVE, SLOT_FREED };

typedef struct guard_slot {
    uint32_t state;       /* SLOT_* */
    uint32_t size;        /* bytes requested (live or freed) */
    uint32_t alloc_stack; /* prof.c stack ids, 0: none */
    uint32_t free_stack;
    uint32_t next_freed; /* FIFO of freed slots: index + 1, 0 at the tail */
    uint32_t unused;
} guard_slot;

static cm_lock guard_lock = CM_LOCK_INIT;
static uintptr_t pool_start; /* the first guard page */
static size_t pool_bytes;    /* (2 * slot_count + 1) * PAGE */
static guard_slot *slots;
static uint32_t slot_count, never_used, live_count;
static uint32_t freed_head, freed_tail; /* index + 1, 0: empty */
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

void *cm_guard_alloc(size_t size, uint32_t stack)
{
    if (size > CM_GUARD_MAX_SIZE)
        return NULL;
    uint32_t slot;
    void *p = NULL;
    cm_lock_acquire(&guard_lock);
    if (never_used < slot_count) {
        slot = never_used++;
    } else if (freed_head != 0) {
        slot = freed_head - 1;
        freed_head = slots[slot].next_freed;
        if (freed_head == 0)
            freed_tail = 0;
    } else {
        cm_lock_release(&guard_lock);
        return NULL; /* every slot is live */
    }
    /* A reused page keeps the old block's bytes, as any malloc'ed memory may (calloc clears). */
    if (cm_os_protect(slot_page(slot), PAGE, true)) {
        slots[slot] =
            (guard_slot){.state = SLOT_LIVE, .size = (uint32_t)size, .alloc_stack = stack};
        live_count++;
        p = (void *)slot_object(slot);
    } else { /* out of memory for page tables: put the slot back, serve normally */
        slots[slot].next_freed = freed_head;
        freed_head = slot + 1;
        if (freed_tail == 0)
            freed_tail = slot + 1;
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
        cm_lock_release(&guard_lock);
        cm_report_double_free(caller, p);
        return;
    }
    /* Closed, not released: one system call per free, and the page (one of at most
     * CMALLOC_GUARD_SLOTS) is still there, without a fault, when the slot is used again. */
    cm_os_protect(slot_page(slot), PAGE, false);
    slots[slot].state = SLOT_FREED;
    slots[slot].free_stack = stack;
    slots[slot].next_freed = 0;
    if (freed_tail != 0)
        slots[freed_tail - 1].next_freed = slot + 1;
    else
        freed_head = slot + 1;
    freed_tail = slot + 1;
    live_count--;
    cm_lock_release(&guard_lock);
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

/* ---- the fault report ------------------------------------------------------------------- */
/* The stacks are prof.c's (the profiler interns them; guard.c keeps their ids): prof.c hands
 * its printer over at init, so guard.c, beneath the profiler, never calls up into it. */
static cm_stack_printer stack_printer;

static void report_stacks(const guard_slot *slot)
{
    cm_message m = {.length = 0};
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
static void report_fault(uintptr_t address)
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
    report_stacks(s);
}

static void on_fault(int signal_number, siginfo_t *info, void *context)
{
    uintptr_t address = (uintptr_t)info->si_addr;
    if (info->si_code == SEGV_ACCERR && cm_guard_owns((void *)address) && !fault_reported) {
        fault_reported = 1;
        report_fault(address);
    }
    if ((previous_action.sa_flags & SA_SIGINFO) && previous_action.sa_sigaction != NULL) {
        previous_action.sa_sigaction(signal_number, info, context);
    } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
        previous_action.sa_handler(signal_number);
    } else {
        /* Default action: restore it and return; the access faults again and kills the
         * process (with a core dump where enabled), as it would have without cmalloc. */
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = SIG_DFL;
        sigemptyset(&action.sa_mask);
        sigaction(SIGSEGV, &action, NULL);
    }
}

/* Reserves the pool and installs the fault handler; false (guarding stays off) on failure. */
bool cm_guard_init(cm_stack_printer print_stack)
{
    stack_printer = print_stack;
    size_t count = cm_option.guard_slots;
    if (count == 0)
        return false;
    if (count > SLOTS_MAX)
        count = SLOTS_MAX;
    slots = cm_metadata_alloc(count * sizeof(guard_slot));
    char *pool = slots ? cm_os_reserve((2 * count + 1) * PAGE) : NULL;
    if (pool == NULL)
        return false;
    for (size_t slot = 0; slot < count; slot++) /* each data page a mapping of its own */
        if (!cm_os_separate(pool + (2 * slot + 1) * PAGE, PAGE))
            return false;
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

void cm_guard_fork(int phase)
{
    cm_lock_fork(&guard_lock, phase);
}
