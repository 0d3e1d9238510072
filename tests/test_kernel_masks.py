"""A decode step whose attention mask the batch shares (gpt-fast's [1, 1, l, s], transformers'
executorch export's) gets the kernels measured on the step given transformers' [b, 1, l, s] mask:
the mask is expanded to the batch (a view; the identity proven), and the whole-model verdict of
the step with its mask passed in carries over (the same candidate regions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from superopt.codegen.export import to_module
from superopt.driver import LoadedModel
from superopt.kernel.choose import choose_kernels, model_signature
from superopt.kernel.masks import expand_shared_masks, mask_expand_rule, reads_expanded_mask
from superopt.kernel.profile import KernelProfile, ModelVerdict
from superopt.kernel.verify import Identity, check_identity
from superopt.models import build

from kernel_regions import profile_of_first_candidates
from zoo_programs import loaded_by_hand


def _step(mask: str, batch: int = 2) -> LoadedModel:
    return loaded_by_hand(f"llama_tiny_decode/{mask}", *build("llama_tiny_decode", batch_size=batch, mask=mask))


def _mask_of_sdpa(g):
    (i,) = [i for i, n in enumerate(g.nodes) if n.op == "sdpa"]
    return g.type_of(g.nodes[i].inputs[3]).shape


@pytest.mark.parametrize("form", [(1, False, False, True), (0, False, False, True), (1, True, True, True),
                                  (0, False, True, False), (1, False, True, True, 2), (0, False, False, True, 2),
                                  (1, True, True, True, 3), (0, False, True, True, 3), (1, False, False, True, 1)])
def test_the_expansion_is_a_proven_identity_in_every_form(form):
    assert check_identity(Identity("mask", mask_expand_rule(*form))).startswith("proven")


class _Attend(torch.nn.Module):
    """One query per sequence over keys and values given, with a mask of whatever rank the caller
    passes (torch's attention takes ``[l, s]`` and ``[heads, l, s]`` too; a rank-1 ``[s]`` runs in
    eager but does not export)."""

    def __init__(self):
        super().__init__()
        self.q, self.o = torch.nn.Linear(32, 32, bias=False), torch.nn.Linear(32, 32, bias=False)

    def forward(self, x, k, v, mask):
        b = x.shape[0]
        q = self.q(x).view(b, 1, 4, 8).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(a.transpose(1, 2).reshape(b, 1, 32))


def _attend(batch: int, mask_shape: tuple) -> LoadedModel:
    torch.manual_seed(0)
    module = _Attend().eval()
    mask = torch.zeros(mask_shape)
    mask[..., 20:] = -1e9
    inputs = (torch.randn(batch, 1, 32), torch.randn(batch, 4, 24, 8), torch.randn(batch, 4, 24, 8), mask)
    return loaded_by_hand(f"attend/{mask_shape}", module, inputs)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("mask_shape", [(1, 24), (1, 1, 24), (4, 1, 24)], ids=["rank2", "rank3", "rank3-per-head"])
def test_a_mask_of_rank_2_or_3_gets_the_kernel_measured_with_the_rank_4_mask(batch, mask_shape):
    """Before, its attention region's signature (mask ``[1, 24]``) matched no measured kernel, at
    any batch: it stayed Inductor's ("not measured"); now the mask is read as ``[b, 1, 1, 24]``."""
    measured = (batch, 4 if mask_shape[0] == 4 else 1, 1, 24)
    prof = profile_of_first_candidates(_attend(batch, measured).graph)
    built = _attend(batch, mask_shape)
    h, rep = choose_kernels(built.graph, None, "test-gpu", "fp32", prof)
    assert [r.decision for r in rep.regions if r.kind == "attention"] == ["kernel"], rep.table()
    assert rep.masks == 1 and reads_expanded_mask(h)
    h.check()
    got = to_module(h, built.signature)(*built.inputs)
    np.testing.assert_allclose(got.detach().numpy(), built.reference(*built.inputs).detach().numpy(),
                               rtol=1e-4, atol=1e-4)


def test_a_shared_mask_is_expanded_only_at_a_batch_above_one():
    one, two = _step("positions", batch=1), _step("positions", batch=2)
    assert _mask_of_sdpa(one.graph)[0] == 1 and expand_shared_masks(one.graph) == (one.graph, 0)
    g, n = expand_shared_masks(two.graph)
    assert n == 1 and _mask_of_sdpa(g)[0] == 2
    g.check()
    got = to_module(g, two.signature)(*two.inputs)
    want = two.reference(*two.inputs)
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert not reads_expanded_mask(g)   # no kernel yet


def test_its_attention_gets_the_kernel_measured_with_the_batch_axis_and_the_outputs_hold():
    given, built = _step("input"), _step("positions")
    assert _mask_of_sdpa(given.graph)[0] == 2 and _mask_of_sdpa(built.graph)[0] == 1
    prof = profile_of_first_candidates(given.graph)
    h, rep = choose_kernels(built.graph, None, "test-gpu", "fp32", prof)
    att = [r for r in rep.regions if r.kind == "attention"]
    assert att and att[0].decision == "kernel", rep.table()
    assert rep.masks == 1 and reads_expanded_mask(h) and "expanded to it" in rep.table()
    h.check()
    want = built.reference(*built.inputs)
    got = to_module(h, built.signature)(*built.inputs)
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4, atol=1e-4)
    # no kernel for the attention: the mask is left as it was
    prof = profile_of_first_candidates(given.graph, skip=("attention",))
    h, rep = choose_kernels(built.graph, None, "test-gpu", "fp32", prof)
    assert rep.masks == 0 and not any(n.op == "expand" and h.type_of(n.inputs[0]).shape[0] == 1 and
                                      n.types[0].shape[0] == 2 and len(n.types[0].shape) == 4 for n in h.nodes)


def test_the_verdict_of_the_step_given_its_mask_carries_over_to_the_same_regions():
    """Kernels under the margin alone (1.0 against 1.05 us) are kept where the whole-model verdict
    of the step given its mask kept them: the step building its mask has the same candidate regions,
    so that verdict decides for it too (said in the report). A verdict whose candidates differ by
    one region does not."""
    given, built = _step("input"), _step("positions")
    prof = profile_of_first_candidates(given.graph, us=1.0, inductor_us=1.05)
    trial = choose_kernels(given.graph, None, "test-gpu", "fp32", prof, margin=0.0, proved=False)[1]   # as tune does
    sigs = tuple(sorted({r.signature for r in trial.regions if r.decision == "kernel"}))
    assert choose_kernels(built.graph, None, "test-gpu", "fp32", prof)[1].chosen == 0
    other = KernelProfile(dict(prof.entries))
    other.add_model(ModelVerdict("x", "fp32", "test-gpu", sigs, 9.0, 10.0, tried=(((), 10.0), (sigs + ("extra",), 9.0)),
                                 model="another model"))
    assert choose_kernels(built.graph, None, "test-gpu", "fp32", other)[1].chosen == 0
    prof.add_model(ModelVerdict(model_signature(given.graph), "fp32", "test-gpu", sigs, 9.0, 10.0,
                                tried=(((), 10.0), (sigs, 9.0)), model="llama_tiny_decode"))
    h, rep = choose_kernels(built.graph, None, "test-gpu", "fp32", prof)
    assert rep.chosen == trial.chosen >= 3 and rep.verdict["carried_from"] == "llama_tiny_decode", rep.table()
    assert "measured on llama_tiny_decode" in rep.table()
    # its own graph's verdict is not "carried"
    assert choose_kernels(given.graph, None, "test-gpu", "fp32", prof)[1].verdict["carried_from"] is None
