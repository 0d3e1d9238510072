import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest


@pytest.fixture(scope="module")
def one_thread():
    """Batch-1 forwards gain little from threads, and OpenMP spin-waits badly on a busy machine."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
