"""The text form of kernel programs: print and parse (they round-trip).

One declaration or statement per line (see ``program.EXAMPLE``); blank lines and ``#``
comments are ignored when reading.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from ..ir.types import TensorType
from .errors import KernelParseError
from .program import _ATTRS, DTYPES, Acc, Axis, KernelProgram, Stmt, Tensor

__all__ = ["to_text", "from_text", "stmt_text", "fmt_num", "parse_num"]

_SHORT = {v: k for k, v in DTYPES.items()}


def fmt_num(v) -> str:
    if isinstance(v, Fraction):
        return f"{v.numerator}/{v.denominator}" if v.denominator != 1 else f"{v.numerator}/1"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def parse_num(s: str):
    if "/" in s:
        return Fraction(s)
    return float(s)


def _fmt_attr(v):
    return fmt_num(v) if isinstance(v, float) else str(v)


def stmt_text(s: Stmt) -> str:
    attrs = "".join(f" {k}={_fmt_attr(v)}" for k, v in s.attrs)
    args = " ".join(a if isinstance(a, str) else fmt_num(a) for a in s.args)
    if s.op in ("load", "store"):
        access = f"{s.tensor}[{','.join(a.text() for a in s.index)}]"
        head = f"{s.out} = load {access}" if s.op == "load" else f"store {access}"
        return f"{head}{' ' + args if args else ''}{attrs}"
    if s.op == "update":
        return f"update {s.out} {args}"
    return f"{s.out} = {s.op} {args}{attrs}"


def _tensor_text(kind, t: Tensor) -> str:
    return f"{kind} {t.name} {_SHORT[t.dtype]}[{','.join(map(str, t.shape))}]"


def to_text(p: KernelProgram) -> str:
    lines = [f"kernel {p.name}"]
    lines += [f"dim {d} {n}" for d, n in p.dims]
    lines += [_tensor_text("input", t) for t in p.inputs] + [_tensor_text("output", t) for t in p.outputs]
    lines.append("grid " + " ".join(d if tiled else f"{d}:1" for d, tiled in p.grid))
    if p.loop:
        lines.append(f"loop {p.loop}")
    lines += [f"acc {a.name}[{','.join(a.dims)}] = {fmt_num(a.init)}" for a in p.accs]
    for block in ("pre", "body", "post"):
        stmts = getattr(p, block)
        if stmts:
            lines.append(f"{block}:")
            lines += ["  " + stmt_text(s) for s in stmts]
    return "\n".join(lines) + "\n"


# ---- parsing ------------------------------------------------------------------------------

def _attr_value(op, key, raw, where):
    kind = _ATTRS.get(op, {}).get(key)
    if kind is None:
        return raw  # the validator names the unknown attribute
    try:
        return float(parse_num(raw)) if kind is float else kind(raw)
    except ValueError:
        raise KernelParseError(f"{where}: attribute {key}={raw!r} is not a {kind.__name__}") from None


def _args_attrs(op, words, where):
    args, attrs = [], []
    for w in words:
        if "=" in w:
            k, _, v = w.partition("=")
            attrs.append((k, _attr_value(op, k, v, where)))
        elif re.fullmatch(r"[A-Za-z_]\w*", w):
            args.append(w)
        else:
            try:
                args.append(parse_num(w))
            except ValueError:
                raise KernelParseError(f"{where}: {w!r} is neither a value name nor a number") from None
    return tuple(args), tuple(sorted(attrs))


def _access(text, where):
    m = re.fullmatch(r"([A-Za-z_]\w*)\[([^\]]*)\]", text)
    if not m:
        raise KernelParseError(f"{where}: expected TENSOR[index,...], got {text!r}")
    idx = tuple(Axis.parse(a) for a in m.group(2).split(",")) if m.group(2).strip() else ()
    return m.group(1), idx


def parse_stmt(line: str, where: str) -> Stmt:
    words = line.split()
    if words[0] == "store":
        if len(words) < 3:
            raise KernelParseError(f"{where}: expected 'store T[index] value'")
        tensor, idx = _access(words[1], where)
        args, attrs = _args_attrs("store", words[2:], where)
        return Stmt("", "store", args, attrs, tensor, idx)
    if words[0] == "update":
        if len(words) != 3:
            raise KernelParseError(f"{where}: expected 'update ACC value'")
        return Stmt(words[1], "update", (words[2],))
    if len(words) < 3 or words[1] != "=":
        raise KernelParseError(f"{where}: expected 'name = op operands...'")
    out, op, rest = words[0], words[2], words[3:]
    if op == "load":
        if not rest:
            raise KernelParseError(f"{where}: expected 'name = load T[index]'")
        tensor, idx = _access(rest[0], where)
        args, attrs = _args_attrs(op, rest[1:], where)
        return Stmt(out, op, args, attrs, tensor, idx)
    args, attrs = _args_attrs(op, rest, where)
    return Stmt(out, op, args, attrs)


def _header(words, fields, where):
    key = words[0]
    if key == "kernel":
        fields["name"] = words[1]
    elif key == "dim":
        fields["dims"].append((words[1], int(words[2])))
    elif key in ("input", "output"):
        t = TensorType.parse(words[2])
        fields[key + "s"].append(Tensor(words[1], t.dtype, t.shape))
    elif key == "grid":
        fields["grid"] = tuple((w[:-2], False) if w.endswith(":1") else (w, True) for w in words[1:])
    elif key == "loop":
        fields["loop"] = words[1]
    elif key == "acc":
        m = re.fullmatch(r"acc\s+([A-Za-z_]\w*)\[([^\]]*)\]\s*=\s*(\S+)", " ".join(words))
        if not m:
            raise KernelParseError(f"{where}: expected 'acc NAME[dims] = init'")
        dims = tuple(d.strip() for d in m.group(2).split(",") if d.strip())
        fields["accs"].append(Acc(m.group(1), dims, float(m.group(3))))
    else:
        raise KernelParseError(f"{where}: unknown declaration {key!r}")


def from_text(text: str) -> KernelProgram:
    fields = {"name": None, "dims": [], "inputs": [], "outputs": [], "grid": (), "loop": None, "accs": []}
    blocks = {"pre": [], "body": [], "post": []}
    block = None
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        where = f"line {no}"
        if not line:
            continue
        if line.rstrip(":") in blocks and line.endswith(":"):
            block = line[:-1]
            continue
        try:
            if block is None:
                _header(line.split(), fields, where)
            else:
                blocks[block].append(parse_stmt(line, where))
        except (IndexError, ValueError) as e:
            raise KernelParseError(f"{where}: cannot read {line!r} ({e})") from None
    if fields["name"] is None:
        raise KernelParseError("a kernel program starts with 'kernel NAME'")
    return KernelProgram(fields["name"], tuple(fields["dims"]), tuple(fields["inputs"]), tuple(fields["outputs"]),
                         fields["grid"], fields["loop"], tuple(fields["accs"]),
                         tuple(blocks["pre"]), tuple(blocks["body"]), tuple(blocks["post"]))
