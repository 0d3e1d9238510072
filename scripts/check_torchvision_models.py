"""torchvision's models as users export them, through ``superopt optimize`` and back, and print a table.

Each model is built from ``torchvision.models`` with random weights (``weights=None``, seeded),
in eval mode, exported with ``torch.export`` at a small image size (64x64 where the model takes
any size, else its own), in float32 or bf16, and optimized by the CLI in a worker process
(``superopt optimize PROGRAM --device h100 --min-gain 0``: the shipped rules and profile, every
gain written, so that the rewritten program is generated, exported and checked). The written
``.pt2`` is then loaded in a *fresh* process and called on new inputs against the rebuilt
original (the fuzz's check: the same output structure, then ``check_outputs``). One row per
model and precision: the opaque operators left, what was written, the CLI's own check, the
fresh-process check, the time. A crash is a traceback out of the CLI; a refusal an exit 2;
unexportable a model that torch cannot run or export at that precision (RAFT in bf16).

    python scripts/check_torchvision_models.py [--models resnet18 swin_t ...] [--dtypes fp32 bf16] [--out F]
    python scripts/check_torchvision_models.py --door backend

With ``--door backend`` each model goes through ``torch.compile(model, backend="superopt")``
instead (searched, ``inductor`` off, so superopt's own import and code are what runs) and is
checked against a twin run eagerly on the same input sets.

torchvision is not a dependency of superopt; install the one that matches torch beside it. A
torchvision wheel whose C extension does not load here (a CUDA build on a CPU torch) still
works: its detection operators' registrations are skipped, the classification models need none.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]

#: one model of each family, and the variants whose blocks differ: model -> its inputs' shapes (64x64
#: images where the model takes any size)
IMAGE, VIDEO = [(1, 3, 64, 64)], [(1, 3, 8, 64, 64)]
MODELS = {
    "alexnet": IMAGE, "convnext_tiny": IMAGE, "densenet121": IMAGE, "efficientnet_b0": IMAGE,
    "efficientnet_v2_s": IMAGE, "googlenet": IMAGE, "inception_v3": [(1, 3, 96, 96)], "maxvit_t": [(1, 3, 224, 224)],
    "mnasnet0_5": IMAGE, "mobilenet_v2": IMAGE, "mobilenet_v3_large": IMAGE, "mobilenet_v3_small": IMAGE,
    "regnet_x_400mf": IMAGE, "regnet_y_400mf": IMAGE, "resnet18": IMAGE, "resnext50_32x4d": IMAGE,
    "shufflenet_v2_x0_5": IMAGE, "squeezenet1_0": IMAGE, "swin_t": IMAGE, "swin_v2_t": IMAGE, "vgg11_bn": IMAGE,
    "vit_b_32": [(1, 3, 224, 224)], "wide_resnet50_2": IMAGE,
    # segmentation (a dict of outputs; bilinear upsampling), video (3-d convolutions), optical flow (two images)
    "fcn_resnet50": IMAGE, "deeplabv3_mobilenet_v3_large": IMAGE, "lraspp_mobilenet_v3_large": IMAGE,
    "r3d_18": VIDEO, "r2plus1d_18": VIDEO, "raft_small": [(1, 3, 128, 128)] * 2,
}
FLAGS = ["--device", "h100", "--min-gain", "0", "--time-limit", "20", "--quiet"]


def import_torchvision():
    """``torchvision``, with its C extension's operator registrations skipped where they fail."""
    import types
    try:
        import torchvision
    except (RuntimeError, OSError):
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision
    return torchvision


def build(name: str, dtype: str):
    """(module, args) of one model at its image size, in ``dtype``."""
    import torch
    tv = import_torchvision()
    torch.manual_seed(0)
    extra = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
    if name in tv.models.list_models(module=tv.models.segmentation):
        extra = {"weights_backbone": None, "aux_loss": False}
    model = tv.models.get_model(name, weights=None, **extra).eval()
    args = tuple(torch.randn(shape) for shape in MODELS.get(name, [(1, 3, 224, 224)]))
    if dtype == "bf16":
        model, args = model.to(torch.bfloat16), tuple(x.to(torch.bfloat16) for x in args)
    return model, args


