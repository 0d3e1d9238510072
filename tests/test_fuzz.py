"""Fuzzing: random small models through `optimize`, reloaded and compared; random and damaged
files through every command that reads them. ``scripts/fuzz.py --count N`` runs more and prints
the table of the README's reliability section."""

import random
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import fuzzmodels

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import fuzz  # noqa: E402

FAST = ["--example-rules", "--quiet", "--budget", "30", "--time-limit", "5"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10**6))
def test_a_random_model_is_optimized_and_called_the_same_way(seed, folder):
    from superopt.cli import main
    from superopt.driver.outcheck import OutputMismatch, check_outputs, make_input_sets
    model, args, kwargs = fuzzmodels.build(seed)
    src, out = folder / f"h{seed}.pt2", folder / f"h{seed}.opt.pt2"
    torch.export.save(torch.export.export(model, args, kwargs), str(src))
    rc = main(["optimize", str(src), "-o", str(out), *FAST])
    if rc == 2:  # refused (e.g. nothing but opaque operators): nothing written
        assert not out.exists()
        return
    assert rc == 0
    loaded = torch.export.load(str(out)).module()
    got, want = loaded(*args, **kwargs), model(*args, **kwargs)
    assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(want)
    assert not isinstance(check_outputs(model, loaded, make_input_sets(args, kwargs, seed=seed)), OutputMismatch)


def test_300_models_reloaded_in_fresh_processes(tmp_path):
    """The CI share of the fuzz: optimized in batches in worker processes, checked in others."""
    results = fuzz.fuzz_models(start=0, count=300, batch=150, workers=2, folder=tmp_path,
                               flags=FAST)
    assert len(results) == 300
    bad = [r for r in results if r["status"] in ("crash", "mismatch")]
    assert not bad, bad[:3]
    assert sum(r["status"] == "ok" for r in results) >= 250


def test_damaged_files_get_one_line_errors(tmp_path):
    originals = fuzz.make_originals(tmp_path)
    seed = random.randrange(10**6)
    rows = fuzz.files_worker(originals, count=25, seed=seed, folder=tmp_path)
    unclean = [r for r in rows if not r["clean"]]
    assert not unclean, (f"seed {seed} (fuzz.files_worker(originals, 25, {seed}, folder) again)", unclean[:2])
    assert sum(r["refused"] for r in rows) >= len(rows) // 2


def test_bf16_models_reloaded_in_fresh_processes(tmp_path):
    """The same in bf16: the import of a half-precision program (its float32 form, or as it is)
    and the program written back (with the float32 form's checks writing into the program's
    buffers, as until session 53, seeds 6, 7, 23 and others came back from another state of
    their running-average buffer or cache)."""
    results = fuzz.fuzz_models(start=0, count=30, batch=30, workers=1, folder=tmp_path, flags=FAST, dtype="bf16")
    assert len(results) == 30
    bad = [r for r in results if r["status"] in ("crash", "mismatch")]
    assert not bad, bad[:3]
    assert sum(r["status"] == "ok" for r in results) >= 26


def test_models_through_the_backend_equal_eager(tmp_path):
    """``torch.compile(backend="superopt")`` on random models, float32 and bf16, half of them
    handed on unsearched (the import, the code and its casts back at bf16), checked against the
    model run eagerly with its buffers compared after every call."""
    results = fuzz.fuzz_models(start=0, count=16, batch=16, workers=1, folder=tmp_path, dtype="mixed", door="backend")
    assert len(results) == 16
    bad = [r for r in results if r["status"] != "ok"]
    assert not bad, bad[:3]
