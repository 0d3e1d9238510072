"""The one set of defaults of ``optimize``, shared by the CLI, the Python API and the
``torch.compile`` backend, and their checks (every number is checked where it is given).

>>> Options().search, Options().min_gain
('saturate', 0.02)
>>> Options(tolerance=-1).check()
Traceback (most recent call last):
...
superopt.driver.options.OptionError: tolerance -1: give a relative error of at least 0 (default 0.0001)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..errors import SuperoptError
from ..search.backtrack import DEFAULT_ALPHA, DEFAULT_BUDGET, DEFAULT_TIME_LIMIT, check_limits
from ..search.saturate import DEFAULT_LIMITS, Limits

__all__ = ["Options", "OptionError", "DEFAULT_MIN_GAIN", "DEFAULT_TOLERANCE", "SEARCHES", "LAYOUTS", "DEFAULT_THREADS",
           "output_path"]

DEFAULT_TOLERANCE = 1e-4
#: a rewritten graph, a layout or a library-call choice is kept only when priced at least this
#: share of the model's cost cheaper: the H100 models were within 4% of the measured speedups,
#: and where a gain under 2% was predicted, Inductor ran the result 2-3% slower (ResNet-50 /
#: ResNeXt-50 b16 bf16: 0.970, 0.976), so a smaller predicted gain is within the model's error
DEFAULT_MIN_GAIN = 0.02
SEARCHES = ("saturate", "backtrack")
#: intra-op threads of one ``optimize`` (more gain little on these graphs, and parallel runs on
#: one machine would each take every core)
DEFAULT_THREADS = 4
#: ``choose``: the convolution layout the profile prices cheaper; ``inductor``: Inductor's own rule
LAYOUTS = ("choose", "inductor")


class OptionError(SuperoptError, ValueError):
    """An option of ``optimize`` is out of its range (the message says the range)."""


@dataclass(frozen=True)
class Options:
    """How ``optimize`` runs: the search and its limits, what a result must save to be kept
    (``min_gain``), the output check (``tolerance``, ``input_sets``: the model's examples first,
    then random draws; the rules are proven, the whole-model check is the safety net), the
    code-generation choices (``layout``, ``conv_relu``: cuDNN's fused convolution epilogues,
    ``kernels``: superopt's measured kernels where installed, ``kernel_profile``: the file(s)
    ``superopt tune`` wrote, read on top of the shipped profile) and ``portable`` (written code
    needs nothing but torch: no custom ops)."""

    search: str = "saturate"
    iterations: int = DEFAULT_LIMITS.iterations
    nodes: int = DEFAULT_LIMITS.nodes
    time_limit: float = DEFAULT_TIME_LIMIT
    alpha: float = DEFAULT_ALPHA
    budget: int = DEFAULT_BUDGET
    min_gain: float = DEFAULT_MIN_GAIN
    tolerance: float = DEFAULT_TOLERANCE
    input_sets: int = 2
    layout: str = "choose"
    conv_relu: bool = True
    kernels: bool = True
    kernel_profile: str | None = None
    portable: bool = False
    progress: bool = False

    def check(self) -> "Options":
        """Raise :class:`OptionError` naming the first option out of range; else ``self``."""
        if self.search not in SEARCHES:
            raise OptionError(f"search {self.search!r}: give one of {', '.join(SEARCHES)}")
        if self.layout not in LAYOUTS:
            raise OptionError(f"layout {self.layout!r}: give one of {', '.join(LAYOUTS)}")
        if not (isinstance(self.tolerance, (int, float)) and math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise OptionError(f"tolerance {self.tolerance:g}: give a relative error of at least 0 "
                              f"(default {DEFAULT_TOLERANCE:g})")
        if not (isinstance(self.min_gain, (int, float)) and 0.0 <= self.min_gain < 1.0):
            raise OptionError(f"min-gain {self.min_gain:g}: give a share of the cost from 0 (keep any gain) "
                              f"to below 1 (default {DEFAULT_MIN_GAIN:g})")
        if self.kernel_profile is not None:
            paths = self.kernel_profile.split(os.pathsep) if isinstance(self.kernel_profile, str) else [None]
            bad = [p for p in paths if not (p and os.path.isfile(p))]
            if bad:   # before the long work, not when the kernel pass reads it
                raise OptionError(f"--kernel-profile names {bad[0]}, which is not a file: give the profile "
                                  f"`superopt tune` wrote")
        if not 1 <= self.input_sets <= 5:
            raise OptionError(f"input sets {self.input_sets}: give 1 (the examples) to 5")
        check_limits(self.alpha, self.budget, self.time_limit)
        self.limits().check()
        return self

    def limits(self) -> Limits:
        """The saturation's limits."""
        return replace(DEFAULT_LIMITS, iterations=self.iterations, nodes=self.nodes, seconds=self.time_limit)

    @classmethod
    def from_dict(cls, options: dict | None) -> "Options":
        """Options from a dict (the backend's ``options={...}``); unknown names are refused."""
        names = {f.name for f in fields(cls)}
        bad = sorted(set(options or {}) - names)
        if bad:
            raise OptionError(f"unknown option(s) {', '.join(bad)}; known: {', '.join(sorted(names))}")
        return cls(**(options or {})).check()


def output_path(args) -> Path:
    """Where ``optimize`` writes: ``-o``, else beside the model (``NAME.opt.pt2`` for the zoo)."""
    if args.output:
        return Path(args.output)
    if args.zoo:
        return Path(f"{args.zoo}.opt.pt2")
    src = Path(args.model)
    for suffix in (".pt2", ".onnx"):
        if src.name.endswith(suffix):
            return src.with_name(src.name[:-len(suffix)] + ".opt" + suffix)
    return src.with_name(src.name + ".opt.pt2")
