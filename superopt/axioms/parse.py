"""Reading ``specs/*.axioms``: operator axioms as text.

The syntax (documented for people in ``specs/README.md``)::

    # a comment
    axiom NAME [tag, ...]: LHS == RHS
        where CONDITION
        shapes x=[n, c, h, w], w=[o, c, 3, 3]

Terms are Python call syntax: ``conv2d(x, w, stride=s, padding=(p, p), activation="relu")``;
tensor variables are bare names in argument position, attribute variables bare names in
keyword position (inside a tuple they stand for one integer), ``t[k]`` picks output k of a
multi-output operator. Attributes left out take their declared default. A condition is a
Python boolean expression over attribute variables, dimension names, integers, ``dim(x, k)``
and ``rank(x)``. ``shapes`` fixes shape templates of tensor variables. Indented lines
continue the axiom above them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ..errors import SpecError, UnknownOperatorError
from ..ir.ops import REQUIRED, get_op
from .terms import ALit, ATuple, AVar, Axiom, Call, Var, cond_names

__all__ = ["parse_axioms", "load_axioms", "default_specs_dir", "attr_var_uses"]

_HEAD = re.compile(r"^axiom\s+([A-Za-z_][\w.]*)\s*(?:\[([^\]]*)\])?\s*:\s*(.*)$")


def default_specs_dir() -> Path:
    """``specs/`` of the source tree, or the copy installed inside the package."""
    here = Path(__file__).resolve().parents[2] / "specs"
    if here.is_dir():
        return here
    from importlib.resources import files
    return Path(str(files("superopt") / "_specs"))


def load_axioms(path: str | Path | None = None) -> list:
    """All axioms of a ``.axioms`` file, or of every such file in a folder (sorted by name)."""
    p = Path(path) if path is not None else default_specs_dir()
    if p.is_dir():
        files = sorted(p.glob("*.axioms"))
        if not files:
            raise SpecError(f"{p}: no .axioms files in this folder")
    elif p.is_file():
        files = [p]
    else:
        raise SpecError(f"{p}: no such file or folder")
    out, seen = [], {}
    for f in files:
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            raise SpecError(f"{f}: not a text file; an .axioms file is UTF-8 text (see specs/README.md)") from None
        for ax in parse_axioms(text, str(f)):
            if ax.name in seen:
                raise SpecError(f"{f}:{ax.line}: axiom {ax.name!r} is already defined at {seen[ax.name]}")
            seen[ax.name] = f"{f}:{ax.line}"
            out.append(ax)
    return out


def parse_axioms(text: str, file: str = "<spec>") -> list:
    """Parse the text of one spec file."""
    blocks: list[list] = []  # [line number, head, [(line number, continuation)]]
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not raw[0].isspace():
            if not line.startswith("axiom"):
                raise SpecError(f"{file}:{no}: expected 'axiom NAME: LHS == RHS', got {line.strip()!r}")
            blocks.append([no, line, []])
        elif not blocks:
            raise SpecError(f"{file}:{no}: indented line before any axiom")
        else:
            blocks[-1][2].append((no, line.strip()))
    return [_axiom(file, *b) for b in blocks]


def _axiom(file, no, head, cont):
    m = _HEAD.match(head)
    if not m:
        raise SpecError(f"{file}:{no}: expected 'axiom NAME [tags]: LHS == RHS', got {head!r}")
    name, tags, eq = m.group(1), m.group(2), m.group(3)
    clauses = {"eq": [[no, eq]], "where": [], "shapes": []}  # kind -> [[first line, text], ...]
    current = "eq"
    for line, c in cont:
        word = c.split(None, 1)[0]
        if word in ("where", "shapes"):
            current = word
            clauses[word].append([line, c[len(word):].strip()])
        else:
            clauses[current][-1][1] += " " + c
    ctx = _Ctx(file, no, name)
    lhs, rhs = ctx.at(no).equation(clauses["eq"][0][1])
    shapes, rules = {}, {}
    for line, text in clauses["shapes"]:
        tpl, rl = ctx.at(line).shapes(text)
        shapes.update(tpl)
        rules.update(rl)
    tags = tuple(t.strip() for t in (tags or "").split(",") if t.strip())
    ax = Axiom(name, lhs, rhs, (), shapes, tags, file, no, rules)
    where = tuple(c for line, text in clauses["where"] for c in ctx.at(line).conjuncts(text, ax))
    ax = Axiom(name, lhs, rhs, where, shapes, ax.tags, file, no, rules)
    ctx.at(no).validate(ax)
    return ax


class _Ctx:
    """Converts Python AST to axiom terms, raising errors that name file, line and axiom."""

    def __init__(self, file, line, name):
        self.file, self.line, self.name = file, line, name

    def at(self, line: int) -> "_Ctx":
        """The same context, reporting errors at another line of the axiom."""
        self.line = line
        return self

    def err(self, msg):
        return SpecError(f"{self.file}:{self.line}: axiom {self.name}: {msg}")

    def _parse(self, text, what):
        try:
            return ast.parse(text.strip(), mode="eval").body
        except SyntaxError as e:
            raise self.err(f"cannot parse the {what} ({e.msg} at column {e.offset}): {text.strip()!r}") from None

    def equation(self, text):
        node = self._parse(text, "equation")
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)):
            raise self.err("expected LHS == RHS")
        return self.term(node.left), self.term(node.comparators[0])

    def term(self, n):
        if isinstance(n, ast.Name):
            return Var(n.id)
        if isinstance(n, ast.Subscript):
            inner = self.term(n.value)
            idx = n.slice
            if not (isinstance(inner, Call) and isinstance(idx, ast.Constant) and isinstance(idx.value, int)):
                raise self.err(f"t[k] picks an output of an operator call with an integer k: {ast.unparse(n)!r}")
            return Call(inner.op, inner.args, inner.attrs, idx.value)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            try:
                opdef = get_op(n.func.id)
            except UnknownOperatorError as e:
                raise self.err(str(e)) from None
            if opdef.kind in ("source", "opaque"):
                raise self.err(f"{opdef.name} cannot appear in an axiom")
            attrs = []
            for kw in n.keywords:
                if kw.arg not in opdef.attr_index:
                    raise self.err(f"{opdef.name} has no attribute {kw.arg!r} "
                                   f"(its attributes: {', '.join(opdef.attr_index) or 'none'})")
                attrs.append((kw.arg, self.attr(kw.value)))
            return Call(opdef.name, tuple(self.term(a) for a in n.args), tuple(attrs))
        raise self.err(f"not a term: {ast.unparse(n)!r} (expected a variable or an operator call)")

    def attr(self, n):
        if isinstance(n, ast.Name):
            return AVar(n.id)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float, str)) and not isinstance(n.value, bool):
            return ALit(n.value)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub) and isinstance(n.operand, ast.Constant):
            return ALit(-n.operand.value)
        if isinstance(n, ast.Tuple):
            return ATuple(tuple(self.attr(x) for x in n.elts))
        raise self.err(f"an attribute value is a name, a number, a string or a tuple of these: {ast.unparse(n)!r}")

    def shapes(self, text):
        """Templates ``x=[n, c, 3, 3]`` and rules ``x=any``, ``y=like(x)``, ``y=bcast(x)``."""
        call = self._parse(f"f({text})", "shapes")
        out, rules = {}, {}
        for kw in call.keywords:
            v = kw.value
            if isinstance(v, ast.Name) and v.id == "any":
                rules[kw.arg] = ("any",)
                continue
            if (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("like", "bcast")
                    and len(v.args) == 1 and isinstance(v.args[0], ast.Name) and not v.keywords):
                rules[kw.arg] = (v.func.id, v.args[0].id)
                continue
            if not isinstance(v, ast.List):
                raise self.err(f"shape of {kw.arg} must be a list like [n, c, 3, 3], or a rule: any, like(x), "
                               f"bcast(x)")
            dims = []
            for d in kw.value.elts:
                if isinstance(d, ast.Name):
                    dims.append(d.id)
                elif isinstance(d, ast.Constant) and isinstance(d.value, int):
                    dims.append(d.value)
                else:
                    raise self.err(f"a dimension is a name or an integer, got {ast.unparse(d)!r}")
            out[kw.arg] = tuple(dims)
        return out, rules

    def conjuncts(self, text, ax):
        e = self.cond(self._parse(text, "condition"), ax)
        return list(e[1:]) if e[0] == "and" else [e]

    def cond(self, n, ax):
        ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%",
               ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
        if isinstance(n, ast.BoolOp):
            return ("and" if isinstance(n.op, ast.And) else "or",) + tuple(self.cond(v, ax) for v in n.values)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            return ("not", self.cond(n.operand, ax))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            inner = self.cond(n.operand, ax)
            return ("int", -inner[1]) if inner[0] == "int" else ("-", ("int", 0), inner)
        if isinstance(n, ast.Compare):
            parts, left = [], n.left
            for op, right in zip(n.ops, n.comparators):
                if type(op) not in ops:
                    raise self.err(f"unsupported comparison in condition: {ast.unparse(n)!r}")
                parts.append((ops[type(op)], self.cond(left, ax), self.cond(right, ax)))
                left = right
            return parts[0] if len(parts) == 1 else ("and",) + tuple(parts)
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            return (ops[type(n.op)], self.cond(n.left, ax), self.cond(n.right, ax))
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool):
            return ("int", n.value)
        if isinstance(n, ast.Name):
            if n.id not in set(ax.attr_vars) | set(ax.dim_vars):
                raise self.err(f"condition names {n.id!r}, which is neither an attribute variable nor a dimension")
            return ("var", n.id)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("dim", "rank"):
            if not n.args or not isinstance(n.args[0], ast.Name) or n.args[0].id not in ax.tensor_vars:
                raise self.err(f"{n.func.id}() takes a tensor variable first: {ast.unparse(n)!r}")
            if n.func.id == "rank":
                return ("rank", n.args[0].id)
            if len(n.args) != 2:
                raise self.err(f"dim(x, k) takes two arguments: {ast.unparse(n)!r}")
            return ("dim", n.args[0].id, self.cond(n.args[1], ax))
        raise self.err(f"unsupported expression in condition: {ast.unparse(n)!r}")

    def validate(self, ax):
        for t in (ax.lhs, ax.rhs):
            self._check_term(t)
        tv, av, dv = set(ax.tensor_vars), set(ax.attr_vars), set(ax.dim_vars)
        if tv & av:
            raise self.err(f"{sorted(tv & av)} used both as tensor and as attribute variables")
        if (set(ax.shapes) | set(ax.rules)) - tv:
            raise self.err(f"shapes given for {sorted((set(ax.shapes) | set(ax.rules)) - tv)}, which are not tensor "
                           f"variables")
        if set(ax.shapes) & set(ax.rules):
            raise self.err(f"{sorted(set(ax.shapes) & set(ax.rules))} have both a template and a rule")
        for v, rule in ax.rules.items():
            seen, w = {v}, rule
            while w[0] != "any":
                if w[1] not in tv:
                    raise self.err(f"{v}={w[0]}({w[1]}): {w[1]} is not a tensor variable")
                if w[1] in seen:
                    raise self.err(f"the shape rules of {sorted(seen)} refer to each other in a cycle")
                seen.add(w[1])
                w = ax.rules.get(w[1], ("any",))
        if dv & tv:
            raise self.err(f"dimension names {sorted(dv & tv)} clash with tensor variables")
        attr_var_uses(ax, self.err)
        for c in ax.where:
            cond_names(c)

    def _check_term(self, t):
        if isinstance(t, Var):
            return
        opdef = get_op(t.op)
        try:
            opdef.check_arity(len(t.args))
        except Exception as e:
            raise self.err(str(e)) from None
        for name, p in t.attrs:
            a = opdef.attr_index[name]
            if isinstance(p, ALit):
                try:
                    a.normalize(p.value)
                except Exception as e:
                    raise self.err(f"{t.op}: {e}") from None
        missing = [a.name for a in opdef.attrs if a.default is REQUIRED and a.name not in dict(t.attrs)]
        if missing:
            raise self.err(f"{t.op} needs attribute {missing[0]!r} ({opdef.attr_index[missing[0]].kind}), "
                           f"e.g. {t.op}(..., {missing[0]}=...)")
        if t.index and t.op != "split":
            raise self.err(f"{t.op} has one output; [{t.index}] picks none")
        for a in t.args:
            self._check_term(a)


def attr_var_uses(ax: Axiom, err=None) -> dict[str, tuple[str, str, str]]:
    """For each attribute variable: (operator, attribute, how) where ``how`` is ``whole``
    (the variable is the attribute's value) or ``item`` (an integer inside a tuple)."""
    uses: dict[str, tuple[str, str, str]] = {}

    def note(v, op, attr, how):
        prev = uses.setdefault(v, (op, attr, how))
        kind = get_op(op).attr_index[attr].kind
        prev_kind = get_op(prev[0]).attr_index[prev[1]].kind
        if (prev[2], prev_kind if prev[2] == "whole" else "int") != (how, kind if how == "whole" else "int"):
            msg = f"attribute variable {v!r} is used as {prev[1]} of {prev[0]} and as {attr} of {op}, which differ in kind"
            raise (err(msg) if err else SpecError(msg))

    def walk(t):
        if isinstance(t, Var):
            return
        for name, p in t.attrs:
            if isinstance(p, AVar):
                note(p.name, t.op, name, "whole")
            elif isinstance(p, ATuple):
                for x in p.items:
                    if isinstance(x, AVar):
                        note(x.name, t.op, name, "item")
        for a in t.args:
            walk(a)

    walk(ax.lhs)
    walk(ax.rhs)
    return uses
