"""A held-out check of the simulator against a whole published benchmark table: llm-foundry's MPT runs.

``tiersim validate`` compares eight rows of llm-foundry's benchmark README (one per model size and GPU, seq
2048), each within a tolerance; seven of them come from the tables copied here, which hold 149 more 8-GPU bf16
rows (156 in all), from 125M to 30B parameters, sequences 512-65536, with and without activation checkpointing,
measured on two software stacks (``tiersim/published/llm_foundry_8gpu.csv``, copied with its provenance). This
module simulates every row as ``tiersim validate`` simulates its eight (:func:`tiersim.validate_runs.foundry_run`:
ZeRO-3 for FSDP FULL_SHARD, the row's micro-batch and accumulation, early stop where the table ran torch 2.1)
and reports the MFU error per row and per group (table, GPU, checkpointing), each row's role apart
(:attr:`TableRow.role`): fitted (the 73 rows ``tiersim.foundry_fit`` fitted the Ampere and Hopper compute
figures to), held out (the other 76: the whole 2023-05 table and three of the H100 table's model sizes) or
compared by ``tiersim validate``. It is a measurement, not a test with a tolerance: ``tiersim validate
--llm-foundry`` prints it.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources

from tiersim.validate_runs import RUNS, foundry_run, run_figures

__all__ = ["TableOutcome", "TableRow", "group_summaries", "load_rows", "simulate_rows"]

TABLE_FILE = "llm_foundry_8gpu.csv"
TORCH_2_1_TABLES = ("2023-10",)  # the tables measured on mosaicml/pytorch:2.1.0_cu121 (the file's header)
# the rows the Ampere and Hopper compute figures were fitted to (tiersim.foundry_fit): the 2023-10 A100-80GB table
# and these model sizes of the H100 table, less the rows tiersim validate compares
FIT_A100_TABLES = ("2023-10",)
FIT_H100_SIZES = ("760m", "3b", "13b")
GPU_NAMES = {"a100_80gb": "A100-80GB", "h100_80gb": "H100-80GB"}


@dataclass(frozen=True)
class TableRow:
    """One published row: which table (``2023-10`` or ``2023-05``), GPU, model size, shape and batch, figures."""

    table: str
    gpu: str
    model: str
    seq_len: int
    micro_batch: int
    grad_accum: int
    checkpointing: bool
    mfu: float   # fraction of the dense bf16 peak
    hfu: float
    num_params: int

    @property
    def label(self) -> str:
        ckpt = " ckpt" if self.checkpointing else ""
        return (f"{self.table} {GPU_NAMES.get(self.gpu, self.gpu)} {self.model} seq {self.seq_len} "
                f"mb {self.micro_batch} x{self.grad_accum}{ckpt}")

    @property
    def role(self) -> str:
        """``validate`` (``tiersim validate`` compares it), ``fitted`` (tiersim.foundry_fit fitted the Ampere or
        Hopper compute figures to it) or ``held out``."""
        if self.in_validate:
            return "validate"
        if (self.gpu == "a100_80gb" and self.table in FIT_A100_TABLES) or (
                self.gpu == "h100_80gb" and self.model in FIT_H100_SIZES):
            return "fitted"
        return "held out"

    @property
    def in_validate(self) -> bool:
        """Whether ``tiersim validate`` compares this row itself (so it is not held out)."""
        return any(r.name.startswith(f"MPT-{self.model} 8x {self.gpu.replace('_', '-').upper()} seq {self.seq_len}")
                   and r.micro == self.micro_batch and r.mfu is not None and abs(r.mfu - self.mfu) < 5e-5
                   for r in RUNS)


def load_rows(text: str | None = None) -> list[TableRow]:
    """The rows of the packaged table (or of ``text``, the same CSV), comment lines skipped."""
    if text is None:
        text = resources.files("tiersim.published").joinpath(TABLE_FILE).read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return [TableRow(table=d["table"], gpu=d["gpu"], model=d["model"], seq_len=int(d["seq_len"]),
                     micro_batch=int(d["micro_batch"]), grad_accum=int(d["grad_accum"]),
                     checkpointing=d["activation_checkpointing"] == "True", mfu=float(d["mfu_pct"]) / 100,
                     hfu=float(d["hfu_pct"]) / 100, num_params=int(d["num_params"]))
            for d in csv.DictReader(lines)]


@dataclass(frozen=True)
class TableOutcome:
    row: TableRow
    simulated_mfu: float  # 0 where the simulated run does not fit
    fits: bool

    @property
    def error(self) -> float:
        """Relative MFU error, + = simulated faster than published."""
        return self.simulated_mfu / self.row.mfu - 1


def simulate_rows(rows: Iterable[TableRow], progress: Callable[[int, int, str], None] | None = None
                  ) -> list[TableOutcome]:
    """Simulate each row (``progress(i, n, label)`` before each)."""
    rows = list(rows)
    out = []
    for i, r in enumerate(rows):
        if progress is not None:
            progress(i, len(rows), r.label)
        run = foundry_run(r.model, r.num_params, r.gpu, r.seq_len, r.micro_batch, r.grad_accum, r.checkpointing,
                          r.mfu, r.hfu, torch_2_1=r.table in TORCH_2_1_TABLES)
        t = run_figures(run)
        fits = t.result is not None and t.result.feasible
        out.append(TableOutcome(r, t.mfu if fits else 0.0, fits))
    return out


@dataclass(frozen=True)
class GroupSummary:
    name: str
    n: int
    median: float
    mean_abs: float
    low: float
    high: float
    infeasible: int


def group_summaries(outcomes: Iterable[TableOutcome]) -> list[GroupSummary]:
    """Per (role, table, GPU, checkpointing) group (the ``validate`` rows as one): the MFU error's median, mean
    absolute value and range over the rows that fit, and how many did not fit; held-out groups first."""
    groups: dict[str, list[TableOutcome]] = {}
    order = {"held out": 0, "fitted": 1, "validate": 2}
    for o in outcomes:
        r = o.row
        name = ("in tiersim validate" if r.role == "validate" else
                f"{r.role}: {r.table} {GPU_NAMES.get(r.gpu, r.gpu)} {'ckpt' if r.checkpointing else 'no ckpt'}")
        groups.setdefault(name, []).append(o)
    roles = {name: order[os[0].row.role] for name, os in groups.items()}
    out = []
    for name in sorted(groups, key=lambda g: (roles[g], g)):
        fit = [o.error for o in groups[name] if o.fits]
        if not fit:
            out.append(GroupSummary(name, 0, 0.0, 0.0, 0.0, 0.0, len(groups[name])))
            continue
        out.append(GroupSummary(name, len(fit), statistics.median(fit), statistics.fmean(abs(e) for e in fit),
                                min(fit), max(fit), len(groups[name]) - len(fit)))
    return out
