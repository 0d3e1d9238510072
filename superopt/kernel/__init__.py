"""The kernel level: fused GPU kernels for small regions, generated, verified, lowered to Triton.

Public API (stable; the integration and the driver call exactly this):

* :class:`KernelProgram`, :class:`TileConfig`, :func:`parse_program`, ``program.text()`` —
  the program form (``program.py``; the text form round-trips);
* :func:`to_triton` ``(program, config) -> str`` and :func:`compile_program`
  ``(program, config) -> run(*tensors) -> [tensors]`` (inputs in the program's input order;
  Triton is imported only here, lazily; runs under ``TRITON_INTERPRET=1`` on CPU tensors);
* :func:`run_reference` ``(program, inputs) -> [np.ndarray]`` (float64, tile by tile) and
  :func:`verify_kernel` ``(program, region, identities=(), prep=None) -> KernelVerdict``;
* :func:`generate_kernels` ``(region, max_ops=64, time_limit=120.0) -> KernelSearchReport``
  (``.candidates``: :class:`KernelCandidate` ``(program, verdict, identities, prep, moves)``,
  counts, ``.table()``, ``.to_json()``);
* :func:`default_configs` ``(program) -> [TileConfig]`` (the autotuning space);
* :func:`split_kind` ``(program) -> {acc: kind}``: whether (and how) a ``TileConfig(split=S)``
  may cut the program's loop across programs (raises :class:`KernelError` where it may not).

A candidate's ``prep`` (if any) is a weight-only graph over the region's sources whose outputs
are extra program inputs (a norm weight folded into the next weight): evaluate it once at
compile time. Program inputs are named as the region's sources; a program's tensors may be
reshaped views of the region's (same number of elements; ``compile_program`` reshapes).

>>> p = parse_program(EXAMPLE)
>>> [t.name for t in p.inputs], default_configs(p)[0].text()
(['x', 'w'], 'M=16 N=16 K=16 warps=4 stages=2')
"""

from .configs import default_configs
from .errors import KernelCompileError, KernelError, KernelParseError
from .generate import KernelCandidate, KernelSearchReport, generate_kernels
from .program import EXAMPLE, KernelProgram, TileConfig, parse_program
from .semantics import run_field, run_reference
from .split import split_kind
from .triton_lower import to_triton
from .verify import Identity, KernelVerdict, Prep, verify_kernel
from .choose import KernelChoiceReport, choose_kernels  # noqa: E402  (the pass the driver runs)


def compile_program(program, config):
    """See :func:`superopt.kernel.compile.compile_program` (imports Triton on first use)."""
    from .compile import compile_program as _compile
    return _compile(program, config)


__all__ = ["KernelProgram", "TileConfig", "parse_program", "EXAMPLE", "to_triton", "compile_program",
           "run_reference", "run_field", "verify_kernel", "KernelVerdict", "Identity", "Prep",
           "generate_kernels", "KernelSearchReport", "KernelCandidate", "default_configs", "split_kind",
           "KernelError", "KernelParseError", "KernelCompileError", "choose_kernels", "KernelChoiceReport"]
