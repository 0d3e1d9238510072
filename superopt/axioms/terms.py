"""The terms of an axiom: variables, operator calls with attribute patterns, conditions.

These are plain data, shared by the numeric checker (which instantiates them as graphs) and
the verifier (which translates them to Z3). Conditions are small expression trees:
``("int", 3)``, ``("var", "a")``, ``("dim", "x", e)``, ``("rank", "x")``, arithmetic
``("+", l, r)`` (``-``, ``*``, ``//``, ``%``), comparisons ``("==", l, r)`` (``!=``, ``<``,
``<=``, ``>``, ``>=``), ``("and", e1, e2, ...)``, ``("or", ...)``, ``("not", e)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..pattern.attrs import ALit, ATuple, AttrPat, AVar  # attribute patterns: one form for axioms and rules

__all__ = ["Var", "Call", "AVar", "ALit", "ATuple", "Term", "AttrPat", "Axiom", "term_vars", "attr_vars",
           "eval_cond", "eval_attr", "cond_names", "broadcasts", "rules_hold"]


@dataclass(frozen=True)
class Var:
    """A tensor variable."""
    name: str

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class Call:
    """``op(args..., attr=pattern...)[index]``; attributes left out take their defaults."""
    op: str
    args: tuple
    attrs: tuple  # ((name, AttrPat), ...) in the order written
    index: int = 0

    def __str__(self):
        parts = [str(a) for a in self.args] + [f"{k}={v}" for k, v in self.attrs]
        return f"{self.op}({', '.join(parts)})" + (f"[{self.index}]" if self.op == "split" else "")


Term = Union[Var, Call]


@dataclass(frozen=True)
class Axiom:
    """``lhs == rhs`` for all values of its variables where ``where`` holds.

    ``shapes`` gives shape templates of tensor variables (dimension names or integers);
    dimension names are integer variables too, usable in conditions and attributes.
    ``rules`` gives the other variables a stated shape rule: ``("any",)`` (every shape where
    both sides are well-formed), ``("like", x)`` (x's shape), ``("bcast", x)`` (any shape that
    broadcasts with x's, numpy style). A variable with neither is *unstated*.
    """
    name: str
    lhs: Term
    rhs: Term
    where: tuple = ()
    shapes: dict = field(default_factory=dict)
    tags: tuple = ()
    file: str = ""
    line: int = 0
    rules: dict = field(default_factory=dict)

    @property
    def unstated(self) -> tuple[str, ...]:
        """Tensor variables with neither a shape template nor a shape rule."""
        return tuple(v for v in self.tensor_vars if v not in self.shapes and v not in self.rules)

    @property
    def tensor_vars(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(term_vars(self.lhs) + term_vars(self.rhs)))

    @property
    def attr_vars(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(attr_vars(self.lhs) + attr_vars(self.rhs)))

    @property
    def dim_vars(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d for tpl in self.shapes.values() for d in tpl if isinstance(d, str)))

    def __str__(self):
        s = f"{self.lhs} == {self.rhs}"
        return s + (f"  where {' and '.join(_fmt_cond(c) for c in self.where)}" if self.where else "")


def broadcasts(a: tuple, b: tuple) -> bool:
    """Do two shapes broadcast together (numpy)?"""
    return all(x == y or 1 in (x, y) for x, y in zip(reversed(a), reversed(b)))


def rules_hold(rules: dict, shapes: dict) -> bool:
    """Do the concrete ``shapes`` obey the shape rules (``like``, ``bcast``)?"""
    for v, rule in rules.items():
        if rule[0] == "any" or v not in shapes or rule[1] not in shapes:
            continue
        if rule[0] == "like" and shapes[v] != shapes[rule[1]]:
            return False
        if rule[0] == "bcast" and not broadcasts(shapes[v], shapes[rule[1]]):
            return False
    return True


def term_vars(t: Term) -> tuple[str, ...]:
    if isinstance(t, Var):
        return (t.name,)
    return tuple(v for a in t.args for v in term_vars(a))


def _pat_vars(p) -> tuple[str, ...]:
    if isinstance(p, AVar):
        return (p.name,)
    if isinstance(p, ATuple):
        return tuple(v for x in p.items for v in _pat_vars(x))
    return ()


def attr_vars(t: Term) -> tuple[str, ...]:
    if isinstance(t, Var):
        return ()
    return tuple(v for _, p in t.attrs for v in _pat_vars(p)) + tuple(v for a in t.args for v in attr_vars(a))


def eval_attr(p: AttrPat, env: dict):
    if isinstance(p, AVar):
        return env[p.name]
    if isinstance(p, ALit):
        return p.value
    return tuple(eval_attr(x, env) for x in p.items)


_ARITH = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
          "//": lambda a, b: a // b, "%": lambda a, b: a % b}
_CMP = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def eval_cond(e, env: dict, shapes: dict):
    """Evaluate a condition; ``env`` holds attribute and dimension values, ``shapes`` the
    concrete shape of each tensor variable."""
    tag = e[0]
    if tag == "int":
        return e[1]
    if tag == "var":
        return env[e[1]]
    if tag == "dim":
        return shapes[e[1]][eval_cond(e[2], env, shapes)]
    if tag == "rank":
        return len(shapes[e[1]])
    if tag in _ARITH:
        return _ARITH[tag](eval_cond(e[1], env, shapes), eval_cond(e[2], env, shapes))
    if tag in _CMP:
        return _CMP[tag](eval_cond(e[1], env, shapes), eval_cond(e[2], env, shapes))
    if tag == "and":
        return all(eval_cond(x, env, shapes) for x in e[1:])
    if tag == "or":
        return any(eval_cond(x, env, shapes) for x in e[1:])
    if tag == "not":
        return not eval_cond(e[1], env, shapes)
    raise ValueError(f"bad condition node {tag!r}")


def cond_names(e) -> set[str]:
    """Integer variables (attribute or dimension) a condition mentions."""
    if e[0] == "var":
        return {e[1]}
    return set().union(*(cond_names(x) for x in e[1:] if isinstance(x, tuple)))


def _fmt_cond(e) -> str:
    tag = e[0]
    if tag in ("int", "var"):
        return str(e[1])
    if tag == "dim":
        return f"dim({e[1]}, {_fmt_cond(e[2])})"
    if tag == "rank":
        return f"rank({e[1]})"
    if tag in ("and", "or"):
        return f" {tag} ".join(f"({_fmt_cond(x)})" for x in e[1:])
    if tag == "not":
        return f"not ({_fmt_cond(e[1])})"
    prec = _PREC.get(tag, 0)
    left, right = _fmt_cond(e[1]), _fmt_cond(e[2])
    if _PREC.get(e[1][0], 9) < prec:
        left = f"({left})"
    if _PREC.get(e[2][0], 9) <= prec:
        right = f"({right})"
    return f"{left} {tag} {right}"


#: binding strength of arithmetic, for printing conditions with the parentheses they need
_PREC = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2}
