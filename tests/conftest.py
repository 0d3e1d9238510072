import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# The processes the tests start run one intra-op thread too (a test that wants more says so).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest


@pytest.fixture(autouse=True)
def _one_thread():
    """Every test starts with one intra-op thread, whatever the test before it (an ``optimize``
    picks its own count) left: batch-1 forwards gain little from threads, and OpenMP spin-waits
    badly on a busy machine (NASNet's forward took 0.1 s with 1 thread and 1.7 to 4.8 s with 2
    on 2 cores at load 2.5, with the suite's own worker processes running beside it)."""
    import torch
    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _instance_proofs_in_a_temporary_cache(tmp_path_factory):
    """Searches keep their instance proofs in a cache file of the session, never in the shipped
    rules/default.db (which would take them, being a writable schema-2 database)."""
    import os
    old = os.environ.get("SUPEROPT_PROOF_CACHE")
    os.environ["SUPEROPT_PROOF_CACHE"] = str(tmp_path_factory.mktemp("proofs") / "instance_proofs.db")
    yield
    if old is None:
        os.environ.pop("SUPEROPT_PROOF_CACHE", None)
    else:
        os.environ["SUPEROPT_PROOF_CACHE"] = old


@pytest.fixture(autouse=True, scope="session")
def _compiled_rules_in_a_temporary_cache(tmp_path_factory):
    """The searches' compiled rules (superopt.search.compiled) go to a folder of the session, not
    the user's ~/.cache (a test that wants another says so)."""
    old = os.environ.get("SUPEROPT_COMPILE_CACHE")
    os.environ["SUPEROPT_COMPILE_CACHE"] = str(tmp_path_factory.mktemp("compiled"))
    yield
    if old is None:
        os.environ.pop("SUPEROPT_COMPILE_CACHE", None)
    else:
        os.environ["SUPEROPT_COMPILE_CACHE"] = old


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small exported model (conv -> ReLU -> mean -> two linears of one value: the merge of
    matmuls applies) loaded as the driver loads a .pt2."""
    import torch
    from superopt.driver import load_model

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False)
            self.a, self.b = torch.nn.Linear(8, 6, bias=False), torch.nn.Linear(8, 5, bias=False)

        def forward(self, x):
            z = torch.relu(self.conv(x)).mean(dim=(2, 3))
            return self.a(z), self.b(z)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("m") / "tiny.pt2"
    torch.export.save(torch.export.export(Tiny().eval(), (torch.randn(1, 4, 8, 8),)), str(path))
    return load_model(str(path))
