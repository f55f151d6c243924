"""What a worker runs for a task: build each point's job, plan it, simulate it. Importable and picklable.

A task is one point or a few points of the same hardware and model (:func:`run_points`): the hardware spec
and the model are loaded once per task — loading a preset costs more than simulating a small model — and
held only for that task. Each point builds its own job, plan and simulator (a fresh ``simpy.Environment``
inside ``simulate_plan``), so any process — a local pool's or a Dask worker's — can run any task, in any
order, any number of times, with the same result.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from hardware_models import HardwareSpec
from planner.job import JobRequest, make_job, make_plan, resolve_hardware, simulate_job
from planner.result_json import infeasible_json, simulated_json
from policies import PlanInfeasible, get_policy, parse_knobs
from workloads import ModelSpec, load_model

Loaded = dict[tuple[str, ...], HardwareSpec | ModelSpec]  # what one task has loaded, by (kind, name, *sets)


def run_points(items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Run several ``(key, inputs)`` points as one task (see :func:`run_point` for each outcome)."""
    loaded: Loaded = {}
    return [run_point(key, inputs, loaded) for key, inputs in items]


def run_point(key: str, inputs: Mapping[str, Any], loaded: Loaded | None = None) -> dict[str, Any]:
    """Simulate one point; never raises for the point's own errors.

    Returns ``{"key", "status": "done"|"failed", "result": simulate --json object or None, "error": one line
    or None, "traceback": text or None, "wall_s"}``. A policy's up-front infeasible verdict is a result
    (``feasible`` false), not a failure.
    """
    t0 = time.perf_counter()
    try:
        result = simulate_point(inputs, {} if loaded is None else loaded)
    except Exception as e:  # recorded as this point's failure; the sweep goes on
        return {"key": key, "status": "failed", "result": None, "error": f"{type(e).__name__}: {_one_line(e)}",
                "traceback": traceback.format_exc(), "wall_s": time.perf_counter() - t0}
    return {"key": key, "status": "done", "result": result, "error": None, "traceback": None,
            "wall_s": time.perf_counter() - t0}


def simulate_point(inputs: Mapping[str, Any], loaded: Loaded) -> dict[str, Any]:
    """The ``simulate --json`` object of ``simulate --hw H --set ... --model M --policy P --knob ...``."""
    hw_key = ("hardware", inputs["hardware"], *inputs["set"])
    if hw_key not in loaded:
        loaded[hw_key] = resolve_hardware(inputs["hardware"], inputs["set"])
    model_key = ("model", inputs["model"])
    if model_key not in loaded:
        loaded[model_key] = load_model(inputs["model"])
    hw, model = loaded[hw_key], loaded[model_key]
    assert isinstance(hw, HardwareSpec) and isinstance(model, ModelSpec)
    job, _ = make_job(hw, model, JobRequest(**inputs["workload"]))
    info = get_policy(inputs["policy"])
    knobs = parse_knobs(info, inputs["knobs"])
    try:
        plan = make_plan(job, info.name, inputs["knobs"], template=True)  # rank 0's tasks where it can: same figures
    except PlanInfeasible as e:
        return infeasible_json(e, job, knobs)
    return simulated_json(simulate_job(job, info.name, inputs["knobs"], plan=plan)[1])


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or repr(e)


def importable() -> bool:
    """A probe a cluster runs once before a sweep: True when its workers can import this module."""
    return True
