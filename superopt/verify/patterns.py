"""Axioms as directed rewrites over the one typed e-graph: their directions and instantiation.

An axiom ``lhs == rhs`` gives two :class:`Direction` s: match ``lhs`` and build ``rhs``, and
the reverse. A direction is usable when the built side uses no tensor variable the pattern
does not bind, and every attribute variable of the built side is bound by the pattern, is a
dimension of a bound tensor (``shapes`` templates), is defined by a condition ``v == expr``, or
appears in at least as many conditions as there are such unknowns (then Z3 solves for them at
match time, and the instance is used only when the solution is unique). A
direction whose pattern is a bare variable (``x => transpose(transpose(x))``) matches every
term, so it is an *expansion*: applied once, to the rule's outputs, never to the terms it
makes (that would not terminate). An expansion whose attributes the bare variable cannot
determine (``x => concat(split(x, sizes=(m, k))[0], split(x, sizes=(m, k))[1])``: which ``m``?)
is *triggered* instead: a sub-term of its built side that mentions the variable and binds every
attribute (``split(x, sizes=(m, k))[0]``) is matched on the e-graph like a pattern, and the
variable's class is the one the built side is merged into. Such an expansion only reuses terms
already present (the trigger), so it may run every round.

A direction's matched term is compiled once into the one pattern form
(:func:`superopt.pattern.compile.compile_term`) and matched by the one e-matcher
(:func:`superopt.pattern.ematch.match_classes`), attributes bound by
:func:`superopt.pattern.attrs.bind_attrs`. Attributes a term leaves out stand for their
declared defaults, as in ``superopt specs check``.
An instance is applied only where every condition holds at the concrete shapes and both sides
are well-formed with the same type: exactly the instances the numeric axiom check tries.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import z3

from ..axioms.parse import attr_var_uses
from ..axioms.terms import (ALit, ATuple, AVar, Axiom, Call, Var, cond_names, eval_attr, eval_cond, rules_hold,
                            term_vars)
from ..ir.ops import REQUIRED, canonical_attrs, get_op
from ..pattern.attrs import normalized_attrs
from ..pattern.compile import Pattern, compile_term
from ..pattern.egraph import EGraph, infer_types
from ..pattern.ematch import match_classes
from .z3enc import Z3Terms

__all__ = ["Direction", "directions_of", "match", "instantiate", "term_of"]


@dataclass(frozen=True)
class Direction:
    """Match ``pattern``, build ``build``; ``attr_pats`` holds, per pattern call (by id), its
    attribute patterns for every attribute of the operator in sorted name order."""
    axiom: Axiom
    pattern: Call
    build: object
    ops: frozenset
    defs: tuple        # ((var, expr), ...) evaluated in order
    unknowns: tuple    # variables solved with Z3 at match time
    attr_pats: dict
    expansion: bool = False  # the pattern is a bare variable: applied to the rule's outputs only
    trigger: Call | None = None  # a triggered expansion: match this sub-term of ``build`` instead

    @cached_property
    def compiled(self) -> Pattern:
        """What is matched, compiled once into the one pattern form (superopt.pattern)."""
        return compile_term(self.matched, self.attr_pats, f"axiom:{self.name}:{id(self)}")

    @property
    def matched(self) -> Call:
        """What is matched on the e-graph: the trigger, or the pattern."""
        return self.trigger if self.trigger is not None else self.pattern

    @property
    def name(self) -> str:
        return self.axiom.name


def _calls(t):
    if isinstance(t, Call):
        yield t
        for a in t.args:
            yield from _calls(a)


def _attr_patterns(call: Call):
    """Sorted-by-name attribute patterns with defaults filled in, or None if one is missing."""
    given = dict(call.attrs)
    out = []
    for a in sorted(get_op(call.op).attrs, key=lambda a: a.name):
        p = given.get(a.name)
        if p is None:
            if a.default is REQUIRED:
                return None
            p = ALit(a.normalize(a.default) if a.default is not None else None)
        elif isinstance(p, ALit):
            p = ALit(a.normalize(p.value))
        out.append(p)
    return tuple(out)


def _bound_names(ax: Axiom, pattern) -> set[str]:
    bound = {v for c in _calls(pattern) for _, p in c.attrs for v in _pat_names(p)}
    for v in set(term_vars(pattern)):
        bound |= {d for d in ax.shapes.get(v, ()) if isinstance(d, str)}
    return bound


def _pat_names(p):
    if isinstance(p, AVar):
        return [p.name]
    if isinstance(p, ATuple):
        return [n for x in p.items for n in _pat_names(x)]
    return []


def _definitions(ax: Axiom, known: set[str], needed: set[str]):
    """Definitions ``v == expr`` in an order where each uses only known names, then the
    variables left to solve; None when those are under-determined."""
    defs, known = [], set(known)
    progress = True
    while progress:
        progress = False
        for c in ax.where:
            if c[0] != "==":
                continue
            for a, b in ((c[1], c[2]), (c[2], c[1])):
                if a[0] == "var" and a[1] not in known and cond_names(b) <= known:
                    defs.append((a[1], b))
                    known.add(a[1])
                    progress = True
    unknown = needed - known
    if unknown:
        constraints = [c for c in ax.where if cond_names(c) & unknown]
        if len(constraints) < len(unknown) or not all(_is_int(ax, v) for v in unknown):
            return None
    return tuple(defs), tuple(sorted(unknown))


def _is_int(ax: Axiom, v: str) -> bool:
    """Is attribute variable ``v`` one integer (so that Z3 can solve for it)?"""
    use = attr_var_uses(ax).get(v)
    return use is None or use[2] == "item" or get_op(use[0]).attr_index[use[1]].kind == "int"


def _needed(ax: Axiom, build) -> set[str]:
    needed = {v for c in _calls(build) for _, p in c.attrs for v in _pat_names(p)}
    return needed | {n for c in ax.where for n in cond_names(c)}


def _trigger(ax: Axiom, var: Var, build):
    """A sub-term of ``build`` that mentions ``var`` and determines every attribute of the
    built side (the smallest such), with its definitions; None when there is none."""
    needed = _needed(ax, build)
    for t in sorted(_calls(build), key=lambda c: len(list(_calls(c)))):
        if t is build or var.name not in term_vars(t) or set(term_vars(build)) - set(term_vars(t)):
            continue
        pats = {id(c): _attr_patterns(c) for c in _calls(t)}
        found = None if None in pats.values() else _definitions(ax, _bound_names(ax, t), needed)
        if found is not None and not found[1]:
            return t, pats, found
    return None


def _direction(ax: Axiom, pattern, build):
    """One direction, or the reason it is not usable."""
    if set(term_vars(build)) - set(term_vars(pattern)):
        return "builds tensor variables the pattern does not bind"
    pats = {id(c): _attr_patterns(c) for c in _calls(pattern)}
    if any(p is None for p in pats.values()):
        return "the pattern leaves out a required attribute"
    found = _definitions(ax, _bound_names(ax, pattern), _needed(ax, build))
    expansion = isinstance(pattern, Var)
    if found is None and expansion:
        trig = _trigger(ax, pattern, build)
        if trig is not None:
            t, pats, found = trig
            return Direction(ax, pattern, build, frozenset(c.op for c in _calls(t)), found[0], found[1], pats,
                             True, t)
    if found is None:
        return "attributes of the built side are not determined by the pattern"
    ops = frozenset(c.op for c in _calls(pattern))
    return Direction(ax, pattern, build, ops, found[0], found[1], pats, expansion)


def directions_of(ax: Axiom) -> tuple[list[Direction], list[str]]:
    """The usable directions of an axiom, and why the others are not usable."""
    out, why = [], []
    for pattern, build, tag in ((ax.lhs, ax.rhs, "left-to-right"), (ax.rhs, ax.lhs, "right-to-left")):
        d = _direction(ax, pattern, build)
        if isinstance(d, str):
            why.append(f"{tag}: {d}")
        else:
            out.append(d)
    return out, why


# ---- matching --------------------------------------------------------------------------------

def match(eg: EGraph, d: Direction, roots):
    """Every match of ``d.matched`` whose top is in one of the classes ``roots``, by the one
    e-matcher: yields ``(root, tensor env, attribute env)``."""
    pat = d.compiled
    names = pat.var_names
    for root, _, binds, env in match_classes(eg, pat, roots):
        yield root, dict(zip(names, binds)), env


# ---- instantiation ---------------------------------------------------------------------------

def _complete(eg: EGraph, d: Direction, tenv: dict, aenv: dict):
    """Bind dimensions, apply definitions, solve unknowns, test conditions: the attribute
    environment and the shapes, or None when this match is not an instance."""
    env = dict(aenv)
    shapes = {v: eg.types[eg.find(c)].shape for v, c in tenv.items()}
    for v, tpl in d.axiom.shapes.items():
        shape = shapes.get(v)
        if shape is None:
            continue
        if len(shape) != len(tpl):
            return None
        for want, got in zip(tpl, shape):
            if isinstance(want, int):
                if want != got:
                    return None
            elif env.setdefault(want, got) != got:
                return None
    if not rules_hold(d.axiom.rules, shapes):
        return None
    try:
        for v, e in d.defs:
            val = eval_cond(e, env, shapes)
            if env.setdefault(v, val) != val:
                return None
        if d.unknowns and not _solve(d, env, shapes):
            return None
        if not all(eval_cond(c, env, shapes) for c in d.axiom.where):
            return None
    except (KeyError, IndexError, ZeroDivisionError, TypeError):
        return None
    return env, shapes


_Z3_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
           "//": lambda a, b: a / b, "%": lambda a, b: a % b, "==": lambda a, b: a == b,
           "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
           ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _to_z3(e, env, shapes, unknown):
    tag = e[0]
    if tag == "int":
        return z3.IntVal(e[1])
    if tag == "var":
        return unknown[e[1]] if e[1] in unknown else z3.IntVal(env[e[1]])
    if tag in ("dim", "rank"):
        return z3.IntVal(eval_cond(e, env, shapes))
    if tag in _Z3_OPS:
        return _Z3_OPS[tag](_to_z3(e[1], env, shapes, unknown), _to_z3(e[2], env, shapes, unknown))
    parts = [_to_z3(x, env, shapes, unknown) for x in e[1:]]
    return {"and": z3.And, "or": z3.Or}[tag](*parts) if tag != "not" else z3.Not(parts[0])


def _solve(d: Direction, env: dict, shapes: dict) -> bool:
    """Fix the unknown attribute variables from the conditions, if they have one solution
    (memoized on what the conditions read: the same question recurs across matches)."""
    names, tensors = _reads(d.axiom)
    key = (id(d), tuple(env.get(n) for n in names), tuple(shapes.get(t) for t in tensors))
    found = _SOLVED.get(key)
    if found is None:
        if len(_SOLVED) > 100_000:
            _SOLVED.clear()
        found = _SOLVED[key] = _solve_z3(d, env, shapes)
    if found is False:
        return False
    env.update(found)
    return True


_SOLVED: dict = {}


def _tensors_in(e) -> set[str]:
    if e[0] in ("dim", "rank"):
        return {e[1]}
    return set().union(*(_tensors_in(x) for x in e[1:] if isinstance(x, tuple)))


def _reads(ax: Axiom) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The integer names and the tensors (through dim/rank) an axiom's conditions read."""
    names = sorted({n for c in ax.where for n in cond_names(c)})
    tensors = sorted({t for c in ax.where for t in _tensors_in(c)})
    return tuple(names), tuple(tensors)


