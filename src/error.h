/* error.h - error.c's contract: a message built on the stack (never malloc) and written with
 * write(2), the reports, and the keys of free-list links and free marks (internal.h's list
 * functions use both). error.c includes this file alone (and os.h through it), never internal.h,
 * whose inline code calls it.
 */
#ifndef CM_ERROR_H
#define CM_ERROR_H

#include "os.h"

#pragma GCC visibility push(hidden) /* as internal.h says */

typedef struct cm_message {
    char text[512];
    size_t length;
} cm_message;
void cm_message_str(cm_message *m, const char *s);
void cm_message_uint(cm_message *m, uint64_t value);
void cm_message_hex(cm_message *m, uint64_t value);
void cm_message_write(cm_message *m, int fd);
void cm_message_path(cm_message *m, const char *pattern);
void cm_message_call(cm_message *m, const char *caller, const void *p);
void cm_report_finish(cm_message *m);
void cm_report_set_details(void (*details)(void));
void *cm_out_of_memory(void);
CM_COLD void cm_report_invalid_pointer(const char *caller, const void *p);
CM_COLD void cm_report_double_free(const char *caller, const void *p);
CM_COLD void cm_report_sized_free(const char *caller, const void *p, size_t alignment, size_t size,
                                  size_t bytes, bool requested);
CM_COLD __attribute__((noreturn)) void cm_report_corrupt_list(const void *object);
/* Set once by cm_init, random per process. */
extern uintptr_t cm_list_key, cm_free_key;
/* CMALLOC_ABORT_ON_ERROR (options.c's table writes it): a report aborts, else the caller leaks
 * the pointer and goes on. false until the options are read. */
extern bool cm_abort_on_error;

#pragma GCC visibility pop

#endif /* CM_ERROR_H */
