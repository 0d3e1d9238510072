"""CPU seconds of `superopt optimize`'s two `torch.export`s, with and without lazy graph modules;
or (``--built``) the written program traced by `torch.export` against built without tracing.

    python scripts/bench_exports.py [--models nasnet_a_mobile inception_v3 bert_base] [--rounds 5]
    python scripts/bench_exports.py --built [--models ...] [--rounds 5]

For each zoo model: the command's passes run once (as `superopt optimize --zoo M --device h100`
runs them, every pass in this process), then the model's export (`export_module`) and the
written program's (`to_exported_program`) are timed in CPU seconds, alternating without and
with `fewer_recompiles`, and the mean of the rounds after the first is printed with the count of
graph-module recompiles. Warm exports (torch's caches already filled by the run): what changes is
the work around the trace, not the trace.

``--built``: the written program as `to_exported_program` makes it (built from the generated
graph by `superopt.codegen.aten` where it can be) against `torch.export.export` of the same
generated module, alternating, CPU seconds (mean of the rounds after the first), whether it was
built, and whether the two save to the same bytes.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("SUPEROPT_SPARE_CORE", "0")  # every pass in this process

import torch.fx.graph_module as graph_module  # noqa: E402

import superopt.frontend.torch_import as torch_import  # noqa: E402
from superopt.cli import build_parser  # noqa: E402
from superopt.cost import choose_cost_model  # noqa: E402
from superopt.driver import command, write  # noqa: E402
from superopt.driver.model import load_model, no_stack_traces  # noqa: E402
from superopt.driver.pipeline import optimize  # noqa: E402
from superopt.rules.load import load_rules  # noqa: E402

COUNT = [0]
_recompile = graph_module.GraphModule.recompile


def _counted(self):
    COUNT[0] += 1
    return _recompile(self)


def _cpu(fn) -> tuple[float, int]:
    COUNT[0] = 0
    t = time.process_time()
    fn()
    return time.process_time() - t, COUNT[0]


def _optimized(zoo: str):
    """The zoo model and what ``superopt optimize --zoo ZOO --device h100`` makes of it."""
    args = build_parser().parse_args(["optimize", "--zoo", zoo, "--device", "h100", "-o", "unused.pt2"])
    cost, modelled = choose_cost_model("h100", "fp32", "inductor", None, layout=args.layout, conv_relu=True)
    model = load_model(zoo=zoo)
    res = optimize(model, load_rules(), cost, command._options(args), passes=command._cli_passes([]),
                   dtype="fp32", profile_name=modelled)
    return model, res


def bench(zoo: str, rounds: int) -> None:
    model, res = _optimized(zoo)
    lazy = torch_import._use_lazy_graph_module
    sums = {False: [0.0, 0.0, 0, 0], True: [0.0, 0.0, 0, 0]}
    for k in range(rounds):
        for on in (False, True):
            torch_import._use_lazy_graph_module = lazy if on else None
            with no_stack_traces():
                m, mn = _cpu(lambda: torch_import.export_module(model.reference, model.inputs))
            w, wn = _cpu(lambda: write._export(res))
            if k:  # the first round fills torch's caches
                s = sums[on]
                s[0], s[1], s[2], s[3] = s[0] + m, s[1] + w, mn, wn
    torch_import._use_lazy_graph_module = lazy
    for on in (False, True):
        m, w, mn, wn = sums[on]
        print(f"{zoo:<17} lazy={str(on):<5} model export {m / (rounds - 1):.3f} s ({mn} recompiles)  "
              f"written program {w / (rounds - 1):.3f} s ({wn} recompiles)", flush=True)


def _saved(ep) -> bytes:
    import io

    import torch

    from superopt.codegen.export import no_canonical_self_test
    f = io.BytesIO()
    with no_canonical_self_test():
        torch.export.save(ep, f)
    return f.getvalue()


def built(zoo: str, rounds: int) -> None:
    """The written program traced against built (see the module docstring)."""
    import torch

    from superopt.codegen import aten, export

    model, res = _optimized(zoo)
    if res.unchanged:
        print(f"{zoo:<17} written unchanged (the model's own program): nothing to export", flush=True)
        return
    fx = res.plan.fx_options()
    made = []

    def traced():
        with no_stack_traces():
            module = export.to_module(res.graph, model.signature, **fx)
            return torch.export.export(module, tuple(model.inputs), model.kwargs or {})

    def spy(*a):
        made.append(aten.exported_program(*a))
        return made[-1]
    export.exported_program = spy
    sums, eps = [0.0, 0.0], [None, None]
    for k in range(rounds):
        for i, fn in enumerate((traced, lambda: write._export(res))):
            t = time.process_time()
            eps[i] = fn()
            if k:
                sums[i] += time.process_time() - t
    export.exported_program = aten.exported_program
    same = _saved(eps[0]) == _saved(eps[1])
    print(f"{zoo:<17} traced {sums[0] / (rounds - 1):.3f} s  built {sums[1] / (rounds - 1):.3f} s  "
          f"({'built without tracing' if made and made[-1] is not None else 'traced: not handled'}; "
          f"{'same bytes' if same else 'BYTES DIFFER'}; {len(eps[1].graph.nodes)} nodes)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["nasnet_a_mobile", "inception_v3", "bert_base"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--built", action="store_true", help="the written program traced against built without tracing")
    args = p.parse_args()
    gc.set_threshold(*command.GC_THRESHOLDS)
    if args.built:
        for m in args.models:
            built(m, max(2, args.rounds))
        return 0
    graph_module.GraphModule.recompile = _counted
    for m in args.models:
        bench(m, max(2, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
