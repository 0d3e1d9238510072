"""transformers' own models as users export them, through superopt's import and kernel generator.

Each model is built from its transformers class with a tiny config and random weights, run as a
prefill (``model(input_ids, use_cache=False)``; ViT on pixels, BERT without pooling) and exported
with ``torch.export`` in float32 and bf16, also on a padded batch with the tokenizer's
``attention_mask`` (the mask transformers builds from it in the graph); each decoder also as one decode step the way
transformers exports it for on-device runtimes (``TorchExportableModuleForDecoderOnlyLM``: its
static KV cache kept in buffers the program updates in place). The script imports every program as ``superopt
optimize`` does, searches its graph, cuts its kernel regions and generates and verifies their
kernels, and prints one row per program: the opaque operators left (none is the goal), and each
region as ``kind:verified/refused`` (``att+rot+norm``: an attention region holding the rotary
embedding and the queries' per-head norm). No GPU is needed.

    python scripts/check_transformers_import.py [--models llama qwen3 ...] [--modes prefill masked decode] [--out F]

transformers is not a dependency of superopt; install it beside (``pip install transformers``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
            max_position_embeddings=64, tie_word_embeddings=False)
#: model -> (config class, model class, config fields beside TINY)
DECODERS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=2, head_dim=32)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=None)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_key_value_heads=1, head_dim=16)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(num_key_value_heads=2, head_dim=16, sliding_window=32)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=4, pad_token_id=0)),
}
OTHERS = ("gpt2", "bert", "vit")


class _Out(torch.nn.Module):
    """The model called as users call it, returning one tensor."""

    def __init__(self, model, kind: str):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, x, attention_mask=None):
        mask = {} if attention_mask is None else {"attention_mask": attention_mask}
        if self.kind == "vit":
            return self.model(pixel_values=x).last_hidden_state
        if self.kind == "bert":
            return self.model(input_ids=x, **mask).last_hidden_state
        return self.model(input_ids=x, use_cache=False, **mask).logits


def build(name: str, dtype: torch.dtype):
    """(module, example input) of one model in ``dtype``."""
    import transformers as T
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (1, 8))
    if name in DECODERS:
        cfg, cls, extra = DECODERS[name]
        model = getattr(T, cls)(getattr(T, cfg)(**{**TINY, **extra}))
    elif name == "gpt2":
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=128, n_embd=64, n_layer=1, n_head=4, n_positions=64))
    elif name == "bert":
        model = T.BertModel(T.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                         intermediate_size=96), add_pooling_layer=False)
    elif name == "vit":
        model = T.ViTModel(T.ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=96,
                                       image_size=32, patch_size=8), add_pooling_layer=False)
        ids = torch.randn(1, 3, 32, 32, dtype=dtype)
    else:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join([*DECODERS, *OTHERS])}")
    return _Out(model.eval().to(dtype), name), ids


def export_decode(name: str, dtype: torch.dtype, path: Path) -> None:
    """One decode step of decoder ``name`` at position 5 of a 64-position static cache, exported
    by transformers' own ``TorchExportableModuleForDecoderOnlyLM`` and saved at ``path``."""
    import transformers as T
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM
    module, _ = build(name, dtype)
    model = module.model
    model.generation_config = T.GenerationConfig(use_cache=True, cache_implementation="static", max_length=64,
                                                 cache_config={"batch_size": 1, "max_cache_len": 64})
    with torch.no_grad():
        ep = TorchExportableModuleForDecoderOnlyLM(model).export(input_ids=torch.tensor([[3]]),
                                                                  cache_position=torch.tensor([5]))
    torch.export.save(ep, str(path))


def optimize(path: Path) -> dict:
    """``superopt optimize PROGRAM --device h200 --min-gain 0`` (the shipped rules and kernel
    profile, the program's own precision; any gain written, so that the rewritten program is
    generated, exported and checked even at these tiny sizes): what it wrote, its output check."""
    import contextlib
    import io
    from superopt.cli import main as superopt_main
    out, buf = path.with_suffix(".opt.pt2"), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()) as err:
        code = superopt_main(["optimize", str(path), "-o", str(out), "--device", "h200", "--min-gain", "0", "--json"])
    if code != 0:
        return {"error": (err.getvalue().strip().splitlines() or [f"exit {code}"])[-1][:200]}
    rep = json.loads(buf.getvalue())
    return {"rewritten": rep.get("rewritten"), "kernels": (rep.get("kernels") or {}).get("chosen", 0),
            "max_relative_error": rep.get("max_relative_error"), "imported_as": rep.get("imported_as", "")}


