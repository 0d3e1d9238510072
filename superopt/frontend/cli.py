"""``superopt import MODEL``: read a .pt2 or ONNX model into the IR and describe it."""

from __future__ import annotations


from ..cliargs import positive_int
from .api import FORMATS

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("import", help="import a .pt2 (torch.export) or .onnx model into the IR",
                       description="Import a model and print its operator counts, opaque nodes, weights and FLOPs.")
    p.add_argument("model", metavar="MODEL", help="a .pt2 file (torch.export.save) or an .onnx file")
    p.add_argument("--format", choices=FORMATS, help="the file format (default: from the name or contents)")
    p.add_argument("--summary", action="store_true",
                   help="print the import report (the default; with --text, print it after the graph)")
    p.add_argument("--text", action="store_true", help="print the IR graph, one node per line")
    p.add_argument("--json", action="store_true", help="print the import report as JSON")
    p.add_argument("-o", "--output", metavar="GRAPH.json", help="write the IR graph (with weights) as JSON")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="batch size for ONNX inputs whose batch dimension is symbolic (default 1)")
    p.set_defaults(func=_import)


def _import(args) -> int:
    from ..cliargs import print_json
    from ..ir.printing import to_text
    from ..ir.serialize import graph_to_json
    from .api import import_model
    graph, report = import_model(args.model, args.format, batch_size=args.batch_size)
    if args.output:
        import json
        from ..fileio import write_text
        write_text(args.output, json.dumps(graph_to_json(graph), sort_keys=True) + "\n")  # atomic
    if args.text:
        print(to_text(graph))
    if args.json:
        print_json(report.to_dict())
    elif args.summary or not args.text:
        print(report.to_table())
    return 0
