"""GAN-Leaks attack primitives (dpgen.eval.mia) and a tiny end-to-end scripts/audit_mia.py run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_script
from dpgen.eval.mia import auc, gan_leaks_auc, nearest_distances
from inprocess import script


def _audit(capsys, monkeypatch, cwd, *args: str) -> tuple[int, str, str]:
    """``scripts/audit_mia.py args`` in this process (``main``: what ``sys.exit(main())`` exits with): a bad input
    is refused before any training, so the interpreter start-up a subprocess costs adds nothing to the test."""
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()  # compose() opens its own Hydra context
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("DPGEN_DATA", str(cwd / "data"))
    capsys.readouterr()
    code = script("audit_mia").main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_auc_perfect_reversed_and_ties():
    assert auc([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]) == 1.0
    assert auc([0.0, 1.0], [2.0, 3.0]) == 0.0
    assert auc([1.0, 1.0], [1.0, 1.0]) == 0.5  # every pair tied counts 1/2
    # hand count: pairs (m > n): 2>1, 2 vs 2 tie, 0<1, 0<2 -> (1 + 0.5) / 4
    assert auc([2.0, 0.0], [1.0, 2.0]) == pytest.approx(0.375)


def test_auc_matches_pairwise_definition_and_is_half_for_identical_distributions():
    rng = np.random.default_rng(0)
    m, n = rng.integers(0, 20, 300).astype(float), rng.integers(0, 20, 200).astype(float)  # many ties
    pairwise = ((m[:, None] > n[None]).sum() + 0.5 * (m[:, None] == n[None]).sum()) / (len(m) * len(n))
    assert auc(m, n) == pytest.approx(pairwise, abs=1e-12)
    a, b = rng.normal(size=5000), rng.normal(size=5000)
    assert auc(a, b) == pytest.approx(0.5, abs=0.02)
    assert auc(a + 1.0, b) > 0.7


def test_nearest_distance_hand_made():
    syn = np.array([[0.0, 0.0], [3.0, 4.0], [10.0, 0.0]])
    cand = np.array([[0.0, 0.0], [3.0, 0.0], [10.0, 1.0]])
    np.testing.assert_allclose(nearest_distances(cand, syn), [0.0, 3.0, 1.0])
    # per class: candidate 1 (class 1) may only use synthetic samples of class 1 ([3, 4] and [10, 0])
    np.testing.assert_allclose(nearest_distances(cand, syn, [0, 1, 1], [0, 1, 1]), [0.0, 4.0, 1.0])
    # chunking the synthetic pool gives the same answer; a class without samples gives inf
    np.testing.assert_allclose(nearest_distances(cand, syn, chunk=1), [0.0, 3.0, 1.0])
    assert np.isinf(nearest_distances(cand, syn, [0, 2, 1], [0, 1, 1])[1])
    with pytest.raises(ValueError):
        nearest_distances(cand, syn, [0, 1, 1], None)


def test_gan_leaks_separates_copies_from_fresh_samples():
    rng = np.random.default_rng(1)
    members, nonmembers = rng.normal(size=(32, 1, 4, 4)), rng.normal(size=(32, 1, 4, 4))
    noise = rng.normal(size=(500, 1, 4, 4))
    leaky = np.concatenate([members + 0.01 * rng.normal(size=members.shape), noise])  # memorised copies
    assert gan_leaks_auc(members, nonmembers, leaky)["auc"] == 1.0
    assert abs(gan_leaks_auc(members, nonmembers, noise)["auc"] - 0.5) < 0.2


@pytest.mark.slow
def test_audit_script_end_to_end_on_digits(tmp_path):
    out = tmp_path / "mia"
    res = run_script("audit_mia.py", "--method", "dpaf", "--dataset", "digits", "--members", "16", "--eps", "5",
                     "--syn-per-class", "20", "--out", str(out), "--", "dpaf.c_epochs=1", "dpaf.d_epochs=2",
                     "dpaf.batch_size=2", "dpaf.width=4", "dpaf.fc_hidden=8", "dpaf.g_width=8", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "mia.json").read_text())
    assert [r["name"] for r in report["runs"]] == ["plain", "eps=5"]
    dp = report["runs"][1]
    assert dp["valid_dp_guarantee"] is True and dp["epsilon"] <= 5.0
    for r in report["runs"]:  # an AUC over 16 x 16 pairs (ties count 1/2): a multiple of 1/512, rounded to 4 decimals
        assert r["auc"] * 512 == pytest.approx(round(r["auc"] * 512), abs=0.03) and r["member_dist_mean"] > 0, r
    assert "MIA AUC dpaf/digits 16 members" in res.stdout


def test_audit_script_rejects_too_many_members(tmp_path):
    """The one bad-input case run as a real process: its exit code is main()'s (the others call main in-process)."""
    res = run_script("audit_mia.py", "--method", "dpaf", "--dataset", "digits", "--members", "5000",
                     "--out", str(tmp_path / "m"), cwd=tmp_path)
    assert res.returncode == 2 and "--members" in res.stderr


@pytest.mark.parametrize("args, needle", [
    (["--eps", "-1"], "epsilon"),                      # caught before the baseline trains
    (["--method", "nope"], "method/nope"),
    (["--eps", "1", "--", "dpaf.no_such_key=3"], "bad config"),
    (["--baseline", "foo"], "--baseline"),
    (["--method", "gpate", "--baseline", "plain"], "dpaf only"),
])
def test_audit_script_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, args, needle):
    out = tmp_path / "m"
    code, _, err = _audit(capsys, monkeypatch, tmp_path, "--method", "dpaf", "--dataset", "digits", "--out", str(out),
                          *args)
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err[-2000:]
    assert not out.exists()


def test_audit_script_never_reuses_an_existing_out_directory(tmp_path, capsys, monkeypatch):
    out = tmp_path / "m"
    out.mkdir()
    (out / "mia.json").write_text('{"keep": 1}')
    code, _, err = _audit(capsys, monkeypatch, tmp_path, "--method", "dpaf", "--dataset", "digits", "--out", str(out))
    assert code == 2 and "already holds files" in err
    assert (out / "mia.json").read_text() == '{"keep": 1}' and sorted(p.name for p in out.iterdir()) == ["mia.json"]