def check(name: str, dtype: torch.dtype, folder: Path, mode: str = "prefill", run_optimize: bool = False) -> dict:
    from superopt.driver import load_model
    from superopt.driver.tune import searched_graph
    from superopt.kernel.generate import generate_kernels
    from superopt.kernel.regions import find_regions
    start = time.perf_counter()
    path = folder / f"{name}_{mode}_{dtype}.pt2".replace("torch.", "")
    if mode == "decode":
        export_decode(name, dtype, path)
    else:
        module, x = build(name, dtype)
        args = (x,)
        if mode == "masked":  # a batch of two, the second padded on the left (the tokenizer's 0/1 mask)
            x = torch.cat([x, x])
            mask = torch.ones(x.shape, dtype=torch.int64)
            mask[1, :3] = 0
            args = (x, mask)
        with torch.no_grad():
            torch.export.save(torch.export.export(module, args), str(path))
    model = load_model(str(path))
    opaque = sorted({str(n.attr.get("target", "?")) for n in model.graph.nodes if n.op == "opaque"})
    short = "bf16" if dtype == torch.bfloat16 else "fp32"
    graph = searched_graph(model, short, "h200")
    graph = graph[0] if isinstance(graph, tuple) else graph
    regions = []
    for r in find_regions(graph):
        rep = generate_kernels(r.graph)
        ops = {graph.nodes[i].op for i in r.nodes}
        kind = r.kind[:3] + ("+rot" if r.kind == "attention" and "concat" in ops else "") \
            + ("+norm" if r.kind == "attention" and "rsqrt" in ops else "")
        regions.append(f"{kind}:{rep.verified}/{rep.refused}")
    row = {"model": name, "mode": mode, "dtype": short, "opaque": opaque, "regions": regions, "state": list(model.state),
           "float32_form": model.half is not None}
    if run_optimize:
        row["optimize"] = optimize(path)
    return {**row, "seconds": round(time.perf_counter() - start, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=[*DECODERS, *OTHERS])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16"))
    p.add_argument("--modes", nargs="+", default=["prefill", "masked", "decode"], choices=("prefill", "masked", "decode"),
                   help="masked: prefill of a padded batch with the tokenizer's attention_mask (not ViT); decode: "
                        "decoders only, exported as transformers exports them for on-device runtimes")
    p.add_argument("--optimize", action="store_true",
                   help="also run `superopt optimize PROGRAM --device h200 --min-gain 0` on each (its output check)")
    p.add_argument("--out", help="also write the rows as JSON to this file")
    args = p.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("check_transformers_import: transformers is not installed (pip install transformers)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(n, m, dt) for m in args.modes for n in args.models for dt in args.dtypes
                if m == "prefill" or m == "masked" and n != "vit" or n in DECODERS]
        for name, mode, dt in jobs:
            try:
                row = check(name, getattr(torch, dt), Path(tmp), mode, args.optimize)
            except Exception as e:  # one model's failure is a row, not the end of the run
                row = {"model": name, "mode": mode, "dtype": dt,
                       "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            rows.append(row)
            print(f"{row['model']:8s} {row['mode']:7s} {row['dtype']:5s} "
                  + (f"ERROR {row['error']}" if "error" in row else
                     f"opaque={row['opaque'] or 'none'}  {' '.join(row['regions'])}  state={len(row['state'])}  "
                     + ("as-f32  " if row["float32_form"] else "")
                     + (f"optimize={_said(row['optimize'])}  " if "optimize" in row else "")
                     + f"{row['seconds']} s"), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                                              "rows": rows}, indent=1) + "\n")
    return 0 if all("error" not in r and not r["opaque"] and "error" not in r.get("optimize", {}) for r in rows) else 1


def _said(done: dict) -> str:
    if "error" in done:
        return f"ERROR {done['error']}"
    what = f"rewritten ({done['kernels']} kernels)" if done["rewritten"] else "original"
    err = done.get("max_relative_error")
    return what + (f", error {err:.1e}" if err is not None else "")


if __name__ == "__main__":
    sys.exit(main())
