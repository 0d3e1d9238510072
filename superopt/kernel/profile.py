"""The kernel profile: measured times of superopt's kernels and of Inductor's code for the same
regions, keyed so that a machine without the GPU still gets the decision.

An entry is one region at one precision on one device: the region's **signature** (the
structural hash of its graph: operators, attributes and shapes, names of inputs and weights
ignored), the dtype, the device name, the torch and Triton versions it was measured with, the
winning kernel program (text) and tile configuration, its time, Inductor's time for the same
region measured in the same run, and how many (program, config) pairs were timed. Profiles are
JSON files; the ones measured on the H100 and the H200 ship as package data
(``superopt/kernel/profiles``, one file a GPU) and are read by :func:`shipped_profile`; ``superopt tune`` writes one for the user's shapes.

A region timed alone is not the region in its model: there Inductor fuses across the region's
boundary (a residual add into the next LayerNorm) and merges sibling projections, and a launch
costs what the neighbours leave of it. So a profile also keeps **model verdicts**
(:class:`ModelVerdict`): for one whole searched graph (its signature), which regions' kernels
made the model itself faster when timed with and without them (``superopt tune`` measures it),
and whether the original program, timed in the same run, beat the rewrite (then the original is
written for that model on that device). Where a verdict exists the kernel pass follows it;
elsewhere it decides per region.

>>> p = KernelProfile()
>>> p.add(KernelEntry("abc", "bf16", "NVIDIA H100", "kernel k", "{}", 10.0, 14.0))
>>> p.lookup("abc", "bf16").speedup
1.4
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from ..errors import SerializationError
from ..fileio import atomic_path
from ..ir.graph import Graph
from ..ir.hashing import structural_hash

__all__ = ["KernelEntry", "ModelVerdict", "KernelProfile", "region_signature", "shipped_profile", "default_profile",
           "PROFILE_ENV", "FORMAT", "same_gpu"]

#: the environment variable naming the user's kernel profiles (``superopt tune``'s output; several
#: joined by the path separator), read on top of the shipped ones by every door
PROFILE_ENV = "SUPEROPT_KERNEL_PROFILE"

FORMAT = "superopt.kernel-profile"
VERSION = 1


def region_signature(region: Graph) -> str:
    """The key of a region in a profile: its structure and shapes, not its names or weight data."""
    return structural_hash(region)


@dataclass(frozen=True)
class KernelEntry:
    """One measured region (see the module docstring); times in microseconds."""

    signature: str
    dtype: str
    device: str
    program: str
    config: str
    us: float
    inductor_us: float
    torch: str = ""
    triton: str = ""
    measured: int = 1
    region: str = ""  # a one-line description (the region's operators and shapes), for people

    @property
    def speedup(self) -> float:
        return round(self.inductor_us / self.us, 4) if self.us > 0 else 0.0


@dataclass(frozen=True)
class ModelVerdict:
    """Which kernels a whole model ran faster with, measured on ``device``: ``signature`` is the
    searched graph's (the kernel pass's input), ``kernels`` the region signatures whose kernels to
    use (empty: none), ``us`` the model's time with them and ``inductor_us`` without any (the
    same graph under Inductor); ``tried``: each kernel set timed, as ``[[signatures], us]``;
    ``programs``: ``(signature, program text)`` of each kept kernel as timed in the model, so that
    a region measured again since (for another model) is not taken as approved.

    ``original_us``: the original program (as imported) timed in the same run (0: not timed, a
    verdict written before it was); ``original``: it beat the rewrite, so the original is written
    for this model on this device: then ``kernels`` is empty and ``us`` is the rewrite's best time
    (the searched graph with the kernel set in ``tried`` that won against it, or without kernels).

    >>> ModelVerdict("m", "bf16", "gpu", (), 104.0, 104.0, original_us=100.0, original=True).why_original
    'the device timed the rewrite slower than the original: 104.0 us vs 100.0 us (gpu)'
    """

    signature: str
    dtype: str
    device: str
    kernels: tuple = ()
    us: float = 0.0
    inductor_us: float = 0.0
    tried: tuple = ()
    torch: str = ""
    triton: str = ""
    model: str = ""  # a one-line description, for people
    programs: tuple = ()
    original_us: float = 0.0
    original: bool = False

    @property
    def speedup(self) -> float:
        return round(self.inductor_us / self.us, 4) if self.us > 0 else 0.0

    @property
    def why_original(self) -> str | None:
        """Why the original program is written (None: the verdict keeps the rewrite)."""
        if not self.original:
            return None
        than = "slower than" if self.us >= self.original_us else \
            f"only {100 * (1 - self.us / self.original_us):.1f}% faster than"
        return (f"the device timed the rewrite {than} the original: {self.us:.1f} us vs {self.original_us:.1f} us "
                f"({self.device})")

    def approved(self, profile: "KernelProfile") -> frozenset:
        """The kept regions whose profile entry is still the program timed in the model (all kept
        ones where the verdict predates pinned programs)."""
        pinned = dict(self.programs)
        out = set()
        for sig in self.kernels:
            entry = profile.lookup(sig, self.dtype, self.device)
            if sig not in pinned or (entry is not None and entry.program == pinned[sig]):
                out.add(sig)
        return frozenset(out)


def same_gpu(a: str, b: str) -> bool:
    """Whether two device names are one kind of GPU: a profile stores the name torch reports
    ("NVIDIA H200"), the cost model passes its key ("h200"; :func:`superopt.cost.devices.device_key`).

    >>> same_gpu("NVIDIA H200", "h200"), same_gpu("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    (True, False)
    """
    from ..cost.devices import device_key
    return a == b or device_key(a) == device_key(b)


def _measured_on(hits: list, device: str | None) -> list:
    """The entries or verdicts of ``hits`` measured on ``device`` if any, else on the H100, else all:
    one order for both, so a GPU without measurements of its own gets the H100's together."""
    same = [h for h in hits if device is not None and same_gpu(h.device, device)]
    return same or [h for h in hits if same_gpu(h.device, "h100")] or hits


@dataclass
class KernelProfile:
    """Entries by (signature, dtype, device); model verdicts likewise (a profile may mix devices)."""

    entries: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)

    def add_model(self, v: ModelVerdict) -> None:
        """Keep ``v`` (the latest measurement of a model replaces an older one)."""
        self.models[(v.signature, v.dtype, v.device)] = v

    def lookup_model(self, signature: str, dtype: str, device: str | None = None) -> ModelVerdict | None:
        """The verdict for a searched graph at a precision: measured on ``device`` (a GPU's name
        or its key, :func:`same_gpu`) if there is one, else on the H100, else any."""
        hits = [v for (s, d, dev), v in self.models.items() if s == signature and d == dtype]
        return (_measured_on(hits, device) or [None])[0]

    def lookup_model_by_candidates(self, candidates: frozenset, dtype: str,
                                   device: str | None = None) -> ModelVerdict | None:
        """A verdict that keeps kernels, measured on another searched graph whose candidate regions
        (every region in a kernel set it timed) are exactly ``candidates``; measured on ``device``
        first, as :meth:`lookup_model`. None where no verdict's candidates are those."""
        hits = [v for v in self.models.values() if v.dtype == dtype and v.kernels and not v.original
                and frozenset(sig for kernels, _us in v.tried for sig in kernels) == candidates]
        return (_measured_on(hits, device) or [None])[0]

    def add(self, e: KernelEntry) -> None:
        old = self.entries.get((e.signature, e.dtype, e.device))
        if old is None or e.us < old.us:
            self.entries[(e.signature, e.dtype, e.device)] = e

    def lookup(self, signature: str, dtype: str, device: str | None = None) -> KernelEntry | None:
        """The entry for a region at a precision: measured on ``device`` (a GPU's name or its key,
        :func:`same_gpu`) if there is one, else on the H100 (as :meth:`lookup_model` answers, so
        that a GPU without measurements of its own gets the H100's kernels and verdicts together),
        else the fastest measured anywhere."""
        hits = [e for (s, d, dev), e in self.entries.items() if s == signature and d == dtype]
        pool = _measured_on(hits, device)
        return min(pool, key=lambda e: e.us) if pool else None

    def merge(self, other: "KernelProfile") -> "KernelProfile":
        out = KernelProfile(dict(self.entries), dict(self.models))
        for e in other.entries.values():
            out.add(e)
        for v in other.models.values():
            out.add_model(v)
        return out

    def to_json(self) -> dict:
        rows = sorted((asdict(e) for e in self.entries.values()), key=lambda r: (r["signature"], r["dtype"], r["device"]))
        doc = {"format": FORMAT, "version": VERSION, "entries": rows}
        if self.models:
            doc["models"] = sorted((dict(asdict(v), kernels=list(v.kernels), tried=[list(t) for t in v.tried],
                                         programs=[list(p) for p in v.programs])
                                    for v in self.models.values()), key=lambda r: (r["signature"], r["dtype"], r["device"]))
        return doc

    def save(self, path) -> None:
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def from_json(cls, doc, where: str = "kernel profile") -> "KernelProfile":
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise SerializationError(f"{where}: not a kernel profile (missing \"format\": \"{FORMAT}\")")
        if doc.get("version") != VERSION:
            raise SerializationError(f"{where}: kernel profile version {doc.get('version')!r} is not supported")
        prof = cls()
        try:
            for row in doc["entries"]:
                prof.add(KernelEntry(**row))
            for row in doc.get("models", []):
                row = {k: v for k, v in row.items() if k != "pdl"}   # session 45's launch flag: kernels launch plainly
                prof.add_model(ModelVerdict(**dict(row, kernels=tuple(row.get("kernels", ())),
                                                   tried=tuple((tuple(k), float(us)) for k, us in row.get("tried", ())),
                                                   programs=tuple((str(k), str(p)) for k, p in row.get("programs", ())),
                                                   **_original_fields(row))))
        except (KeyError, TypeError, ValueError) as e:
            raise SerializationError(f"{where}: a malformed entry ({e}); measure it again with `superopt tune`") from None
        return prof

    @classmethod
    def load(cls, path) -> "KernelProfile":
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SerializationError(f"cannot read kernel profile {path}: {e}") from None
        return cls.from_json(doc, str(path))


