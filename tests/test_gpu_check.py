"""bench/gpu_check.py on a CPU (``--device cpu --tiny``): the table's format, a failing variant's row, the budget
split among the rows, and the table as the last thing printed."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import types

import pytest
import torch

from conftest import ROOT

COLUMNS = ["method", "precision", "compile", "s/step", "TFLOP/s", "% matmul", "peak GB", "full run h", "notes"]


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cells(line: str) -> list[str]:
    assert line.startswith("| ") and line.endswith(" |"), line
    return [c.strip() for c in line[2:-2].split(" | ")]


def _table_lines(text: str) -> list[str]:
    """The table at the end of ``text``: from its caption line to the last line."""
    lines = text.rstrip("\n").splitlines()
    start = max(i for i, ln in enumerate(lines) if ln.startswith("gpu-check: torch "))
    return lines[start:]


def _no_data_or_matmul(gc, monkeypatch) -> None:
    """For tests of the rows' bookkeeping around a fake profile: no dataset, a fixed matmul rate, no cleanup."""
    monkeypatch.setattr("dpgen.data.load_dataset", lambda *a, **k: None)
    monkeypatch.setattr(gc, "matmul_rate", lambda device, n, seconds: {"method": "mm", "TFLOP/s": 4.0})
    monkeypatch.setattr(gc, "_cleanup", lambda device: None)
    monkeypatch.setattr(gc, "warm_imports", lambda methods: None)


