"""The report of a generation run: limits, counts per level and per pruning step, verification
outcome, time per phase, peak memory; printable as a table and as JSON."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass, field

from .candidates import PruneStat
from .levels import LevelStat

__all__ = ["GenerateReport", "peak_memory_mb"]


def peak_memory_mb() -> float:
    """Peak resident memory of this process and of its finished children, in MiB."""
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 2**20
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) * scale


@dataclass
class GenerateReport:
    """What ``generate`` did (see the module docstring); ``rules`` are the pruned candidates."""

    settings: dict
    out: str | None
    runner: str
    resumed: bool = False
    stop_reason: str = "completed"
    levels: list[LevelStat] = field(default_factory=list)
    prune: PruneStat = field(default_factory=PruneStat)
    verify: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)
    peak_memory_mb: float = 0.0
    rules: list = field(default_factory=list, repr=False)

    @property
    def graphs(self) -> int:
        """Graphs enumerated (children built and fingerprinted, over all levels)."""
        return sum(s.children for s in self.levels)

    @property
    def classes(self) -> int:
        return sum(s.new_classes for s in self.levels)

    def to_json(self) -> dict:
        return {"settings": self.settings, "out": self.out, "runner": self.runner, "resumed": self.resumed,
                "stop_reason": self.stop_reason, "graphs": self.graphs, "classes": self.classes,
                "levels": [s.to_json() for s in self.levels], "prune": self.prune.to_json(),
                "verify": self.verify, "phases": self.phases, "peak_memory_mb": round(self.peak_memory_mb, 1),
                "rules": len(self.rules)}

    def _level_lines(self) -> list[str]:
        head = ("level", "parents", "graphs", "kept", "extended", "classes", "pairs", "graphs/s", "seconds")
        rows = [head]
        for s in self.levels:
            rate = s.children / s.seconds if s.seconds > 0 else 0.0
            rows.append((str(s.level), str(s.parents), str(s.children), str(s.kept), str(s.extended),
                         str(s.new_classes), str(s.pairs), f"{rate:,.0f}", f"{s.seconds:.1f}"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        return ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]

    def table(self) -> str:
        s = self.settings
        lines = [f"settings     N={s['max_ops']}, {len(s['ops'])} operators ({', '.join(s['ops'])}), "
                 f"{len(s['inputs'])} inputs, seed {s['seed']}, representatives "
                 f"{'on' if s['representatives'] else 'off'}, at most {s['max_outputs']} outputs",
                 f"ran on       {self.runner}{' (resumed from a checkpoint)' if self.resumed else ''}",
                 f"enumeration  {self.graphs} graphs, {self.classes} fingerprint classes"]
        lines += self._level_lines()
        p = self.prune
        lines.append(f"candidates   {p.pairs} pairs (member -> representative of its class)")
        lines += [f"  - {name:<18} {removed:>8}  -> {left}" for name, removed, left in p.steps()]
        if self.verify:
            v = self.verify
            lines.append(f"verified     {v.get('rules', 0)} rules: proven {v.get('proven', 0)}, unproven "
                         f"{v.get('unproven', 0)}, refuted {v.get('refuted', 0)}; "
                         f"{v.get('stored', 0)} new in {self.out}")
        else:
            lines.append(f"verified     not run ({'no --out given' if self.out is None else 'not asked'})")
        times = ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())
        lines.append(f"time         {times}; peak memory {self.peak_memory_mb:.0f} MiB")
        lines.append(f"stop reason  {self.stop_reason}")
        return "\n".join(lines)
