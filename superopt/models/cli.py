"""``superopt zoo list|export``: the built-in models, and writing one as a ``.pt2`` file.

``zoo export`` goes through ``torch.export`` exactly as a user's model would, so everything
downstream (``superopt import``, the search) starts from a real exported file.
"""

from __future__ import annotations

import inspect
import io
import sys
import time
from pathlib import Path

from ..cliargs import nonnegative_int, positive_int
from ..fileio import write_bytes
from ..errors import SuperoptError

__all__ = ["register", "ZooExportError", "export_zoo_model"]


class ZooExportError(SuperoptError):
    """A zoo model cannot be exported as asked (bad option, unwritable output)."""


def register(sub) -> None:
    p = sub.add_parser("zoo", help="the built-in model zoo: list the models, export one as .pt2")
    ss = p.add_subparsers(dest="zoo_command", metavar="ACTION", required=True)
    ls = ss.add_parser("list", help="list the built-in models with their published size")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.set_defaults(func=_list)
    ex = ss.add_parser("export", help="export a built-in model with torch.export and save it as .pt2")
    ex.add_argument("name", metavar="NAME", help="a model name from `superopt zoo list`")
    ex.add_argument("-o", "--output", metavar="FILE.pt2", help="where to write (default: NAME.pt2)")
    ex.add_argument("--batch-size", type=positive_int, default=1, help="batch size of the example input (default 1)")
    ex.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random weights (default 0)")
    ex.add_argument("--seq-len", type=positive_int, help="sequence length, for models with token inputs (bert_base)")
    ex.add_argument("--cache", choices=("inputs", "buffers"), default="inputs",
                    help="a decode step's KV caches: inputs it updates in place (default, HF's StaticCache passed "
                         "in), or buffers the model holds and updates (gpt-fast, transformers' executorch export)")
    ex.add_argument("--mask", choices=("input", "positions"), default="input",
                    help="a decode step's attention mask: an additive input (default), or built in the graph from the "
                         "cache position (transformers' executorch export)")
    ex.add_argument("--rotary", choices=("tables", "positions"), default="tables",
                    help="a Llama-style model's rotary embedding: cos and sin tables as inputs (default), or computed "
                         "in the graph from position ids in float32 and cast to the activations' dtype (transformers' "
                         "LlamaRotaryEmbedding)")
    ex.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                    help="the precision of the weights and the floating inputs (default fp32; an LLM is usually "
                         "exported in bf16)")
    ex.add_argument("--json", action="store_true", help="print what was written as JSON")
    ex.set_defaults(func=_export)


def _list(args) -> int:
    from ..cliargs import print_json
    from . import ZOO
    rows = [{"name": s.name, "description": s.description, "input_shapes": [list(x) for x in s.input_shapes(1)],
             "published_params": s.published_params, "published_gflops": round(s.published_gflops, 3),
             "source": s.source} for s in ZOO.values()]
    if args.json:
        print_json(rows)
        return 0
    w = max(len(r["name"]) for r in rows)
    print(f"{'name':<{w}}  {'params':>11}  {'GFLOPs':>7}  {'input (batch 1)':<18}  description")
    for r in rows:
        shapes = " ".join("x".join(map(str, s)) for s in r["input_shapes"])
        print(f"{r['name']:<{w}}  {r['published_params']:>11,}  {r['published_gflops']:>7.2f}  {shapes:<18}  "
              f"{r['description']}")
    print("\nGFLOPs = 2 x published multiply-adds at batch 1; `superopt zoo export NAME -o NAME.pt2` writes one.")
    return 0