def test_tiny_check_prints_one_table_last_with_a_refused_variant(tmp_path):
    """A real tiny run as a script, stdout and stderr together: progress lines first, then the one table last --
    a caption naming torch, CUDA and the device, the matmul reference row, a measured row and the row of a
    variant the schema refuses (precision=fp8); --out keeps the same table and the rows as JSON."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--tiny",
                           "--methods", "dpgan", "--precisions", "fp32,fp8", "--compile", "false", "--budget", "2",
                           "--out", str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = _table_lines(proc.stdout)
    assert proc.stdout.rstrip("\n").endswith("\n" + "\n".join(lines))  # nothing after the table
    before = proc.stdout[:proc.stdout.rindex(lines[0])]
    assert "[gpu_check " in before and "[gpu_profile dpgan" in before and "] row 2/2 dpgan precision=fp8" in before
    assert lines[0].startswith(f"gpu-check: torch {torch.__version__} | CUDA ") and "| cpu |" in lines[0]
    assert lines[1] == "" and _cells(lines[2]) == COLUMNS and lines[3] == "|" + "|".join(["---"] * 9) + "|"
    body = [_cells(ln) for ln in lines[4:]]
    assert len(body) == 3 and all(len(cells) == len(COLUMNS) for cells in body)
    assert body[0][:3] == ["bf16 matmul n=256", "bf16", ""] and body[0][5] == "100"
    number = lambda cell: float(cell.replace(",", ""))  # noqa: E731  (the table writes 1,107 for 1107)
    assert body[1][:3] == ["dpgan", "fp32", "off"] and number(body[1][3]) > 0 and number(body[1][5]) > 0
    assert body[1][8] == "2 steps timed"
    assert body[2][:3] == ["dpgan", "fp8", "off"] and body[2][3:8] == [""] * 5
    assert body[2][8].startswith("failed: precision='fp8' is invalid")
    assert (tmp_path / "gpu_check.md").read_text() == "\n".join(lines) + "\n"

    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["environment"]["torch"] == torch.__version__
    matmul, ok, refused = saved["rows"]
    assert matmul["TFLOP/s"] > 0 and math.isclose(matmul["TFLOP/s"], 2 * 256**3 / matmul["s/step"] / 1e12,
                                                  rel_tol=1e-9)
    assert ok["s/step"] > 0 and ok["TFLOP/s"] > 0 and ok["peak GB"] > 0 and ok["full run h"] > 0
    assert math.isclose(ok["% matmul"], 100 * ok["TFLOP/s"] / matmul["TFLOP/s"], rel_tol=1e-9)
    assert ok["profile"]["steps timed"] == 2 and ok["profile"]["s/step"] == ok["s/step"]
    assert refused.get("s/step") is None


def test_compile_variant_without_the_key_says_why(gc):
    """Without a ``compile`` key in the schema, compile off is the default (no override) and compile on is a
    row saying the key is missing; with the key, both variants compose."""
    from dpgen.core.schema import schema_hint

    known = gc.compile_known("digits", "10", True)
    assert known == (schema_hint("compile") is not None)
    assert gc.variant_overrides("tf32", "false", known) == ["precision=tf32"] + (["compile=false"] if known else [])
    assert gc.variant_overrides("tf32", "true", known) == ["precision=tf32", "compile=true"]
    why = gc.preflight("dpgan", "digits", "10", True, gc.variant_overrides("fp32", "true", known))
    assert why == (None if known else "compile: key not in schema")
    assert gc.preflight("dpgan", "digits", "10", True, gc.variant_overrides("fp32", "false", known)) is None


def test_a_variant_failing_in_training_is_a_row_and_the_check_goes_on(gc, monkeypatch, capsys):
    """An exception inside one variant's training (here a RuntimeError of tf32) becomes that row's reason; the
    rows after it still run."""
    seen = []

    def fake_profile(method, *args, budget=None, overrides=None, data=None, first_steps=None):
        seen.append(overrides)
        if "precision=tf32" in overrides:
            raise RuntimeError("CUDA out of memory\nmore text")
        return {"s/step": 0.5, "TFLOP/s": 2.0, "peak GB": 1.0, "full run h": 3.0, "steps timed": 2}

    monkeypatch.setattr(gc.gp, "profile_one", fake_profile)
    _no_data_or_matmul(gc, monkeypatch)
    rows = gc.main(["--device", "cpu", "--tiny", "--methods", "dpgan", "--precisions", "fp32,tf32,bf16", "--compile",
                    "false", "--budget", "0.5"], t_start=time.perf_counter())
    assert [r["precision"] for r in rows[1:]] == ["fp32", "tf32", "bf16"] and len(seen) == 3
    assert rows[2]["notes"] == "failed: RuntimeError: CUDA out of memory" and rows[2].get("s/step") is None
    for r in (rows[1], rows[3]):
        assert r["s/step"] == 0.5 and r["notes"] == "2 steps timed"
        assert math.isclose(r["% matmul"], 100 * 2.0 / rows[0]["TFLOP/s"], rel_tol=1e-9)
    assert "| dpgan | tf32 | off |  |  |  |  |  | failed: RuntimeError: CUDA out of memory |" in capsys.readouterr().out


def test_budget_split(gc, monkeypatch):
    """The budget less the reserve is shared by weight (compile on: double) among the rows that can run, a
    refused row takes none, a row finishing early leaves its time to the rest, and a row whose share is too
    small is skipped."""
    assert gc.budget_share(90.0, 2.0, 6.0) == 30.0 and gc.budget_share(-5.0, 1.0, 2.0) == 0.0
    assert gc.budget_share(10.0, 1.0, 0.0) == 0.0
    assert gc.row_weight("true") == 2 * gc.row_weight("false") == 2.0
    assert gc.reserve_s(60.0) == 3.0 and gc.reserve_s(420.0) == pytest.approx(12.6)

    clock = [0.0]
    monkeypatch.setattr(gc, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(gc, "matmul_rate", lambda device, n, seconds: {"method": "mm", "TFLOP/s": 1.0})
    monkeypatch.setattr(gc, "compile_known", lambda *a: True)
    monkeypatch.setattr(gc, "warm_imports", lambda methods: None)
    monkeypatch.setattr(gc, "_cleanup", lambda device: None)
    monkeypatch.setattr(gc, "preflight", lambda m, d, e, t, ov: "refused" if "precision=bf16" in ov else None)
    shares = []

    def run(m, p, c, ov, share, args, data):
        shares.append((m, p, c, share))
        clock[0] += share * (0.5 if (m, p, c) == ("dpgan", "fp32", "false") else 1.0)  # the first finishes early
        return {"notes": "", "s/step": 1.0}

    monkeypatch.setattr(gc, "run_variant", run)
    budget_min = 2.0  # 120 s, less a 3.6 s reserve
    rows = gc.main(["--device", "cpu", "--tiny", "--methods", "dpgan,gpate", "--budget", str(budget_min)], t_start=0.0)
    assert len(rows) == 1 + 2 * 3 * 2
    refused = [r for r in rows[1:] if r["notes"] == "failed: refused"]
    assert [(r["method"], r["precision"]) for r in refused] == [("dpgan", "bf16")] * 2 + [("gpate", "bf16")] * 2
    left = 120.0 - gc.reserve_s(120.0)
    weights = 2 * (1 + 2 + 1 + 2)  # two methods x (fp32, tf32) x (off 1, on 2)
    first = left * 1 / weights
    assert shares[0] == ("dpgan", "fp32", "false", pytest.approx(first))
    # the first row spent half its share: the other seven rows share the rest by weight
    rest = (left - first / 2) / (weights - 1)
    for m, p, c, share in shares[1:]:
        assert share == pytest.approx(rest * gc.row_weight(c)), (m, p, c)
    assert sum(s for *_, s in shares) == pytest.approx(left - first / 2 + first)

    # a budget too small for any row: every runnable row says so
    shares.clear()
    clock[0] = 0.0
    rows = gc.main(["--device", "cpu", "--tiny", "--methods", "dpgan", "--budget", "0.06"], t_start=0.0)
    assert not shares and [r["notes"].startswith("skipped") for r in rows[1:]].count(True) == 4


@pytest.mark.parametrize("budget", [None, 7])
def test_weights_give_feta_its_share(gc, monkeypatch, budget):
    """With the default --budget 6 (and with 7) and the default methods and variants, every feta row that runs gets
    at least its 100 s minimum (on an H200 a first paper-sized DP-SGD step of 28 s, then 15-16 s a step: two
    warm-up and three timed steps): the lowest-priority variants are skipped first and say so, every method keeps
    its fp32 baseline, and with 7 minutes feta keeps its bf16 eager row too."""
    rows = [(m, p, c) for m in gc.METHODS for p in gc.PRECISIONS for c in gc.COMPILES]
    assert gc.row_weight("false", "feta") == gc.METHOD_WEIGHT["feta"] * gc.row_weight("false", "dpgan")
    assert gc.MIN_ROW_S["feta"] == gc.MIN_ROW_S["dpdm"] == 100.0

    clock = [0.0]
    monkeypatch.setattr(gc, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(gc, "matmul_rate", lambda device, n, seconds: {"method": "mm", "TFLOP/s": 1.0})
    monkeypatch.setattr("dpgen.data.load_dataset", lambda *a, **k: None)
    monkeypatch.setattr(gc, "compile_known", lambda *a: True)
    monkeypatch.setattr(gc, "warm_imports", lambda methods: None)
    monkeypatch.setattr(gc, "_cleanup", lambda device: None)
    monkeypatch.setattr(gc, "preflight", lambda *a: None)
    shares = {}

    def run(m, p, c, ov, share, args, data):
        shares[m, p, c] = share
        clock[0] += share  # every row spends its whole share
        return {"notes": "", "s/step": 1.0}

    monkeypatch.setattr(gc, "run_variant", run)
    clock[0] = 30.0  # imports, data and the matmul before the rows
    out = gc.main(["--device", "cpu"] + ([] if budget is None else ["--budget", str(budget)]), t_start=0.0)
    feta = {k: v for k, v in shares.items() if k[0] == "feta"}
    assert ("feta", "fp32", "false") in feta and min(feta.values()) >= 100.0, feta
    assert (("feta", "bf16", "false") in feta) == (budget == 7)
    assert all((m, "fp32", "false") in shares for m in gc.METHODS)
    skipped = [r for r in out[1:] if r["notes"].startswith("skipped (budget)")]
    assert skipped and len(skipped) + len(shares) == len(rows)
    kept = max(gc.priority(p, c) for _, p, c in shares)
    assert all(gc.priority(r["precision"], "true" if r["compile"] == "on" else "false") >= kept
               for r in skipped)  # no kept row is of a lower priority than a skipped one
    assert sum(shares.values()) <= (budget or 6) * 60.0 - 30.0


def test_kernels_print_before_the_table(tmp_path):
    """--kernels 3 on --tiny --device cpu: for each method's fp32/compile-off row, the top 3 operators by self CPU
    time over one untimed step (gswgan: a pre-training warm-up iteration), printed before the table, which stays
    last; the JSON keeps them with their share of the step."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--tiny",
                           "--variants", "dpgan:fp32:false,gswgan:fp32:false,dpgan:bf16:false", "--kernels", "3",
                           # --tiny's 2 steps end each row; the budget (minutes) only caps a loaded machine's rows,
                           # and --tiny's default 0.75 can stop one before its profiled step there
                           "--budget", "4", "--out", str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = _table_lines(proc.stdout)
    assert proc.stdout.rstrip("\n").endswith("\n" + "\n".join(lines))
    body = [_cells(ln) for ln in lines[4:]]
    assert [b[:3] for b in body[1:]] == [["dpgan", "fp32", "off"], ["gswgan pre-training", "fp32", "off"],
                                         ["dpgan", "bf16", "off"]]
    before = proc.stdout[:proc.stdout.rindex(lines[0])].splitlines()
    for method in ("dpgan", "gswgan pre-training"):
        head = next(i for i, ln in enumerate(before) if ln.startswith(f"kernels {method} fp32 compile=off: top 3"))
        top = before[head + 1:head + 4]
        assert [ln.split(".")[0].strip() for ln in top] == ["1", "2", "3"], before[head:head + 4]
        assert all(" % " in ln and " s " in ln for ln in top)
    assert not any(ln.startswith("kernels dpgan bf16") for ln in before)  # the baseline rows only
    saved = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    for r in saved[1:3]:
        k = r["kernels"]
        assert k["activity"] == "CPU" and len(k["top"]) == 3 and not k["error"], k
        assert all(0 < e["share"] and e["s"] > 0 for e in k["top"])
        assert k["top"][0]["s"] >= k["top"][1]["s"] >= k["top"][2]["s"]
    assert "kernels" not in saved[3]


