"""Sweeps: a grid of simulations (YAML) run on a local process pool or a Dask cluster into a SQLite store.

    from planner.sweep import sweep
    frame = sweep("examples/sweep.yaml", "sweep.sqlite")            # local pool; a pandas DataFrame
    frame = sweep("examples/sweep.yaml", "sweep.sqlite", workers=2)  # a local Dask cluster
    frame = sweep("examples/sweep.yaml", "sweep.sqlite", scheduler="tcp://10.0.0.5:8786")

Modules: ``grid`` (sweep file → points keyed by the hash of their inputs), ``worker`` (one point → its
``simulate --json`` object), ``store`` (the SQLite store and its readers), ``runner`` (the executors),
``progress`` (the progress line).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from planner.sweep.grid import Point, SweepFileError, expand_grid, load_grid
from planner.sweep.runner import SweepAborted, SweepSetupError, SweepSummary, run_sweep
from planner.sweep.store import StoreError, read_failures, read_results, results_frame

if TYPE_CHECKING:
    import pandas as pd


def sweep(grid: str | Path | Sequence[Point], store: str | os.PathLike[str], *, processes: int | None = None,
          workers: int | None = None, scheduler: str | None = None, retry_failed: bool = False,
          progress: TextIO | None = None) -> pd.DataFrame:
    """Run a sweep file (or its points) into ``store`` (only what the store lacks) and return the rows of these
    points as a DataFrame (see ``results_frame``)."""
    points = load_grid(grid) if isinstance(grid, str | Path) else list(grid)
    run_sweep(points, store, processes=processes, workers=workers, scheduler=scheduler,
              retry_failed=retry_failed, progress=progress)
    frame = results_frame(store)
    keys = {p.key for p in points}
    return frame[frame["key"].isin(keys)].reset_index(drop=True)


__all__ = ["Point", "StoreError", "SweepAborted", "SweepFileError", "SweepSetupError", "SweepSummary",
           "expand_grid", "load_grid", "read_failures", "read_results", "results_frame", "run_sweep", "sweep"]
