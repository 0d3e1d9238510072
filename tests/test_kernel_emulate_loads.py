"""The emulator's slice loads (interior tiles, and the edge tiles of masked loads, zero-padded)
read exactly what its general gather reads: every
candidate of the test regions, at the emulation blocks, the largest tuning blocks and blocks of
16, in float64 and in the field, with slices on and off."""

import numpy as np
import pytest
from kernel_regions import attention, gate_up, masked_sdpa, program_inputs, rmsnorm_matmul

from superopt.kernel import emulate as em
from superopt.kernel.configs import default_configs
from superopt.kernel.emulate import default_emulation_config
from superopt.kernel.generate import generate_kernels
from superopt.kernel.program import TileConfig
from superopt.kernel.semantics import run_field, run_reference
from superopt.semantics.field import Field

REGIONS = {
    "rmsnorm_matmul": lambda: rmsnorm_matmul(m=5, k=64, n=40),
    "gate_up": lambda: gate_up(m=3, k=48, n=40),
    "gqa_attention": lambda: attention(h=4, kvh=2, l=5, s=48, d=16),
    "causal_attention": lambda: attention(h=2, kvh=2, l=20, s=20, d=16, causal=1),
    "masked_decode": lambda: masked_sdpa(h=4, kvh=2, l=1, s=48, d=16, mask_shape=(1, 1, 1, 48)),
    "head_dim_24": lambda: attention(h=4, kvh=4, l=1, s=40, d=24),   # every head tile padded (Phi-3's 96)
}


def _configs(p):
    sixteen = TileConfig(tuple((d, 16) for d in p.tiled_dims()))
    return [default_emulation_config(p), default_configs(p)[-1], sixteen]


@pytest.mark.parametrize("name", sorted(REGIONS))
def test_slice_loads_equal_the_gather(name, monkeypatch):
    region = REGIONS[name]()
    cands = generate_kernels(region, verify=False).candidates
    assert cands
    used = []
    real = em._block

    def counted(*a):
        block = real(*a)
        used.append(block is not None)
        return block
    sliced = []
    for cand in cands:
        p = cand.program
        ins = program_inputs(region, cand)
        fins = {k: np.random.default_rng(7).integers(0, 2**31 - 1, np.shape(v)) for k, v in ins.items()}
        for cfg in _configs(p):
            runs = {}
            for fast in (True, False):
                monkeypatch.setattr(em, "_block", counted if fast else lambda *a: None)
                used.clear()
                ref = run_reference(p, ins, cfg)
                fld = run_field(p, fins, Field(0), np.random.default_rng(1), cfg)
                runs[fast] = ref, fld, any(used)
            assert not runs[False][2]
            sliced.append(runs[True][2])
            for a, b in zip(runs[True][0], runs[False][0]):
                assert np.array_equal(a, b, equal_nan=True), (name, cfg.text())
            for a, b in zip(runs[True][1], runs[False][1]):
                assert np.array_equal(a, b), (name, cfg.text())
    assert any(sliced)   # slices were taken (an interior tile somewhere)


def test_an_edge_tile_is_sliced_only_where_the_load_is_masked():
    """A masked edge tile reads its valid lanes and zeros; an unmasked one reads past the edge
    (garbage, which only the gather emulates)."""
    from types import SimpleNamespace
    from superopt.kernel.program import Axis, Stmt
    tile = em._Tile(SimpleNamespace(dim_sizes={"E": 24}), {"E": 32}, {})
    tile.set("E", 0)
    src = np.arange(24, dtype=np.float64) + 1
    s = Stmt("load", "t", (), tensor="x", index=(Axis("E"),))
    got = em._block(tile, s, ("E",), src, (24,), masked=True)
    assert got.shape == (1, 32) and np.array_equal(got[0], np.concatenate([src, np.zeros(8)]))
    assert em._block(tile, s, ("E",), src, (24,), masked=False) is None
