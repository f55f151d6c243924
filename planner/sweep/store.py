"""The durable results store of sweeps: one SQLite file, one row per run keyed by the hash of its inputs.

Each row holds the point's inputs (JSON and as columns), its status (``done`` or ``failed``), the full
``simulate --json`` object of a done run, the error of a failed one, and the main figures as columns for
queries. Only the sweep's client writes, one row per finished point, committed at once: a killed client or
worker loses nothing that finished, and a row, once written, is never written again (``INSERT ... ON
CONFLICT DO NOTHING``; a failed row may be replaced by a retry, a done row never). WAL journaling lets
readers (``tiersim results``, reports) open the file while a sweep writes it.

The store records which tiersim filled it (``meta`` row ``tiersim_version``). A sweep refuses to add to a
store filled by another version (or by one that did not record it, while it holds runs): the same point may
simulate differently there, and mixing rows of two versions in one table would pass old figures for new.
The refusal names both versions; use a new ``--store`` (the old file stays readable by ``tiersim results``).

Readers: :func:`read_results` (simulate --json objects plus ``"point"``) and :func:`results_frame` (a pandas
DataFrame with one row per run, the columns of :data:`COLUMNS`).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.version import tiersim_version

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 2  # 2: hw_tflops_per_gpu and hfu columns
APPLICATION = "tiersim.sweep"  # the meta row that marks a store as tiersim's (stores before it: schema row only)
_SQLITE_HEADER = b"SQLite format 3\x00"
# (column, SQL type): the point's inputs, then the status, then the main figures of its result
POINT_COLUMNS = (("hardware", "TEXT"), ("hw_set", "TEXT"), ("model", "TEXT"), ("policy", "TEXT"), ("knobs", "TEXT"),
                 ("global_batch", "INTEGER"), ("micro_batch", "INTEGER"), ("seq_len", "INTEGER"),
                 ("precision", "TEXT"), ("checkpointing", "TEXT"), ("flash_attention", "INTEGER"))
FIGURE_COLUMNS = (("feasible", "INTEGER"), ("verdict", "TEXT"), ("oom_pool", "TEXT"), ("n_gpus", "INTEGER"),
                  ("params", "REAL"), ("step_time_s", "REAL"), ("tokens_per_s", "REAL"), ("tflops_per_gpu", "REAL"),
                  ("mfu", "REAL"), ("hw_tflops_per_gpu", "REAL"), ("hfu", "REAL"),
                  ("peak_gpu_bytes", "REAL"), ("peak_cpu_bytes", "REAL"),
                  ("peak_nvme_bytes", "REAL"), ("exposed_transfer_s", "REAL"), ("sim_events", "INTEGER"),
                  ("sim_wall_s", "REAL"))
COLUMNS = ("key", "status", *(c for c, _ in POINT_COLUMNS), *(c for c, _ in FIGURE_COLUMNS), "error", "wall_s")
ORDER = "hardware, hw_set, model, policy, knobs, global_batch, micro_batch, seq_len, precision, checkpointing, key"
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
    key TEXT PRIMARY KEY,
    status TEXT NOT NULL CHECK (status IN ('done', 'failed')),
    {", ".join(f"{c} {t}" for c, t in (*POINT_COLUMNS, *FIGURE_COLUMNS))},
    error TEXT,
    traceback TEXT,
    wall_s REAL,
    point_json TEXT NOT NULL,
    result_json TEXT
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StoreError(ValueError):
    """A store file that cannot be used: one line naming the file and the fix."""


class SweepStore:
    """The writer's handle (the sweep's client); use as a context manager."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise StoreError(f"{path}: directory '{self.path.parent}' does not exist; create it or pick another path")
        fresh = _claim(self.path)  # a file that holds anything is opened only once it is known to be a store
        try:
            self._db = sqlite3.connect(self.path)
        except sqlite3.Error as e:
            raise StoreError(f"{path}: cannot open the sweep store ({e}); pick another --store path") from None
        try:
            self._db.executescript(_SCHEMA)
            self._db.execute("PRAGMA journal_mode=WAL")  # readers while the sweep writes
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a killed process loses no commit
            if fresh:
                self._db.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                                     [("schema", str(SCHEMA_VERSION)), ("application", APPLICATION)])
                self._db.commit()
            _check_filled_by_this_version(self._db, path)
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise StoreError(f"{path}: cannot write the sweep store ({e}); make it writable or pick another "
                             "--store path") from None

    def __enter__(self) -> SweepStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def keys(self, statuses: Iterable[str] = ("done", "failed")) -> set[str]:
        wanted = tuple(statuses)
        marks = ", ".join("?" * len(wanted))
        return {k for (k,) in self._db.execute(f"SELECT key FROM runs WHERE status IN ({marks})", wanted)}

    def add(self, key: str, point: Mapping[str, Any], outcome: Mapping[str, Any], *,
            replace_failed: bool = False) -> bool:
        """Write one finished point and commit; False (and nothing written) when its key is already stored
        (a failed row is replaced when ``replace_failed``)."""
        row = {"key": key, "status": outcome["status"], **point_columns(point, outcome.get("result")),
               **figure_columns(outcome.get("result")), "error": outcome.get("error"),
               "traceback": outcome.get("traceback"), "wall_s": outcome.get("wall_s"),
               "point_json": json.dumps(point, sort_keys=True),
               "result_json": json.dumps(outcome["result"]) if outcome.get("result") is not None else None}
        names = list(row)
        conflict = "DO NOTHING"
        if replace_failed:
            conflict = ("DO UPDATE SET " + ", ".join(f"{n} = excluded.{n}" for n in names if n != "key")
                        + " WHERE runs.status = 'failed'")
        try:
            cur = self._db.execute(f"INSERT INTO runs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
                                   f"ON CONFLICT(key) {conflict}", [row[n] for n in names])
            self._db.commit()
        except sqlite3.DatabaseError as e:  # the disk filled up, the file turned read-only or was replaced
            raise StoreError(f"{self.path}: cannot write the sweep store ({e}); what finished before is stored: "
                             "fix the file and run the same sweep again") from None
        return cur.rowcount == 1


