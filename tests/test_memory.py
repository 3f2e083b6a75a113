"""cipr.memory: with CIPR_LOW_MEMORY=1, glibc's thresholds are set for this process and the ones it starts,
unless the user chose them."""

import os
import subprocess
import sys

CODE = ("import os; from cipr.memory import limit_heap_growth; "
        "print(limit_heap_growth(), os.environ.get('MALLOC_MMAP_THRESHOLD_'), os.environ.get('MALLOC_TRIM_THRESHOLD_'))")


def _run(env):
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=60,
                          check=True).stdout.split()


def test_sets_the_thresholds_for_children_and_respects_the_users_choice():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "CIPR_LOW_MEMORY"}
    assert _run(env) == ["False", "None", "None"]  # opt-in
    env["CIPR_LOW_MEMORY"] = "1"
    changed, mmap, trim = _run(env)
    if changed == "False":  # no glibc on this platform: nothing may be set
        assert (mmap, trim) == ("None", "None")
    else:
        assert (changed, mmap, trim) == ("True", str(1 << 20), str(64 << 20))
    assert _run({**env, "MALLOC_TRIM_THRESHOLD_": "123"}) == ["False", "None", "123"]


RETAIN = """
import ctypes, os
from cipr.memory import retain_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
changed = retain_freed_memory() if os.environ.get("RETAIN") == "1" else False
before = libc.mallinfo2().hblkhd
block = libc.malloc(64 << 20)  # above glibc's largest automatic mmap threshold (32 MB)
print(changed, libc.mallinfo2().hblkhd - before)
libc.free(block)
"""


def _retain(**env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "CIPR_LOW_MEMORY"}
    out = subprocess.run([sys.executable, "-c", RETAIN], capture_output=True, text=True, env={**base, **env},
                         timeout=60, check=True).stdout.split()
    return out[0] == "True", int(out[1])


def test_retaining_freed_memory_serves_a_64_mb_block_from_the_heap_instead_of_a_fresh_mapping():
    """glibc's defaults mmap a 64 MB block (mapped bytes grow by it); with `retain_freed_memory` it comes
    from the heap (no new mapping). Not set under CIPR_LOW_MEMORY=1 or a user's own threshold."""
    changed, mapped = _retain()
    assert not changed and mapped >= 64 << 20  # the block plus its header, rounded to pages
    changed, mapped = _retain(RETAIN="1")
    assert changed and mapped == 0
    changed, mapped = _retain(RETAIN="1", CIPR_LOW_MEMORY="1")
    assert not changed and mapped >= 64 << 20
    assert _retain(RETAIN="1", MALLOC_TRIM_THRESHOLD_="123")[0] is False
