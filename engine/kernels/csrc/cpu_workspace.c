/* Scratch memory that the CPU kernels keep between calls, per thread and per use.
 *
 * A kernel that mallocs its multi-MiB scratch in every call gets a fresh mmap from glibc
 * each time (blocks past its mmap threshold), so every page of it is faulted in and zeroed
 * again, in every layer of every step: the prefill kernel's packed keys and values took
 * ~1,900 page faults a call in a 134M float32 model (benchmarks/cpu-levers.md, lever 10).
 * Here each thread keeps one block per use, grown to the largest size asked and never
 * shrunk (the high-water mark of the calls it served, as a GPU caching allocator keeps
 * it), freed when the thread ends. The kernels run on torch's OpenMP threads, which live
 * as long as the process, and on the engine's stepping thread.
 */
#include "cpu_workspace.h"

#include <pthread.h>
#include <stdlib.h>

struct block {
    void *data;
    size_t bytes;
};

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void free_blocks(void *blocks) {
    struct block *b = blocks;
    for (int use = 0; use < WORKSPACE_USES; use++) free(b[use].data);
    free(b);
}

static void make_key(void) { pthread_key_create(&key, free_blocks); }

void *workspace(int use, size_t bytes) {
    pthread_once(&once, make_key);
    struct block *blocks = pthread_getspecific(key);
    if (blocks == NULL) {
        blocks = calloc(WORKSPACE_USES, sizeof *blocks);
        if (blocks == NULL || pthread_setspecific(key, blocks) != 0) {
            free(blocks);
            return NULL;
        }
    }
    struct block *b = &blocks[use];
    if (bytes > b->bytes) {
        free(b->data);
        b->data = malloc(bytes);
        b->bytes = b->data == NULL ? 0 : bytes;
    }
    return b->data;
}
