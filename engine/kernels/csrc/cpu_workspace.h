/* Per-thread scratch kept between kernel calls (cpu_workspace.c). */
#ifndef KVSERVE_CPU_WORKSPACE_H
#define KVSERVE_CPU_WORKSPACE_H
#include <stddef.h>

/* What a block serves: a thread may hold one of each at once. */
enum { WORKSPACE_SHARED, WORKSPACE_THREAD, WORKSPACE_USES };

/* At least `bytes` of this thread's block for `use`, valid until its next call for the same
 * use; NULL if memory ran out. Its contents are whatever the last user left. */
void *workspace(int use, size_t bytes);
#endif
