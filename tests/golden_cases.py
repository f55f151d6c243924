"""Canonical runs whose headline figures are pinned in tests/golden/*.json.

Regenerate after an intended change of the model with:

    .venv/bin/python tests/golden_cases.py

and explain the change in the commit message (the diff of the JSON files shows what moved).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator import simulate_plan
from tiersim.api import JobRequest, make_job, make_plan

GOLDEN_DIR = Path(__file__).parent / "golden"

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


def run_case(name: str) -> dict[str, Any]:
    c = CASES[name]
    job, _ = make_job(c["hw"], c["model"], JobRequest(**c["request"]))
    r = simulate_plan(make_plan(job, c["policy"], c["knobs"]), job.hw)
    return {
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
        print(f"wrote {GOLDEN_DIR / name}.json")


if __name__ == "__main__":
    main()
