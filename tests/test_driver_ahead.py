"""The zoo model built in a thread while ``superopt optimize`` imports (superopt.driver.ahead): the
same weights and inputs as the build in the caller's thread; its error raised where the model is
loaded; the load from it gives the graph the plain load gives."""

from __future__ import annotations

import pytest
import torch

from superopt.driver.ahead import BuiltAhead
from superopt.driver.model import load_model
from superopt.errors import SuperoptError
from superopt.ir.hashing import named_hash
from superopt.models import build


@pytest.mark.parametrize("name", ["gpt2_tiny_block", "llama_tiny_decode", "squeezenet1_1"])
def test_the_model_built_ahead_is_the_one_built_here(name):
    module, inputs = build(name)
    ahead = BuiltAhead(name)
    got_module, got_inputs = ahead.get()
    want = module.state_dict()
    assert list(got_module.state_dict()) == list(want)
    assert all(torch.equal(t, want[k]) for k, t in got_module.state_dict().items())
    assert len(got_inputs) == len(inputs) and all(torch.equal(a, b) for a, b in zip(got_inputs, inputs))
    assert ahead.get()[0] is got_module  # waited for once, kept


def test_an_unknown_name_is_raised_by_get_as_the_load_raises_it():
    ahead = BuiltAhead("no_such_model")
    with pytest.raises(SuperoptError, match="unknown model") as err:
        ahead.get()
    with pytest.raises(type(err.value), match="unknown model"):
        load_model(zoo="no_such_model")


def test_load_model_uses_the_build_ahead_only_for_the_same_call():
    """The graph loaded from the model built ahead is the plain load's; a build ahead for another
    model (or batch) is not used."""
    plain = load_model(zoo="gpt2_tiny_block")
    ahead = BuiltAhead("gpt2_tiny_block")
    assert named_hash(load_model(zoo="gpt2_tiny_block", ahead=ahead).graph) == named_hash(plain.graph)
    other = BuiltAhead("llama_tiny_decode")
    got = load_model(zoo="gpt2_tiny_block", ahead=other)
    assert named_hash(got.graph) == named_hash(plain.graph)
    other.get()