def export_zoo_model(name: str, path: str | Path, batch_size: int = 1, seed: int = 0,
                     seq_len: int | None = None, progress: bool = False, cache: str = "inputs",
                     mask: str = "input", dtype: str = "fp32", rotary: str = "tables") -> dict:
    """Build a zoo model, ``torch.export`` it at its example input and save it; returns a summary
    (``progress`` says what it is doing on stderr). ``dtype``: the weights and floating inputs
    cast to it first (``bf16``, ``fp16``), as a user exports a model in half precision; ``rotary``:
    a Llama-style model's rotary tables given (``tables``) or computed from position ids
    (``positions``)."""
    import torch

    from . import build, get_spec
    spec = get_spec(name)
    kwargs = {}
    if seq_len is not None:
        if "seq_len" not in spec.input_kwargs:
            takes = ", ".join(n for n, s in _zoo() if "seq_len" in s.input_kwargs)
            raise ZooExportError(f"{name} has no sequence length; --seq-len is for {takes}")
        kwargs["seq_len"] = seq_len
    if cache not in ("inputs", "buffers") or mask not in ("input", "positions"):
        raise ZooExportError(f"--cache takes inputs or buffers, --mask input or positions; got {cache!r}, {mask!r}")
    if (cache, mask) != ("inputs", "input") and not name.endswith("_decode"):
        takes = ", ".join(n for n, _ in _zoo() if n.endswith("_decode"))
        raise ZooExportError(f"{name} has no KV cache; --cache buffers and --mask positions are for the decode "
                             f"steps: {takes}")
    if rotary not in ("tables", "positions"):
        raise ZooExportError(f"--rotary takes tables or positions; got {rotary!r}")
    if rotary == "positions":
        if "rotary" not in inspect.signature(spec.builder).parameters:
            takes = ", ".join(n for n, s in _zoo() if "rotary" in inspect.signature(s.builder).parameters)
            raise ZooExportError(f"{name} has no rotary embedding to compute from positions; --rotary is for {takes}")
        kwargs["rotary"] = "positions"
    casts = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype not in casts:
        raise ZooExportError(f"--dtype takes {', '.join(casts)}; got {dtype!r}")
    if cache == "buffers":
        kwargs["cache"] = "buffers"
    if mask == "positions":
        kwargs["mask"] = "positions"
    path = _check_output(Path(path))
    if progress:
        print(f"exporting {name} (batch {batch_size}) with torch.export ...", file=sys.stderr)
    start = time.perf_counter()
    model, inputs = build(name, batch_size=batch_size, seed=seed, **kwargs)
    if dtype != "fp32":
        model = model.to(casts[dtype])
        inputs = tuple(x.to(casts[dtype]) if x.is_floating_point() else x for x in inputs)
    ep = torch.export.export(model, inputs)
    buf = io.BytesIO()
    try:
        torch.export.save(ep, buf)
    except (OSError, RuntimeError) as e:
        raise ZooExportError(f"cannot serialize {name}: {str(e).splitlines()[0]}") from None
    write_bytes(path, buf.getvalue())  # atomic: never a truncated .pt2
    return {"name": name, "path": str(path), "bytes": path.stat().st_size, "batch_size": batch_size, "seed": seed,
            "dtype": dtype,
            "input_shapes": [list(x.shape) for x in inputs], "seconds": round(time.perf_counter() - start, 2)}


def _check_output(path: Path) -> Path:
    if path.suffix != ".pt2":
        raise ZooExportError(f"{path}: the output name must end in .pt2 (torch.export.load expects it)")
    if not path.parent.is_dir():
        raise ZooExportError(f"cannot write {path}: the folder {path.parent} does not exist")
    return path


def _zoo():
    from . import ZOO
    return ZOO.items()


def _export(args) -> int:
    from ..cliargs import print_json
    out = args.output or f"{args.name}.pt2"
    info = export_zoo_model(args.name, out, args.batch_size, args.seed, args.seq_len, progress=True, cache=args.cache,
                            mask=args.mask, dtype=args.dtype, rotary=args.rotary)
    if args.json:
        print_json(info)
    else:
        shapes = ", ".join("x".join(map(str, s)) for s in info["input_shapes"])
        print(f"wrote {info['path']} ({info['bytes'] / 1e6:.1f} MB; input {shapes}; {info['seconds']:.1f} s)")
    return 0