def test_a_compile_row_says_whether_torch_compile_ran(gc, monkeypatch):
    """With a ``compile`` key, a compile-on row whose training never reached torch.compile says it was not
    compiled (the check would otherwise pass an eager measurement off as a compiled one); one that did, says so."""
    compiled = []

    def fake_profile(method, *args, budget=None, overrides=None, data=None, first_steps=None):
        if "precision=tf32" in overrides:
            compiled.append(torch.compile(lambda x: x + 1))
        return {"s/step": 0.5, "TFLOP/s": 2.0, "peak GB": 1.0, "full run h": 3.0, "steps timed": 2}

    monkeypatch.setattr(gc.gp, "profile_one", fake_profile)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # what the check counts (dynamo stays unloaded)
    _no_data_or_matmul(gc, monkeypatch)
    monkeypatch.setattr(gc, "compile_known", lambda *a: True)
    monkeypatch.setattr(gc, "preflight", lambda *a: None)
    rows = gc.main(["--device", "cpu", "--tiny", "--methods", "dpgan", "--precisions", "fp32,tf32", "--budget", "0.5"],
                   t_start=time.perf_counter())
    notes = {(r["precision"], r["compile"]): r["notes"] for r in rows[1:]}
    assert notes[("fp32", "off")] == "2 steps timed"
    assert notes[("fp32", "on")] == "2 steps timed; torch.compile never called: not compiled"
    assert notes[("tf32", "on")] == notes[("tf32", "off")] == "2 steps timed; torch.compile called 1x, 0 graphs compiled"
    assert len(compiled) == 2


