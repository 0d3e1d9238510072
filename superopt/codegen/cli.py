"""``superopt codegen GRAPH.json -o OUT.pt2|OUT.onnx``: turn an IR graph file back into a model."""

from __future__ import annotations

from pathlib import Path

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("codegen", help="write an IR graph (JSON) as a .pt2 (torch.export) or .onnx model",
                       description="Lower an IR graph to a torch.fx GraphModule and save it as a torch.export "
                                   ".pt2 file or, with the onnx extra, an ONNX file.")
    p.add_argument("graph", metavar="GRAPH.json", help="a graph written by `superopt import -o` or the search")
    p.add_argument("-o", "--output", metavar="OUT", help="OUT.pt2 or OUT.onnx")
    p.add_argument("--print", action="store_true", help="print the generated Python code of the GraphModule")
    p.add_argument("--json", action="store_true", help="print what was written as one JSON document")
    p.set_defaults(func=_codegen)


def _codegen(args) -> int:
    from ..ir.serialize import load_graph
    from .export import export_pt2, to_onnx
    from .fx import CodegenError, to_fx
    g = load_graph(args.graph)
    if args.print:
        print(to_fx(g).code.strip())
    if not args.output:
        if not args.print:
            raise CodegenError("nothing to do: give -o OUT.pt2 / OUT.onnx, or --print")
        return 0
    out = Path(args.output)
    writer = {".pt2": export_pt2, ".onnx": to_onnx}.get(out.suffix)
    if writer is None:
        raise CodegenError(f"{out}: the output must end in .pt2 or .onnx")
    writer(g, out)
    if args.json:
        from ..cliargs import print_json
        print_json({"path": str(out), "bytes": out.stat().st_size})
    else:
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0
