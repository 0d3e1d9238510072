"""The whole-model check's original side: computed ahead in a thread (ReferenceAhead) it is what the
check computes itself, a failure there leaves the check to run and report it, and the float64 run
leaves the module's own state alone."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from superopt.driver.outcheck import OutputMismatch, ReferenceAhead, _float64, check_outputs, make_input_sets


class _Counting(torch.nn.Module):
    """A module that updates a buffer in place on every call (a step counter, a cache)."""

    def __init__(self, width: int):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("acc", torch.zeros(width))

    def forward(self, x):
        self.steps += 1
        self.acc += x.sum(0)
        return torch.tanh(self.lin(x)) + self.acc


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**16))
def test_the_outputs_computed_ahead_are_those_the_check_computes(width, rows, seed):
    torch.manual_seed(seed)
    m, x = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()), torch.randn(rows, width)
    ahead, memo = {}, {}
    ReferenceAhead(m, (x,), {}, ahead).join()
    check_outputs(m, m, make_input_sets((x,), {}, 1), 1e-4, memo)
    (want_a, exact_a), (want_c, exact_c) = ahead["examples"], memo["examples"]
    assert all((a == c).all() for a, c in zip(want_a + exact_a, want_c + exact_c))
    bad = lambda t: m(t) * 1.01  # noqa: E731
    assert isinstance(check_outputs(m, bad, make_input_sets((x,), {}, 1), 1e-4, ahead), OutputMismatch)


def test_a_reference_that_fails_ahead_leaves_the_check_to_say_so():
    calls = []

    def broken(x):
        calls.append(1)
        raise ValueError("the original cannot run")
    memo = {}
    ReferenceAhead(broken, (torch.ones(2),), {}, memo).join()
    assert memo == {} and calls == [1]
    try:
        check_outputs(broken, broken, make_input_sets((torch.ones(2),), {}, 1), 1e-4, memo)
    except ValueError as e:
        assert "cannot run" in str(e)
    else:
        raise AssertionError("the check ran a reference that fails")


def test_the_float64_run_changes_none_of_the_module_state():
    m = _Counting(3)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    x = torch.randn(2, 3)
    got = _float64(m)(x.double())
    assert got.dtype == torch.float64 and all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    copy = _Counting(3)
    copy.load_state_dict(before)
    assert torch.allclose(got, copy.double()(x.double()))


class _TwoPaths(torch.nn.Module):
    """A submodule reachable at two paths (``self.inner`` and ``self.layers``), as a wrapper keeps
    ``self.layers = inner.layers``; the weight also tied into a second module."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
        self.layers = self.inner
        self.inner[1].weight = self.inner[0].weight

    def forward(self, x):
        return self.inner(x)


def test_the_float64_run_puts_back_a_module_reachable_at_two_paths():
    """``functional_call`` swapped it twice and left the float64 copies in the module: the original
    then ran in float64 (a bf16 decode step failed on its cache write)."""
    m = _TwoPaths().to(torch.bfloat16)
    own = [id(t) for t in m.parameters()]
    x = torch.randn(2, 3, dtype=torch.bfloat16)
    got = _float64(m)(x.double())
    assert got.dtype == torch.float64
    assert [id(t) for t in m.parameters()] == own and {t.dtype for t in m.parameters()} == {torch.bfloat16}
    assert m.inner[1].weight is m.inner[0].weight and m(x).dtype == torch.bfloat16
    check = check_outputs(m, m, make_input_sets((x,), {}, 3))
    assert not isinstance(check, OutputMismatch) and {t.dtype for t in m.parameters()} == {torch.bfloat16}


class _Forgetful(_Counting):
    """Returns what _Counting returns, and counts its calls, but keeps no running sum."""

    def forward(self, x):
        self.steps += 1
        return torch.tanh(self.lin(x)) + self.acc + x.sum(0)


def test_state_updated_in_place_is_compared_and_put_back_after_every_call():
    """Buffers a model updates in place (``state``) count as outputs, and every call starts from
    the state the modules had: the same outputs on every input set in any order, a candidate
    that forgets an update refused at that buffer, both modules left as they were."""
    torch.manual_seed(0)
    ref, same, forgetful = _Counting(3), _Counting(3), _Forgetful(3)
    same.load_state_dict(ref.state_dict())
    forgetful.load_state_dict(ref.state_dict())
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    sets = make_input_sets((torch.randn(2, 3),), {})
    state = ("steps", "acc")
    memo = {}
    check = check_outputs(ref, same, sets, 1e-5, memo, state)
    assert not isinstance(check, OutputMismatch) and len(check.sets) == len(sets)
    again = check_outputs(ref, same, list(reversed(sets)), 1e-5, {}, state)  # another order, the same outputs
    assert again.sets == check.sets and check.worst < 1e-6
    wrong = check_outputs(ref, forgetful, sets, 1e-5, memo, state)
    assert isinstance(wrong, OutputMismatch) and wrong.output == 3  # output, x, steps, then acc
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in before.items())
    assert all(torch.equal(v, forgetful.state_dict()[k]) for k, v in before.items() if k != "lin.weight")


def test_a_bf16_program_is_checked_against_its_exact_float64_run():
    """An exported bf16 program names bf16 in its casts and dtype asserts; its float64 run widens
    them, so the check has an exact reference and allows the original's own bf16 rounding: the
    module generated from its graph passes (it was refused for rounding before), and one that
    scales an output by 1.1 does not (8 times the original's own bf16 error, ~0.4% at the
    largest element, is allowed: SLACK)."""
    from superopt.codegen import to_module
    from superopt.frontend import import_program
    from superopt.models import build
    model, x = build("llama_tiny_decode", batch_size=1, num_layers=2)
    model = model.to(torch.bfloat16)
    x = tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in x)
    ep = torch.export.export(model, tuple(t.clone() for t in x))
    g, _, sig = import_program(ep)
    ours, sets = to_module(g, sig), make_input_sets(x, {}, 2)
    assert _float64(ep.module())(*[t.double() if t.is_floating_point() else t for t in x]).dtype == torch.float64
    check = check_outputs(ep.module(), ours, sets, 1e-4)
    assert not isinstance(check, OutputMismatch) and check.worst > 1e-4  # bf16 rounding, allowed as the original's own
    off = lambda *a: ours(*a) * 1.1  # noqa: E731  (the step returns its hidden states; caches updated in place)
    wrong = check_outputs(ep.module(), off, sets, 1e-4)
    assert isinstance(wrong, OutputMismatch) and wrong.output == 0
