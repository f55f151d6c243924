"""What a plan was made for, as typed values: its workload and its hardware.

A plan file embeds both (``"workload"`` and ``"hardware"``). They are loaded here into frozen value
objects, validated completely, so that nothing downstream guesses: the engine reads the precision, the
operator-level pricing reads the model and the batch geometry, the torch runner reads the model and
the micro-batch, all from these objects. A plan without a workload, or with one that is incomplete, is
refused with one line naming the field and the fix (:class:`~simulator.errors.PlanError`).

``PlanWorkload.to_dict()`` writes exactly the plan format: the model's fields plus its derived
``params``, every :class:`~workloads.WorkloadConfig` field, ``provenance`` and ``assumed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hardware_models import HardwareInputError, HardwareSpec, spec_from_dict
from simulator.errors import PlanError
from workloads import ModelSpec, WorkloadConfig, WorkloadInputError

#: how to get a plan file with a complete workload
RECREATE = "re-create the plan with this tiersim ('tiersim simulate ... --plan-out FILE')"

_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(WorkloadConfig))
_WORKLOAD_FIELDS = ("model", *_CONFIG_FIELDS, "provenance", "assumed")


@dataclass(frozen=True)
class PlanWorkload:
    """The workload of a plan: the model, the batch geometry and numerics, where the per-layer figures
    came from (``provenance``: "formula: ..." or "measured: ...") and the defaults picked for the user
    (``assumed``, shown with every result)."""

    model: ModelSpec
    config: WorkloadConfig
    provenance: str
    assumed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        model = {**self.model.to_dict(), "params": self.model.params()}
        return {"model": model, **self.config.to_dict(), "provenance": self.provenance,
                "assumed": list(self.assumed)}

    @classmethod
    def from_dict(cls, data: object, where: str = "plan") -> PlanWorkload:
        """The workload of a plan file; PlanError (one line: the field and the fix) when incomplete."""
        if not isinstance(data, Mapping):
            problem = "is missing" if data is None else f"must be an object, got {type(data).__name__}"
            raise PlanError(f"{where}: field 'workload' {problem}; {RECREATE}")
        for key in data:
            if key not in _WORKLOAD_FIELDS:
                raise PlanError(f"{where}: field 'workload.{key}' is not a workload field "
                                f"(fields: {', '.join(_WORKLOAD_FIELDS)}); remove it or {RECREATE}")
        for key in _WORKLOAD_FIELDS:
            if key not in data:
                raise PlanError(f"{where}: field 'workload.{key}' is missing; {RECREATE}")
        model = _model(data["model"], where)
        try:
            config = WorkloadConfig.from_dict({k: data[k] for k in _CONFIG_FIELDS})
        except (WorkloadInputError, TypeError) as e:
            raise PlanError(f"{where}: field 'workload': {e}") from None
        provenance, assumed = data["provenance"], data["assumed"]
        if not isinstance(provenance, str) or not provenance:
            raise PlanError(f"{where}: field 'workload.provenance' must be a non-empty string, got {provenance!r}")
        if not isinstance(assumed, list | tuple) or not all(isinstance(a, str) for a in assumed):
            raise PlanError(f"{where}: field 'workload.assumed' must be a list of strings, got {assumed!r}")
        return cls(model, config, provenance, tuple(assumed))


def _model(data: object, where: str) -> ModelSpec:
    if not isinstance(data, Mapping):
        raise PlanError(f"{where}: field 'workload.model' must be an object of model dimensions, got "
                        f"{type(data).__name__}; {RECREATE}")
    try:
        model = ModelSpec.from_dict({k: v for k, v in data.items() if k != "params"})
    except (WorkloadInputError, TypeError) as e:
        raise PlanError(f"{where}: field 'workload.model': {e}") from None
    params = data.get("params")
    if params is not None and params != model.params():
        raise PlanError(f"{where}: field 'workload.model.params' is {params!r} but the model's dimensions give "
                        f"{model.params()}; remove 'params' (it is derived) or {RECREATE}")
    return model


def plan_hardware(data: object, where: str = "plan") -> HardwareSpec:
    """The hardware embedded in a plan file, through the hardware loader (PlanError, one line)."""
    if data is None:
        raise PlanError(f"{where}: field 'hardware' is missing; {RECREATE}")
    try:
        return spec_from_dict(data, file=f"{where} (embedded hardware)")
    except HardwareInputError as e:
        raise PlanError(str(e)) from None