def _check_filled_by_this_version(db: sqlite3.Connection, path: str | os.PathLike[str]) -> None:
    """Record this tiersim's version in a store without runs; refuse one filled by another version."""
    this = tiersim_version()
    row = db.execute("SELECT value FROM meta WHERE name = 'tiersim_version'").fetchone()
    if row is not None and row[0] == this:
        return
    if row is None and db.execute("SELECT 1 FROM runs LIMIT 1").fetchone() is None:
        db.execute("INSERT INTO meta VALUES ('tiersim_version', ?)", (this,))
        db.commit()
        return
    filled_by = f"tiersim {row[0]}" if row is not None else "a tiersim that did not record its version"
    raise StoreError(f"{path}: filled by {filled_by}, this is tiersim {this}: its results are not reused (they may "
                     "differ); pick a new --store (the old one stays readable by tiersim results)")


def point_columns(point: Mapping[str, Any], result: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The inputs as columns; the workload as the run resolved it (defaults filled in) when it ran."""
    w = {**point.get("workload", {}), **((result or {}).get("workload") or {})}
    flash = w.get("flash_attention")
    return {"hardware": point["hardware"], "hw_set": " ".join(point.get("set", [])),
            "model": point["model"], "policy": point["policy"],
            "knobs": " ".join(f"{k}={_knob_text(v)}" for k, v in sorted(point.get("knobs", {}).items())),
            "global_batch": w.get("global_batch"), "micro_batch": w.get("micro_batch"), "seq_len": w.get("seq_len"),
            "precision": w.get("precision"), "checkpointing": w.get("checkpointing"),
            "flash_attention": None if flash is None else int(flash)}


def figure_columns(result: Mapping[str, Any] | None) -> dict[str, Any]:
    cols: dict[str, Any] = dict.fromkeys(c for c, _ in FIGURE_COLUMNS)
    if result is None:
        return cols
    peaks = result.get("peak_bytes") or {}

    def peak(*prefixes: str) -> float | None:
        values = [v for pool, v in peaks.items() if pool.startswith(prefixes)]
        return max(values) if values else None

    oom = result.get("oom") or {}
    sim = result.get("sim") or {}
    cols.update(feasible=int(bool(result["feasible"])), verdict=result.get("verdict"), oom_pool=oom.get("pool"),
                n_gpus=result.get("n_gpus"), params=(result.get("model") or {}).get("params"),
                step_time_s=result.get("step_time_s"), tokens_per_s=result.get("tokens_per_s"),
                tflops_per_gpu=result.get("tflops_per_gpu"), mfu=result.get("mfu"),
                hw_tflops_per_gpu=result.get("hw_tflops_per_gpu"), hfu=result.get("hfu"),
                peak_gpu_bytes=peak("gpu", "unified"), peak_cpu_bytes=peak("cpu"), peak_nvme_bytes=peak("nvme"),
                exposed_transfer_s=result.get("exposed_transfer_s"), sim_events=sim.get("events"),
                sim_wall_s=sim.get("wall_s"))
    return cols


def _knob_text(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def _open_for_reading(path: str | os.PathLike[str]) -> sqlite3.Connection:
    p = Path(path)
    if not p.is_file():
        raise StoreError(f"{path}: no such sweep store; give the file `tiersim sweep --store` wrote")
    problem = foreign_store_problem(p)
    if problem is not None:
        raise StoreError(f"{path}: not a sweep store ({problem}); give the file `tiersim sweep --store` wrote")
    try:
        return sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path}: cannot read the sweep store ({e})") from None


def _claim(path: Path) -> bool:
    """Make ``path`` ready for :class:`SweepStore`: True when it is new (created here, empty, mode 0o600);
    False when it is an existing sweep store we may write. Anything else -- a file that is not SQLite,
    another application's database (even one with a ``runs`` table), a store of another schema, a file
    that cannot be written -- is a StoreError, and the file is not touched (not even opened for writing)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise StoreError(f"{path}: cannot create the sweep store ({e.strerror or e}); pick another --store "
                         "path") from None
    else:
        os.close(fd)
        return True
    if not path.is_file():
        raise StoreError(f"{path}: not a regular file; give a sweep store file or a new path")
    empty = path.stat().st_size == 0
    if not empty:
        problem = foreign_store_problem(path)
        if problem is not None:
            raise StoreError(f"{path}: not a sweep store of tiersim ({problem}); it is left unchanged: pick another "
                             "--store path")
    for target, what in ((path, "file"), (path.parent, "directory")):
        if not os.access(target, os.W_OK):
            raise StoreError(f"{path}: the sweep store's {what} is read-only; make it writable (chmod u+w "
                             f"{target}) or pick another --store path")
    return empty


def foreign_store_problem(path: Path) -> str | None:
    """None when ``path`` (an existing, non-empty file) is a sweep store of this schema, else what it is
    instead. Read through a read-only connection: the file is never changed, nothing is created beside it."""
    with open(path, "rb") as f:
        head = f.read(len(_SQLITE_HEADER))
    if head != _SQLITE_HEADER:
        return "not an SQLite database"
    # immutable: no lock, no -shm or -wal file created beside another application's database; a -wal
    # already there (a sweep that was killed) holds committed rows, read through a plain read-only connection
    wal = path.with_name(path.name + "-wal").exists()
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?{'mode=ro' if wal else 'immutable=1'}", uri=True)
    except sqlite3.Error as e:
        return f"cannot be opened: {e}"
    try:
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                           "AND name NOT LIKE 'sqlite_%'")}
        if tables != {"runs", "meta"}:
            return f"an SQLite database with tables {', '.join(sorted(tables)) or '(none)'}"
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
        columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    except (sqlite3.Error, ValueError) as e:
        return f"an SQLite database tiersim cannot read: {e}"
    finally:
        db.close()
    if meta.get("application", APPLICATION) != APPLICATION:
        return f"the database of {meta['application']!r}"
    if "schema" not in meta:
        return "an SQLite database with tables meta and runs but no tiersim schema row"
    if meta["schema"] != str(SCHEMA_VERSION):
        return f"a sweep store of schema {meta['schema']}, this tiersim uses {SCHEMA_VERSION}"
    missing = [c for c in (*COLUMNS, "point_json", "result_json") if c not in columns]
    if missing:
        return f"its runs table lacks column(s) {', '.join(missing)}"
    return None


