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
