"""Canonical runs whose headline figures and plan fingerprints are pinned in tests/golden/*.json.

Every policy has a case on ``a100`` (7b) and on ``a100x8`` (70b) at the default workload, beside a few
hand-picked runs. Each golden stores the headline result *and* the sha256 of the plan's JSON: a pure
refactoring keeps both identical; a deliberate change of plan construction or of the cost model
regenerates the goldens in a commit of its own that says why. Regenerate with:

    .venv/bin/python tests/golden_cases.py

(the diff of the JSON files shows what moved).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from policies import PlanInfeasible
from simulator import Plan, simulate_plan
from tiersim.api import JobRequest, make_job, make_plan

GOLDEN_DIR = Path(__file__).parent / "golden"
POLICY_NAMES = ("none", "zero-offload", "zero-infinity", "tinypipe", "lazytrain", "synergyscale")

CASES: dict[str, dict[str, Any]] = {
    "zero_offload_70b_a100x8": {"hw": "a100x8", "model": "70b", "policy": "zero-offload", "knobs": {},
                                "request": {}},
    "zero_offload_7b_a100_dpu": {"hw": "a100", "model": "7b", "policy": "zero-offload",
                                 "knobs": {"delayed_update": True}, "request": {"global_batch": 4}},
    "none_zero3_13b_a100x8": {"hw": "a100x8", "model": "13b", "policy": "none", "knobs": {"stage": 3},
                              "request": {"global_batch": 16}},
    "none_gpt2xl_dgx_spark": {"hw": "dgx-spark", "model": "gpt2-xl", "policy": "none", "knobs": {},
                              "request": {"global_batch": 4}},
}
for _policy in POLICY_NAMES:
    for _hw, _model in (("a100", "7b"), ("a100x8", "70b")):
        _case = {"hw": _hw, "model": _model, "policy": _policy, "knobs": {}, "request": {}}
        if _case not in CASES.values():
            CASES[f"default_{_policy.replace('-', '_')}_{_model}_{_hw}"] = _case


def plan_fingerprint(plan: Plan) -> str:
    """sha256 of the plan's JSON with sorted keys: equal exactly when the plan is the same plan."""
    return hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()


def run_case(name: str) -> dict[str, Any]:
    c = CASES[name]
    job, _ = make_job(c["hw"], c["model"], JobRequest(**c["request"]))
    try:
        plan = make_plan(job, c["policy"], c["knobs"])
    except PlanInfeasible as e:
        return {"feasible": False, "plan_infeasible": str(e)}
    r = simulate_plan(plan, job.hw)
    return {
        "plan_sha256": plan_fingerprint(plan),
        "feasible": r.feasible,
        "step_time_s": r.step_time_s,
        "tokens_per_s": r.tokens_per_s,
        "mfu": r.mfu,
        "exposed_transfer_s": r.exposed_transfer_s,
        "peak_bytes": dict(sorted(r.peak_bytes.items())),
        "link_bytes": dict(sorted(r.link_bytes.items())),
        "sim_method": r.sim.method,
    }


def main() -> None:
    GOLDEN_DIR.mkdir(exist_ok=True)
    for name in CASES:
        (GOLDEN_DIR / f"{name}.json").write_text(json.dumps(run_case(name), indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN_DIR / name}.json", flush=True)


if __name__ == "__main__":
    main()