def test_set_reaches_the_rows_whose_method_has_the_key(gc, monkeypatch, capsys):
    """``--set feta.cuda_graph=true``: feta's rows run with it, dpgan's (no ``feta`` group) without, and the caption
    names it, so two checks in one call time a setting beside today's."""
    _no_data_or_matmul(gc, monkeypatch)
    seen = {}

    def run(m, p, c, ov, share, args, data):
        seen[m] = ov
        return {**gc.row_key(m, p, c), "notes": "", "s/step": 1.0}

    monkeypatch.setattr(gc, "run_variant", run)
    gc.main(["--device", "cpu", "--tiny", "--variants", "feta:fp32:false,dpgan:fp32:false",
             "--set", "feta.cuda_graph=true", "--set", "feta.ghost_conv=patches"], t_start=time.perf_counter())
    assert seen["feta"][-2:] == ["feta.cuda_graph=true", "feta.ghost_conv=patches"]
    assert not any(o.startswith("feta.") for o in seen["dpgan"])
    assert "feta.cuda_graph=true feta.ghost_conv=patches |" in _table_lines(capsys.readouterr().out)[0]


def test_a_variant_with_its_own_overrides_runs_beside_today(gc, monkeypatch, capsys):
    """``--variants``' fourth field: the same method and precision twice in one process, once with its own overrides
    (which reach that row only and start its notes), and a key the schema lacks refused in its row."""
    _no_data_or_matmul(gc, monkeypatch)
    seen = []

    def run(m, p, c, ov, share, args, data):
        seen.append(ov)
        return {**gc.row_key(m, p, c), "notes": "1 steps timed", "s/step": 1.0}

    monkeypatch.setattr(gc, "run_variant", run)
    rows = gc.main(["--device", "cpu", "--tiny", "--variants",
                    "gswgan:fp32:false,gswgan:fp32:false:ensemble.conv=batched+cudnn_benchmark=true,"
                    "gswgan:fp32:false:gswgan.no_such_key=1"], t_start=time.perf_counter())
    assert len(seen) == 2 and not any("ensemble.conv" in o for o in seen[0])
    assert seen[1][-2:] == ["ensemble.conv=batched", "cudnn_benchmark=true"]
    assert rows[1]["notes"] == "1 steps timed"
    assert rows[2]["notes"] == "ensemble.conv=batched cudnn_benchmark=true; 1 steps timed"
    assert rows[2]["overrides"] == "ensemble.conv=batched cudnn_benchmark=true"
    assert rows[3]["notes"].startswith("gswgan.no_such_key=1; failed: gswgan.no_such_key")
    with pytest.raises(SystemExit):
        gc.parse_args(["--variants", "gswgan:fp32:false:nokey"])