def optimize_one(name: str, dtype: str, folder: Path) -> dict:
    """Export and optimize one model in this process."""
    import torch
    from fuzz import run_cli
    torch.set_num_threads(1)
    model, args = build(name, dtype)
    src, dst = folder / f"{name}_{dtype}.pt2", folder / f"{name}_{dtype}.opt.pt2"
    start = time.perf_counter()
    try:
        with torch.no_grad():
            torch.export.save(torch.export.export(model, args), str(src))
    except Exception as e:  # noqa: BLE001 - a model that torch cannot run or export is not superopt's problem
        return {"model": name, "dtype": dtype, "status": "unexportable", "detail": str(e).splitlines()[0][:200]}
    report = folder / f"{name}_{dtype}.json"
    rc, err, tb = run_cli(["optimize", str(src), "-o", str(dst), "--report", str(report), *FLAGS])
    row = {"model": name, "dtype": dtype, "seconds": round(time.perf_counter() - start, 1)}
    if tb is not None or rc not in (0, 2):
        return {**row, "status": "crash", "detail": (tb or err)[-1500:]}
    if rc == 2:
        return {**row, "status": "refused", "detail": err.strip().splitlines()[-1][:300]}
    rep = json.loads(report.read_text())
    from superopt.driver import load_model
    opaque = sorted({str(n.attr.get("target", "?")) for n in load_model(str(src)).graph.nodes if n.op == "opaque"})
    return {**row, "status": "written", "rewritten": rep.get("rewritten"), "opaque": opaque,
            "imported_as": rep.get("imported_as", ""), "max_relative_error": rep.get("max_relative_error"),
            "price": round(rep["cost_before"] / rep["cost_after"], 3) if rep.get("cost_after") else None}


def check_one(name: str, dtype: str, folder: Path) -> dict:
    """In a fresh process: the written program against the rebuilt original."""
    import torch
    import superopt  # noqa: F401 - registers its custom ops, as a user of a written program must
    from fuzz import _compared
    torch.set_num_threads(1)
    model, args = build(name, dtype)
    loaded = torch.export.load(str(folder / f"{name}_{dtype}.opt.pt2")).module()
    with torch.no_grad():
        return _compared(0, model, loaded, args, {})


def backend_one(name: str, dtype: str, folder: Path) -> dict:
    """The model through ``torch.compile(backend="superopt")`` (searched, Inductor off: what runs is
    superopt's own import and code) against a twin run eagerly, on the fuzz's input sets."""
    import torch
    from fuzz import _compared
    from superopt.driver.backend import register
    torch.set_num_threads(1)
    register()
    model, args = build(name, dtype)
    twin = build(name, dtype)[0]
    start = time.perf_counter()
    f = torch.compile(model, backend="superopt", options={"inductor": False, "min_gain": 0.0, "time_limit": 20,
                                                          "device": "h100"})
    with torch.no_grad():
        row = _compared(0, twin, f, args, {})
    return {"model": name, "dtype": dtype, "status": "written", "check": row["status"],
            **({"check_error": row["error"]} if "error" in row else {"detail": row.get("detail", "")}),
            "seconds": round(time.perf_counter() - start, 1)}


def _worker(stage: str, name: str, dtype: str, folder: Path) -> dict:
    try:
        return {"optimize": optimize_one, "check": check_one, "backend": backend_one}[stage](name, dtype, folder)
    except Exception as e:  # noqa: BLE001 - one model's failure is a row
        return {"model": name, "dtype": dtype, "status": "mismatch" if stage == "check" else "crash",
                "detail": f"{type(e).__name__}: {str(e)[:300]}"}