def _original_fields(row: dict) -> dict:
    """A verdict's original-program fields, checked (absent in verdicts written before them)."""
    original = row.get("original", False)
    if not isinstance(original, bool):
        raise ValueError(f"\"original\" must be true or false, not {original!r}")
    return {"original_us": float(row.get("original_us", 0.0)), "original": original}


def shipped_profile() -> KernelProfile:
    """Every kernel profile shipped with superopt, merged (one file a GPU: the H100's, the H200's)."""
    prof = KernelProfile()
    folder = resources.files("superopt.kernel") / "profiles"
    if folder.is_dir():
        for f in sorted(folder.iterdir(), key=lambda f: f.name):
            if f.name.endswith(".json"):
                prof = prof.merge(KernelProfile.from_json(json.loads(f.read_text()), f.name))
    return prof


def default_profile(extra: str | None = None) -> KernelProfile:
    """The shipped profiles with the user's on top: those ``$SUPEROPT_KERNEL_PROFILE`` names, then
    those ``extra`` names (``optimize --kernel-profile``; several joined by the path separator):
    what ``superopt tune`` wrote; their verdicts replace shipped ones for the same model and
    device. A named file that cannot be read is an error, not silently the shipped decision."""
    prof = shipped_profile()
    named = [(PROFILE_ENV, p) for p in os.environ.get(PROFILE_ENV, "").split(os.pathsep)] + \
        [("--kernel-profile", p) for p in (extra or "").split(os.pathsep)]
    for where, path in named:
        if not path:
            continue
        if not Path(path).is_file():
            raise SerializationError(f"{where} names {path}, which is not a file: give the profile "
                                     f"`superopt tune` wrote")
        prof = prof.merge(KernelProfile.load(path))
    return prof
