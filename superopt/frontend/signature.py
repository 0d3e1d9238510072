"""How a program is called: the pytree structure of its inputs and outputs.

``torch.export`` programs take ``(*args, **kwargs)`` whose leaves may sit in tuples, dicts and
registered dataclasses, and return any such structure (a Hugging Face ``ModelOutput``...).
The IR only knows flat, named inputs and ordered outputs; a :class:`Signature` keeps the rest:
the input and output tree specs and, for each input leaf, the name of the IR input it feeds.
Everything that runs an IR graph for the user binds inputs **by name** through it, so the
order of a graph's inputs never decides which tensor goes where.

>>> import torch
>>> sig = Signature.positional(["x", "y"], outputs=2)
>>> sig.named_inputs((torch.ones(1), torch.zeros(1)), {})["y"]
tensor([0.])
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.utils._pytree as pytree

from .errors import ModelImportError

__all__ = ["Signature", "StateBuffer", "SignatureModule", "signature_module", "import_pytree_types"]


@dataclass(frozen=True, eq=False)
class StateBuffer:
    """A buffer of the original module that the program updates in place (a KV cache kept in
    the model, as gpt-fast and transformers' ``executorch`` export keep it): IR input ``name``,
    the buffer's path ``target`` in the module (``layers.0.k_cache``), its value in the program."""

    name: str
    target: str
    initial: torch.Tensor


@dataclass(frozen=True)
class Signature:
    """Input/output structure of a program; ``names[k]`` is the IR input of input leaf ``k``.

    ``mutated`` names the IR inputs the program updates in place (a static KV cache): the IR
    graph is functional, so their new values are extra graph outputs after the program's own,
    in this order, and the module written back copies them into those inputs. ``state`` lists
    the IR inputs the caller does not pass: buffers of the module, updated in place (each also
    in ``mutated``); the module written back holds them, at the same paths as the original.
    ``out_dtypes``: the dtypes of the program's output leaves where its graph is not at the
    program's precision (the float32 form of a bf16 program, :mod:`superopt.driver.precision`),
    so that the code written back returns what the program returned (``logits.float()``);
    empty where the graph's own dtypes are the program's."""

    in_spec: Any
    out_spec: Any
    names: tuple[str, ...]
    mutated: tuple[str, ...] = ()
    state: tuple[StateBuffer, ...] = ()
    out_dtypes: tuple = ()

    @staticmethod
    def positional(names: Sequence[str], outputs: int) -> "Signature":
        """``f(x0, x1, ...)`` returning one tensor (``outputs == 1``) or a tuple."""
        _, in_spec = pytree.tree_flatten((tuple(range(len(names))), {}))
        out = 0 if outputs == 1 else tuple(range(outputs))
        return Signature(in_spec, pytree.tree_flatten(out)[1], tuple(names))

    @staticmethod
    def of_program(ep: torch.export.ExportedProgram, names: Sequence[str], mutated: Sequence[str] = (),
                   state: Sequence[StateBuffer] = ()) -> "Signature":
        """The signature of an exported program whose user inputs became IR inputs ``names``
        (and whose buffers updated in place became IR inputs ``state``)."""
        return Signature(ep.call_spec.in_spec, ep.call_spec.out_spec, tuple(names), tuple(mutated), tuple(state))

    @property
    def state_paths(self) -> tuple[str, ...]:
        """The paths of the buffers updated in place, in the module written back and the original."""
        return tuple(s.target for s in self.state)

    def flatten(self, args: tuple, kwargs: dict) -> list:
        """The input leaves of a call, in the program's order (keywords in any order)."""
        kw_spec = self.in_spec.child(1) if self.in_spec.num_children == 2 else None
        keys = list(kw_spec.context) if kw_spec is not None and kw_spec.type is dict else list(kwargs)
        if set(keys) != set(kwargs):
            raise TypeError(f"the program takes keyword inputs {keys}, got {sorted(kwargs)}")
        leaves, spec = pytree.tree_flatten((tuple(args), {k: kwargs[k] for k in keys}))
        if spec != self.in_spec:
            raise TypeError(f"the inputs do not have the program's structure: expected {self.in_spec}, got {spec}")
        return leaves

    def named_inputs(self, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
        """IR input name -> tensor for a call ``f(*args, **kwargs)``; the state buffers at
        their values in the program."""
        return {**dict(zip(self.names, self.flatten(args, kwargs))), **{s.name: s.initial for s in self.state}}

    def unflatten(self, outputs: Sequence) -> Any:
        """The program's output structure from the IR graph's outputs (without the new values
        of inputs updated in place, which come last)."""
        return pytree.tree_unflatten(list(outputs)[:len(outputs) - len(self.mutated)], self.out_spec)

    def parameters(self) -> inspect.Signature:
        """A Python signature for the call: positional parameters named after their IR inputs
        where an argument is one tensor (``args_K`` otherwise), then the keyword parameters."""
        pos = self.in_spec.child(0)
        params, k = [], 0
        for i in range(pos.num_children):
            child = pos.child(i)
            name = self.names[k] if child.is_leaf() and k < len(self.names) else f"args_{i}"
            params.append(name)
            k += child.num_leaves
        kw = self.in_spec.child(1)
        keys = list(kw.context) if kw.type is dict else []
        if len(set(params) | set(keys)) < len(params) + len(keys) or not all(p.isidentifier() for p in params):
            params = [f"args_{i}" for i in range(len(params))]
        P = inspect.Parameter
        return inspect.Signature([P("self", P.POSITIONAL_OR_KEYWORD)] + [P(n, P.POSITIONAL_OR_KEYWORD) for n in params]
                                 + [P(n, P.KEYWORD_ONLY) for n in keys])


class SignatureModule(torch.nn.Module):
    """Calls a flat module (inputs in ``input_order``) the way the original program is called:
    same positional and keyword inputs, same output structure; the state buffers updated in
    place are its own, at the original's paths (``model.layers.0.k_cache``)."""

    def __init__(self, flat: torch.nn.Module, sig: Signature, input_order: Sequence[str]):
        super().__init__()
        self.flat = flat
        self.sig = sig
        self.input_order = tuple(input_order)
        missing = set(self.input_order) - set(sig.names) - {s.name for s in sig.state}
        if missing:
            raise ModelImportError(f"the graph has inputs {sorted(missing)} that the program's signature lacks")
        for s in sig.state:
            _register_at(self, s.target, s.initial.detach().clone())

    def forward(self, *args, **kwargs):
        named = self.sig.named_inputs(args, kwargs)
        named.update({s.name: self.get_buffer(s.target) for s in self.sig.state})
        out = self.flat(*[named[n] for n in self.input_order])
        flat_out = list(out) if isinstance(out, (tuple, list)) else [out]
        if self.sig.mutated:  # inputs updated in place, as the original program does
            for name, value in zip(self.sig.mutated, flat_out[len(flat_out) - len(self.sig.mutated):]):
                named[name].copy_(value)
        return self.sig.unflatten(flat_out)


def _register_at(root: torch.nn.Module, path: str, value: torch.Tensor) -> None:
    """``value`` as the buffer at dotted ``path`` under ``root``, with plain modules between."""
    *parents, leaf = path.split(".")
    mod = root
    for i, part in enumerate(parents):
        if part not in mod._modules:
            if hasattr(mod, part):
                raise ModelImportError(f"the state buffer {path} cannot be kept at its path: "
                                       f"{'.'.join(parents[:i + 1])} is taken in the written module")
            mod.add_module(part, torch.nn.Module())
        mod = mod._modules[part]
    if hasattr(mod, leaf):
        raise ModelImportError(f"the state buffer {path} cannot be kept at its path: it is taken in the written module")
    mod.register_buffer(leaf, value)


_TYPE_NAME = re.compile(r'type\\*"\s*:\s*\\*"([A-Za-z_][\w.]*)')


def signature_module(flat: torch.nn.Module, sig: Signature, input_order: Sequence[str]) -> SignatureModule:
    """A :class:`SignatureModule` whose ``forward`` shows the original's parameter names, so the
    exported program's inputs keep their names (``x0``, ``input_ids``) instead of ``args_0``."""
    def forward(self, *args, **kwargs):
        return SignatureModule.forward(self, *args, **kwargs)
    forward.__signature__ = sig.parameters()
    cls = type("SuperoptModule", (SignatureModule,), {"forward": forward})
    return cls(flat, sig, input_order)


def import_pytree_types(model_json: str) -> list[str]:
    """Import the libraries of the pytree types a serialized program names (a Hugging Face
    ``ModelOutput``...) so that ``torch.export.load`` can rebuild them; returns the names of
    types still unknown afterwards (their library is not installed)."""
    unknown = []
    for name in sorted(set(_TYPE_NAME.findall(model_json))):
        if name in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE or name.startswith(("builtins.", "collections.")):
            continue
        parts = name.split(".")
        for k in range(len(parts) - 1, 0, -1):
            mod = ".".join(parts[:k])
            try:
                if importlib.util.find_spec(mod) is not None:
                    importlib.import_module(mod)
                    break
            except Exception:  # a broken or partial library: report the type as unknown below
                break
        if name not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE:
            unknown.append(name)
    return unknown