def _spawn(stage: str, name: str, dtype: str, folder: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, __file__, "--worker", stage, "--models", name, "--dtypes", dtype,
                             "--dir", str(folder)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            text=True)


def _result(p: subprocess.Popen, name: str, dtype: str) -> dict:
    out, _ = p.communicate()
    rows = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    return rows[-1] if rows else {"model": name, "dtype": dtype, "status": "crash",
                                  "detail": f"worker exited with {p.returncode}"}


def run(jobs: list[tuple[str, str]], workers: int, folder: Path, show, door: str = "cli") -> list[dict]:
    """Optimize each job in a worker, then check what was written in a fresh one; ``workers`` at
    once (``door="backend"``: each through :func:`backend_one`, checked there)."""
    rows, running, todo = [], [], list(jobs)
    first = "optimize" if door == "cli" else "backend"
    while todo or running:
        while todo and len(running) < workers:
            name, dtype = todo.pop(0)
            running.append((first, name, dtype, _spawn(first, name, dtype, folder)))
        stage, name, dtype, p = running.pop(0)
        row = _result(p, name, dtype)
        if stage == "optimize" and row["status"] == "written":
            checked = _result(_spawn("check", name, dtype, folder), name, dtype)
            row = {**row, "check": checked["status"], **({"check_error": checked["error"]} if "error" in checked
                                                         else {"detail": checked.get("detail", "")})}
        rows.append(row)
        show(row)
    return rows


def line(row: dict) -> str:
    head = f"{row['model']:20s} {row['dtype']:5s} "
    if row["status"] != "written":
        return head + f"{row['status'].upper()} {row.get('detail', '')[-300:]}"
    opaque = ",".join(row.get("opaque") or []) or "none"
    if "rewritten" not in row:  # the backend door
        fresh = f"ok {row['check_error']:.1e}" if row.get("check") == "ok" else f"{row.get('check', '').upper()} " \
            f"{row.get('detail', '')}"
        return head + f"backend {fresh} {row['seconds']} s"
    what = "rewritten" if row.get("rewritten") else "original"
    err = row.get("max_relative_error")
    fresh = row.get("check")
    fresh = f"fresh {fresh} {row['check_error']:.1e}" if fresh == "ok" else f"FRESH {fresh} {row.get('detail', '')}"
    return head + (f"{what:9s} opaque={opaque} check {err:.1e} " if err is not None else f"{what:9s} opaque={opaque} ") \
        + f"{fresh} priced x{row.get('price')} {row['seconds']} s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--door", choices=("cli", "backend"), default="cli",
                   help="backend: torch.compile(model, backend='superopt') (Inductor off) against the model run "
                        "eagerly, instead of superopt optimize and the written program")
    p.add_argument("--out", help="also write the rows as JSON to this file")
    p.add_argument("--worker", choices=("optimize", "check", "backend"), help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.models[0], args.dtypes[0], Path(args.dir))), flush=True)
        return 0
    try:
        tv = import_torchvision()
    except ImportError:
        print("check_torchvision_models: torchvision is not installed (pip install torchvision)", file=sys.stderr)
        return 2
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        rows = run([(m, d) for m in args.models for d in args.dtypes], args.workers, Path(tmp),
                   lambda r: print(line(r), flush=True), args.door)
    bad = [r for r in rows if r["status"] == "crash" or r.get("check") not in (None, "ok")]
    print(f"{len(rows)} programs, {sum(r['status'] == 'written' for r in rows)} written, "
          f"{sum(bool(r.get('rewritten')) for r in rows)} rewritten, {len(bad)} crashed or differ; "
          f"{time.time() - start:.0f} s")
    if args.out:
        import torch
        Path(args.out).write_text(json.dumps({"torchvision": tv.__version__, "torch": torch.__version__, "rows": rows},
                                             indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
