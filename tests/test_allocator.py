"""vitkit.engines.allocator: the CLI keeps freed large blocks in the heap (glibc), the user's own
settings and VITKIT_MALLOC=0 leave malloc alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# Resident memory (MiB) with a touched 64 MiB block, and after freeing it. Under glibc's
# defaults the block is mmapped and its pages go back at once; kept in the heap they stay.
PROBE = """
{setup}
import numpy as np
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
a = np.ones(64 << 20, np.uint8)
small = np.ones(1 << 20, np.uint8)  # a later block, so the big one is not the heap's top
before = rss()
del a
print(before - rss())
"""

CLI = """
from vitkit.cli import main
try:
    main(["--version"])
except SystemExit:
    pass
"""


def released_mib(setup: str, **env: str) -> float:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "VITKIT_"))}
    full_env.update(env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(setup=setup)],
        env=full_env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


def test_default_malloc_returns_a_freed_64mib_block():
    """The control: without vitkit's setting the freed block leaves resident memory."""
    assert released_mib("") > 48


def test_cli_keeps_a_freed_64mib_block_for_reuse():
    assert released_mib(CLI) < 8


def test_off_switch_and_users_own_setting_leave_malloc_alone():
    assert released_mib(CLI, VITKIT_MALLOC="0") > 48
    # the user's own threshold wins (here glibc's default-sized one: 128 KiB)
    assert released_mib(CLI, MALLOC_MMAP_THRESHOLD_="131072") > 48


def test_keep_freed_memory_reports_what_it_did(monkeypatch):
    from vitkit.engines.allocator import keep_freed_memory

    monkeypatch.setenv("VITKIT_MALLOC", "0")
    assert keep_freed_memory() is False
    monkeypatch.delenv("VITKIT_MALLOC")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert keep_freed_memory() is False


def test_release_gives_back_what_the_cli_keeps_even_from_another_threads_arena():
    """The server calls release_freed_memory() after a large decode: a block freed on a decode
    thread (its own malloc arena) leaves resident memory then, though the CLI keeps it
    otherwise."""
    script = (
        CLI
        + """
import threading
import numpy as np
from vitkit.engines.allocator import release_freed_memory
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
def decode():  # (blocks under 64 MiB: a thread's arena takes larger ones by mmap)
    a, b = np.ones(30 << 20, np.uint8), np.ones(30 << 20, np.uint8)
    small = np.ones(1 << 20, np.uint8)  # a later block: the big ones are not the heap's top
    del a, b
start = rss()
t = threading.Thread(target=decode)
t.start()
t.join()
kept = rss() - start
release_freed_memory()
print(kept, kept - (rss() - start))
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "VITKIT_"))}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout
    kept, released = map(float, out.split()[-2:])
    assert kept > 48 and released > 48, out