def column_kinds() -> dict[str, str]:
    """The kind of every column of :func:`results_frame` for ``tiersim results --where``: number, text or
    boolean (``feasible``, ``flash_attention``)."""
    sql = {"key": "TEXT", "status": "TEXT", "error": "TEXT", "wall_s": "REAL", **dict(POINT_COLUMNS),
           **dict(FIGURE_COLUMNS)}
    kinds = {c: "number" if sql[c] in ("INTEGER", "REAL") else "text" for c in COLUMNS}
    kinds.update(feasible="boolean", flash_attention="boolean")
    return kinds


def read_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every finished run (status done): its ``simulate --json`` object plus ``"point"`` (its inputs:
    hardware, set, model, policy, knobs, workload) and ``"key"``; in a stable order (by the inputs)."""
    db = _open_for_reading(path)
    try:
        rows = db.execute(f"SELECT key, point_json, result_json FROM runs WHERE status = 'done' ORDER BY {ORDER}")
        return [{**json.loads(result), "point": json.loads(point), "key": key} for key, point, result in rows]
    finally:
        db.close()


def read_failures(path: str | Path) -> list[dict[str, Any]]:
    """Every failed run: ``{"key", "point", "error", "traceback"}``, in the order of :func:`read_results`."""
    db = _open_for_reading(path)
    try:
        rows = db.execute("SELECT key, point_json, error, traceback FROM runs WHERE status = 'failed' "
                          f"ORDER BY {ORDER}")
        return [{"key": k, "point": json.loads(p), "error": e, "traceback": t} for k, p, e, t in rows]
    finally:
        db.close()


def results_frame(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per stored run (done and failed), the columns of :data:`COLUMNS`; ``feasible`` and
    ``flash_attention`` as booleans (missing for failed runs), in the order of :func:`read_results`."""
    import pandas as pd

    db = _open_for_reading(path)
    try:
        frame = pd.read_sql_query(f"SELECT {', '.join(COLUMNS)} FROM runs ORDER BY {ORDER}", db)
    finally:
        db.close()
    for col in ("feasible", "flash_attention"):
        frame[col] = frame[col].map({1: True, 0: False}).astype("boolean")
    return frame
