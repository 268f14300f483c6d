"""What this CPU can do, read once from /proc/cpuinfo: the feature flags that decide the
compute dtype (``execution_plan``) and which SIMD path the C kernels take."""

import functools

# x86 flags of native bf16 arithmetic (AVX-512-BF16 dot products, AMX tiles); "bf16" is
# the aarch64 name (Armv8.6 BFDOT/BFMMLA). Without one of them oneDNN and torch emulate
# bf16 with conversions around fp32 math, several times slower than fp32 itself.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def first_cpu(cpuinfo: str) -> dict[str, str]:
    """The fields of the first processor of a /proc/cpuinfo text (its lines up to the blank
    one after them), e.g. ``model name``, ``cpu family``, ``flags``."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def parse_flags(cpuinfo: str) -> frozenset[str]:
    """The first ``flags`` (x86) or ``Features`` (aarch64) line of a /proc/cpuinfo text."""
    fields = first_cpu(cpuinfo)
    return frozenset(fields.get("flags", fields.get("Features", "")).split())


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This machine's CPU feature flags; empty where /proc/cpuinfo cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return parse_flags(f.read())
    except OSError:
        return frozenset()


def native_bf16(flags: frozenset[str]) -> bool:
    """Whether a CPU with these flags computes in bf16 natively."""
    return not flags.isdisjoint(NATIVE_BF16_FLAGS)
