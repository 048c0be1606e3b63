"""dpgen.core.host: a training process keeps freed host memory for its next step (glibc's mallopt)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpgen.core import host

ROOT = Path(__file__).resolve().parents[1]

#: in a fresh interpreter (no torch): a 4 MiB block allocated, touched and freed twice; the faults of the second
PROBE = """
import ctypes, resource, sys
from dpgen.core.host import keep_freed_memory
kept = keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(4 << 20)
    ctypes.memset(p, 1, 4 << 20)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    libc.free(p)
print(kept, faults[1])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or host._mallopt() is None, reason="glibc only")
def test_a_freed_block_is_reused_without_page_faults_and_system_keeps_glibcs_defaults():
    """Measured, not argued: with the thresholds raised, a freed 4 MiB block comes back without one page fault per
    page; with DPGEN_MALLOC=system, glibc maps it afresh (1,024 pages)."""
    out = {}
    for mode in ("keep", "system"):
        env = {**os.environ, host.ENV: mode, "PYTHONPATH": str(ROOT)}
        res = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        kept, faults = res.stdout.split()
        out[mode] = (kept == "True", int(faults))
    assert out["keep"][0] and out["keep"][1] < 64, out
    assert not out["system"][0] and out["system"][1] > 512, out


def test_both_thresholds_are_set_once_per_process_with_one_log_line(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(host, "_mallopt", lambda: (lambda param, value: calls.append((param, value)) or 1))
    monkeypatch.setattr(host, "_done", {})
    monkeypatch.delenv(host.ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="dpgen"):
        assert host.keep_freed_memory() and host.keep_freed_memory()
    assert calls == [(host.M_MMAP_THRESHOLD, 32 << 20), (host.M_TRIM_THRESHOLD, 1 << 30)]
    assert [r.getMessage() for r in caplog.records] == [
        "host memory: freed blocks up to 32 MiB are kept for the next step (glibc mallopt; DPGEN_MALLOC=system "
        "keeps the defaults)"]


@pytest.mark.parametrize("why", ["system", "no mallopt", "refused"])
def test_system_another_c_library_or_a_refusal_leave_the_allocator_alone(why, monkeypatch, caplog):
    calls = []
    mallopt = None if why == "no mallopt" else (lambda param, value: calls.append(param) or 0)
    monkeypatch.setattr(host, "_mallopt", lambda: mallopt)
    monkeypatch.setattr(host, "_done", {})
    monkeypatch.setenv(host.ENV, "system" if why == "system" else "keep")
    with caplog.at_level(logging.INFO, logger="dpgen"):
        assert not host.keep_freed_memory()
    assert calls == ([] if why != "refused" else [host.M_MMAP_THRESHOLD])
    assert len(caplog.records) == 1 and "keeps its defaults" in caplog.records[0].getMessage()


def test_a_training_run_keeps_freed_memory(tmp_path, monkeypatch):
    from tiny import compose_cfg
    from dpgen.core import pipeline

    calls = []
    monkeypatch.setattr(pipeline, "keep_freed_memory", lambda: calls.append(1) or True)
    cfg = compose_cfg("dpgan", "dpgan.batch_size=8", "dpgan.iters=1", "tensorboard=false", "progress=false",
                      "samples_per_class=1", "threads=1")
    pipeline.run_training(cfg, tmp_path / "run", evaluate=False)
    assert calls == [1]
