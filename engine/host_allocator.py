"""glibc's malloc set for an engine whose steps run on the CPU.

By default glibc returns memory to the kernel eagerly: a block past its mmap threshold (which
starts at 128 KiB and follows the largest block freed, so a block of the same size as the
last is mapped again) is a fresh mmap, and the heap's free top is given back once it
exceeds the trim threshold. A step's activations are blocks of up to tens of MiB, allocated
and freed in every layer, so a step after a larger one, or a new batch size, faults in and
zeroes its pages again, and every unmap stops the other OpenMP thread for a TLB shootdown:
20–47 thousand faults and 150–300 ms more in the first ~1,100-token steps of a fresh
134M-parameter float32 engine (0.52 s a step without them; benchmarks/cpu-levers.md,
lever 11), which is the time to first token of a burst on a new or scaled-up pod.

``keep_step_memory`` fixes the mmap threshold at glibc's own ceiling, 32 MiB (larger blocks
are still mapped and unmapped: nothing of that size stays resident), and the trim threshold
at 1 GiB, so the heap keeps the high-water mark of a step's smaller blocks between steps.
The model runner calls it once the weights are loaded and packed, and it first gives back
what the heap holds free then, so the load's temporaries are not kept.
"""

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 1 << 30


def keep_step_memory() -> bool:
    """Give the heap's free memory back, then set both thresholds for this process; False
    where the C library has no glibc ``mallopt`` and ``malloc_trim`` (other systems), which
    is left as it is."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    malloc_trim(0)
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and done
    if not done:
        log.warning("mallopt refused the step-memory thresholds; glibc's defaults stay")
    return done