def _solve_z3(d: Direction, env: dict, shapes: dict):
    unknown = {v: z3.Int(v) for v in d.unknowns}
    s = z3.Solver()
    s.set("timeout", 1000)
    try:
        for c in d.axiom.where:
            s.add(_to_z3(c, env, shapes, unknown))
    except (z3.Z3Exception, KeyError, IndexError, TypeError, ValueError):
        return False  # a condition reads something that is not an integer here
    if s.check() != z3.sat:
        return False
    m = s.model()
    values = {v: m.eval(x, model_completion=True).as_long() for v, x in unknown.items()}
    s.add(z3.Or([x != values[v] for v, x in unknown.items()]))
    return values if s.check() == z3.unsat else False


def _attrs(eg: EGraph, call: Call, env: dict, tenv: dict, kid_types=None):
    """The call's attributes, normalized and in the canonical spelling for its input types."""
    raw = tuple((k, eval_attr(p, env)) for k, p in call.attrs)
    attrs = normalized_attrs(call.op, raw)
    opdef = get_op(call.op)
    if attrs is None or opdef.canonicalize is None or not call.args:
        return attrs
    if kid_types is None:
        kid_types = [_type(eg, a, tenv, env) for a in call.args]
    return None if None in kid_types else canonical_attrs(opdef, attrs, kid_types)


