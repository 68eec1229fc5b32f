/* error.c - how cmalloc says something went wrong: messages built on the stack (never with
 * malloc, which may be what is broken) and written with write(2), the reports of bad pointers
 * and corrupted lists, and the per-process keys that encode free-list links and free marks
 * (internal.h's list functions), which are what those reports check against. It stands on
 * os.c alone: its header, error.h, names nothing above (CMALLOC_ABORT_ON_ERROR is a variable of
 * its own, which options.c's table writes).
 *
 * Below every layer but os.c: central_cache.c and thread_cache.c report a corrupted list, and
 * alloc.c a bad pointer, without calling up into the files that call them. Holds no lock.
 * A report ends with "; aborting" and abort(), or with CMALLOC_ABORT_ON_ERROR=0 with
 * "; leaking it and going on", and the caller leaks the pointer.
 */
#include "error.h" /* never internal.h, whose list functions call this file */

#include <errno.h>
#include <stdlib.h>

uintptr_t cm_list_key, cm_free_key; /* random, set once by cm_init */
bool cm_abort_on_error;

/* ---- messages: built on the stack, written with write(2) ------------------------------------ */
void cm_message_str(cm_message *m, const char *s)
{
    while (*s && m->length < sizeof m->text)
        m->text[m->length++] = *s++;
}

static void message_digits(cm_message *m, uint64_t value, unsigned base)
{
    char digits[24];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[value % base];
        value /= base;
    } while (value);
    while (n > 0 && m->length < sizeof m->text)
        m->text[m->length++] = digits[--n];
}

void cm_message_uint(cm_message *m, uint64_t value)
{
    message_digits(m, value, 10);
}

void cm_message_hex(cm_message *m, uint64_t value)
{
    cm_message_str(m, "0x");
    message_digits(m, value, 16);
}

/* A path from a pattern given by the user: %p is the process id, %e the program's name, %% a
 * percent sign; any other character is kept as it is. */
void cm_message_path(cm_message *m, const char *pattern)
{
    for (; *pattern; pattern++) {
        if (pattern[0] == '%' && pattern[1] == 'p') {
            cm_message_uint(m, (uint64_t)cm_os_process_id());
            pattern++;
        } else if (pattern[0] == '%' && pattern[1] == 'e') {
            cm_message_str(m, cm_os_program_name());
            pattern++;
        } else if (pattern[0] == '%' && pattern[1] == '%') {
            cm_message_str(m, "%");
            pattern++;
        } else if (m->length < sizeof m->text) {
            m->text[m->length++] = *pattern;
        }
    }
}

/* The start of a report about p from caller's call: "cmalloc: caller(): 0x...". */
void cm_message_call(cm_message *m, const char *caller, const void *p)
{
    cm_message_str(m, "cmalloc: ");
    cm_message_str(m, caller);
    cm_message_str(m, "(): ");
    cm_message_hex(m, (uintptr_t)p);
}

void cm_message_write(cm_message *m, int fd)
{
    cm_os_write(fd, m->text, m->length);
    m->length = 0;
}

/* ---- reports ------------------------------------------------------------------------------- */
/* What every failing allocation returns: NULL with ENOMEM, the only errno cmalloc sets. */
void *cm_out_of_memory(void)
{
    errno = ENOMEM;
    return NULL;
}

/* What a layer above adds to every report after its line (check.c's stacks), or NULL. */
static void (*report_details)(void);

void cm_report_set_details(void (*details)(void))
{
    report_details = details;
}

/* Ends an error report begun in m: says what happens next, writes it (then the details), and
 * aborts unless CMALLOC_ABORT_ON_ERROR=0 (then the caller leaks the pointer and goes on). */
void cm_report_finish(cm_message *m)
{
    cm_message_str(m, cm_abort_on_error ? "; aborting\n" : "; leaking it and going on\n");
    cm_message_write(m, 2);
    if (report_details != NULL)
        report_details();
    if (cm_abort_on_error)
        abort();
}

void cm_report_invalid_pointer(const char *caller, const void *p)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: ");
    cm_message_str(&m, caller);
    cm_message_str(&m, "(): invalid pointer ");
    cm_message_hex(&m, (uintptr_t)p);
    cm_report_finish(&m);
}

void cm_report_double_free(const char *caller, const void *p)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: double free ");
    cm_message_hex(&m, (uintptr_t)p);
    cm_message_str(&m, " in ");
    cm_message_str(&m, caller);
    cm_message_str(&m, "()");
    cm_report_finish(&m);
}

/* A sized free (free_sized, free_aligned_sized, a sized operator delete) told a size other than
 * the bytes requested (requested: the debug mode, which knows them), or past the block's usable
 * bytes, or an alignment that is not a power of two or not p's. */
void cm_report_sized_free(const char *caller, const void *p, size_t alignment, size_t size,
                          size_t bytes, bool requested)
{
    cm_message m = {.length = 0};
    cm_message_call(&m, caller, p);
    if (requested || size > bytes) {
        cm_message_str(&m, " freed with size ");
        cm_message_uint(&m, size);
        cm_message_str(&m, requested ? ", not the " : ", past its block's ");
        cm_message_uint(&m, bytes);
        cm_message_str(&m, requested ? " bytes it was allocated with" : " bytes");
    } else {
        cm_message_str(&m, " freed with alignment ");
        cm_message_uint(&m, alignment);
        cm_message_str(&m, cm_is_power_of_two(alignment) ? ", which it does not have"
                                                          : ", not a power of two");
    }
    cm_report_finish(&m);
}

void cm_report_corrupt_list(const void *object)
{
    cm_message m = {.length = 0};
    cm_message_str(&m, "cmalloc: corrupted free list at ");
    cm_message_hex(&m, (uintptr_t)object);
    cm_message_str(&m, " (a write to freed memory, or an overflow into it); aborting\n");
    cm_message_write(&m, 2);
    abort();
}