def _type(eg: EGraph, t, tenv: dict, env: dict):
    if isinstance(t, Var):
        return eg.types[eg.find(tenv[t.name])]
    kids = [_type(eg, a, tenv, env) for a in t.args]
    attrs = _attrs(eg, t, env, tenv, kids) if None not in kids else None
    if attrs is None:
        return None
    types = infer_types(t.op, attrs, tuple(kids))
    return types[t.index] if types is not None and t.index < len(types) else None


def term_of(eg: EGraph, terms: Z3Terms, t, tenv: dict, env: dict):
    """The Z3 term of one side of an instance, built structurally from the classes' terms."""
    if isinstance(t, Var):
        return terms.term(tenv[t.name])
    return terms.enc.apply(t.op, t.index, _attrs(eg, t, env, tenv), [term_of(eg, terms, a, tenv, env) for a in t.args])


def _add(eg: EGraph, t, tenv: dict, env: dict) -> int:
    if isinstance(t, Var):
        return eg.find(tenv[t.name])
    kids = [_add(eg, a, tenv, env) for a in t.args]
    return eg.add_term(t.op, t.index, _attrs(eg, t, env, tenv, [eg.types[eg.find(k)] for k in kids]), kids)


def instantiate(eg: EGraph, d: Direction, root: int, tenv: dict, aenv: dict):
    """Apply one match: ``(class of the built side, full attribute env)`` or None. The Z3
    terms of the instance are :func:`term_of` its pattern and built side, made when needed."""
    done = _complete(eg, d, tenv, aenv)
    if done is None:
        return None
    env, _ = done
    if _type(eg, d.build, tenv, env) != eg.types[eg.find(root)]:
        return None
    return _add(eg, d.build, tenv, env), env
