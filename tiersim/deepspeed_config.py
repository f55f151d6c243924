"""A DeepSpeed config -> the equivalent tiersim job: policy, knobs and workload, with a line per key saying what
became of it (``simulate --deepspeed ds.json``; also ``plan`` and ``whatif``).

Every key ends in one of five states, printed with the result:
- ``mapped``: it sets a policy, a knob or a workload field (and ``--deepspeed-out`` writes it back the same);
- ``auto``: an HF ``"auto"`` value, resolved as transformers' DeepSpeed integration resolves it (the flags play
  the part of ``TrainingArguments``: ``--micro-batch`` of ``--per_device_train_batch_size``, ``--precision`` of
  ``--bf16``/``--fp16``; a Trainer file's own arguments count too; otherwise HF's defaults);
- ``checked``: a value that is what tiersim models anyway (Adam states, pinned memory, overlapped reduction);
- ``approx``: DeepSpeed does it differently from tiersim's plan, and the line says in which direction;
- ``ignored``: DeepSpeed reads it but it changes nothing tiersim prices, and the line says why.
A key tiersim cannot represent is refused: one line naming it and the fix (exit 2).

The ZeRO stage and the offload devices pick the policy: no offload -> ``none`` (knob ``stage``); stage 1/2 with
``offload_optimizer`` cpu -> ``zero-offload``; stage 3 with ``offload_param`` and ``offload_optimizer`` on cpu or
nvme -> ``zero-infinity`` (knobs ``param_device``, ``optimizer_device``). The batch keys are completed and
checked as DeepSpeed's ``DeepSpeedConfig._configure_train_batch_size`` does, with world size = the data-parallel
ranks (the hardware's GPUs / tensor-parallel degree).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.job import JobRequest
from tiersim.deepspeed_auto import resolve_auto
from tiersim.deepspeed_keys import (
    ADAM_LIKE,
    IMPLIED_KNOBS,
    KNOB_KEYS,
    POLICY_KEYS,
    REFUSED,
    WORKLOAD_KEYS,
    get_path,
    ignored_reason,
    leaves,
    show,
)
from tiersim.deepspeed_source import DeepSpeedConfigError, DeepSpeedSource

STATUSES = ("mapped", "auto", "checked", "approx", "ignored")
DEVICES = ("none", "cpu", "nvme")


@dataclass(frozen=True)
class Entry:
    status: str   # one of STATUSES
    path: str
    value: Any
    detail: str

    def line(self) -> str:
        return f"  {self.status:<8}{self.path} = {show(self.value)}: {self.detail}"


@dataclass(frozen=True)
class DeepSpeedJob:
    """What a DeepSpeed config asks for, in tiersim's terms."""

    source: str
    config: dict[str, Any]            # the DeepSpeed dict with "auto" resolved
    policy: str
    knobs: dict[str, Any]             # every knob the config fixes
    request: JobRequest
    world_size: int                   # data-parallel ranks (DeepSpeed's world size for the batch keys)
    entries: tuple[Entry, ...] = field(default_factory=tuple)

    def mapped_paths(self) -> list[str]:
        return [e.path for e in self.entries if e.status in ("mapped", "auto") and _is_round_trip(e.path)]

    def lines(self) -> list[str]:
        knobs = " ".join(f"{k}={v}" for k, v in self.knobs.items())
        out = [f"DeepSpeed config {self.source} -> policy {self.policy}" + (f" ({knobs})" if knobs else "")]
        order = {s: i for i, s in enumerate(STATUSES)}
        entries = sorted(self.entries, key=lambda e: order[e.status])
        out += [e.line() for e in entries if e.status != "ignored"]
        by_reason: dict[str, list[str]] = {}
        for e in entries:
            if e.status == "ignored":
                by_reason.setdefault(e.detail, []).append(e.path)
        out += [f"  {'ignored':<8}{', '.join(paths)}: {why}" for why, paths in by_reason.items()]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "policy": self.policy, "knobs": dict(self.knobs),
                "entries": [{"status": e.status, "key": e.path, "value": e.value, "detail": e.detail}
                            for e in self.entries]}


def _is_round_trip(path: str) -> bool:
    return path in WORKLOAD_KEYS or any(k.path == path for k in KNOB_KEYS) or \
        any(path in keys for keys in POLICY_KEYS.values())


class _Mapper:
    """One pass over one config: resolve "auto", pick the policy and knobs, complete the batch, classify the rest."""

    def __init__(self, src: DeepSpeedSource, n_gpus: int, hidden: int, flags: JobRequest):
        self.src, self.n_gpus, self.hidden, self.flags = src, n_gpus, hidden, flags
        self.cfg = src.config
        self.entries: list[Entry] = []
        self.done: set[str] = set()

    def fail(self, path: str, why: str) -> DeepSpeedConfigError:
        value = get_path(self.cfg, path)
        shown = f" = {show(value)}" if value is not None else ""
        return DeepSpeedConfigError(f"{self.src.label}: {path}{shown}: {why}")

    def add(self, status: str, path: str, detail: str, value: Any = None) -> None:
        self.entries.append(Entry(status, path, get_path(self.cfg, path) if value is None else value, detail))
        self.done.add(path)

    # -- "auto" ------------------------------------------------------------------------------------------------
    def resolve_auto(self, stage: int, world: int) -> None:
        """Resolve every "auto" (``tiersim.deepspeed_auto``): an auto line each, then the line of what it maps to."""
        for path, detail in resolve_auto(self.cfg, self.src, self.flags, hidden=self.hidden, stage=stage, world=world):
            self.entries.append(Entry("auto", path, "auto", detail))

    # -- policy and knobs --------------------------------------------------------------------------------------
    def device(self, which: str, stage: int) -> str:
        path = f"zero_optimization.{which}.device"
        value = get_path(self.cfg, path)
        if isinstance(get_path(self.cfg, f"zero_optimization.{which}"), Mapping) and value is None:
            value = "none"
        if value is None:
            return "none"
        if value not in DEVICES:
            raise self.fail(path, "expected none, cpu or nvme")
        return str(value)

    def pick_policy(self) -> tuple[str, int]:
        stage = get_path(self.cfg, "zero_optimization.stage")
        stage = 0 if stage is None else stage
        if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3:
            raise self.fail("zero_optimization.stage", "expected 0, 1, 2 or 3")
        opt, par = self.device("offload_optimizer", stage), self.device("offload_param", stage)
        if par != "none" and stage < 3:
            self.add("ignored", "zero_optimization.offload_param.device", "DeepSpeed offloads parameters only "
                     "with stage 3")
            par = "none"
        if opt == "none" and par == "none":
            return "none", stage
        if stage == 0:
            raise self.fail("zero_optimization.offload_optimizer.device", "offloading needs ZeRO stage 1-3 "
                            "(DeepSpeed refuses it with stage 0); set zero_optimization.stage")
        if stage < 3:
            if opt == "nvme":
                raise self.fail("zero_optimization.offload_optimizer.device", "NVMe optimizer offload needs ZeRO "
                                "stage 3 (ZeRO-Infinity); use cpu or stage 3 with offload_param")
            return "zero-offload", stage
        if par == "none":
            raise self.fail("zero_optimization.offload_optimizer.device", "ZeRO-3 with the optimizer offloaded "
                            "but the parameters on the GPU is not a tiersim policy (zero-infinity keeps parameters "
                            "on cpu or nvme); add offload_param: {device: cpu} or use stage 2")
        if opt == "none":
            raise self.fail("zero_optimization.offload_param.device", "ZeRO-3 with parameters offloaded but the "
                            "optimizer on the GPU is not a tiersim policy; add offload_optimizer: {device: cpu}")
        return "zero-infinity", stage

    def knobs_of(self, policy: str, stage: int) -> dict[str, Any]:
        knobs = dict(IMPLIED_KNOBS[policy])
        for path, value in POLICY_KEYS[policy].items():
            got = get_path(self.cfg, path)
            if path == "zero_optimization.stage" and got != value:
                self.add("approx", path, f"stage {got} with offload_optimizer cpu: simulated as zero-offload "
                         "(ZeRO-2: gradients reduce-scattered and offloaded per micro-step); DeepSpeed's stage 1 keeps "
                         "the full 16-bit gradients on each GPU until the accumulation boundary (2 B/param more GPU "
                         "memory than shown, one offload per step)")
            else:
                self.add("mapped", path, f"policy {policy}")
        for key in KNOB_KEYS:
            got = get_path(self.cfg, key.path)
            if key.policy != policy:
                continue
            if key.kind is int and isinstance(got, float) and got.is_integer():
                got = int(got)  # 1e9, as DeepSpeed's configs write it
            if got is None:
                continue
            if isinstance(got, bool) != (key.kind is bool) or not isinstance(got, key.kind):
                raise self.fail(key.path, f"expected {key.kind.__name__}")
            if not key.applies({**knobs, key.knob: got}):
                continue
            if knobs.get(key.knob) not in (None, got) and key.knob not in IMPLIED_KNOBS[policy]:
                raise self.fail(key.path, f"disagrees with another key setting {key.knob}; set both alike")
            if key.knob == "pipeline_io" and key.path.endswith("write") and knobs.get("pipeline_io") != got:
                raise self.fail(key.path, "pipeline_read and pipeline_write differ; tiersim's pipeline_io overlaps "
                                "both: set them alike")
            knobs[key.knob] = got
            self.add("mapped", key.path, f"knob {key.knob}={got} ({key.why})")
        if policy == "none":
            knobs["stage"] = stage
        return knobs

    # -- workload ----------------------------------------------------------------------------------------------
    def batch(self, world: int) -> tuple[int, int]:
        """(micro-batch, global batch), completed and checked as DeepSpeed does."""
        f = self.flags
        tb, mb, ga = (self.cfg.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                 "gradient_accumulation_steps"))
        for name, v in (("train_batch_size", tb), ("train_micro_batch_size_per_gpu", mb),
                        ("gradient_accumulation_steps", ga)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise self.fail(name, "expected a whole number >= 1")
        if mb is None and f.micro_batch is not None:
            mb = f.micro_batch
            self.add("mapped", "train_micro_batch_size_per_gpu", "absent: --micro-batch", mb)
        if tb is None and mb is not None and f.global_batch is not None and ga is None:
            tb = f.global_batch
            self.add("mapped", "train_batch_size", "absent: --global-batch", tb)
        if tb is not None and mb is not None and ga is None:
            ga = tb // mb // world
        elif tb is not None and ga is not None and mb is None:
            mb = tb // world // ga
        elif mb is not None and ga is not None and tb is None:
            tb = mb * ga * world
        elif tb is not None and mb is None and ga is None:
            ga, mb = 1, tb // world
        elif mb is not None and tb is None and ga is None:
            tb, ga = mb * world, 1
        elif tb is None and mb is None:
            raise self.fail("train_batch_size", "DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu "
                            "(or give --micro-batch)")
        assert tb is not None and mb is not None and ga is not None
        if mb < 1 or ga < 1 or tb != mb * ga * world:
            raise self.fail("train_batch_size", f"train_batch_size is not train_micro_batch_size_per_gpu x "
                            f"gradient_accumulation_steps x world size: {tb} != {mb} x {ga} x {world} (world size: "
                            f"the hardware's {self.n_gpus} GPUs / tensor-parallel degree); DeepSpeed refuses this too")
        self.flag_agrees("--micro-batch", f.micro_batch, mb, "train_micro_batch_size_per_gpu")
        self.flag_agrees("--global-batch", f.global_batch, tb, "train_batch_size")
        for path, detail in (("train_micro_batch_size_per_gpu", f"micro-batch {mb}"),
                             ("gradient_accumulation_steps", f"{ga} micro-step(s) per step"),
                             ("train_batch_size", f"global batch {tb} = {mb} x {ga} x {world} rank(s)")):
            if path in self.cfg and path not in self.done:
                self.add("mapped", path, detail)
        return mb, tb

    def flag_agrees(self, flag: str, given: Any, value: Any, path: str) -> None:
        if given is not None and given != value:
            raise self.fail(path, f"the config gives {value} but {flag} {given}; drop {flag} or change the config")

    def wrapper_precision(self) -> None:
        """A Trainer/accelerate file asking for mixed precision adds the section when the config has none (as
        accelerate's ``DeepSpeedPlugin.set_mixed_precision`` does)."""
        if "fp16" in self.cfg or "bf16" in self.cfg or "bfloat16" in self.cfg:
            return
        for dtype in ("bf16", "fp16"):
            if self.src.training_args.get(dtype) is True and self.flags.precision in (None, dtype):
                self.cfg[dtype] = {"enabled": True}
                self.entries.append(Entry("auto", f"{dtype}.enabled", None, f"absent: {dtype} of the "
                                          f"{self.src.wrapper} file adds it (accelerate's set_mixed_precision)"))

    def precision(self) -> str:
        for alias, name in (("bfloat16", "bf16"),):
            if alias in self.cfg and name not in self.cfg:
                self.cfg[name] = self.cfg.pop(alias)
        fp16, bf16 = get_path(self.cfg, "fp16.enabled"), get_path(self.cfg, "bf16.enabled")
        for path, v in (("fp16.enabled", fp16), ("bf16.enabled", bf16)):
            if v is not None and not isinstance(v, bool):
                raise self.fail(path, "expected true, false or \"auto\"")
        if fp16 and bf16:
            raise self.fail("bf16.enabled", "bf16 and fp16 both enabled (DeepSpeed refuses this too); enable one")
        precision = "bf16" if bf16 else "fp16" if fp16 else "fp32"
        self.flag_agrees("--precision", self.flags.precision, precision, "bf16.enabled" if bf16 else "fp16.enabled")
        for path, v in (("fp16.enabled", fp16), ("bf16.enabled", bf16)):
            if v is not None:
                self.add("mapped", path, f"precision {precision}" + ("" if v else " (this one off)"))
        if fp16 is None and bf16 is None:
            self.entries.append(Entry("mapped", "fp16/bf16", None, "neither section: fp32 (DeepSpeed's default)"))
        return precision

    def checkpointing(self, policy: str, knobs: dict[str, Any]) -> str | None:
        section = self.cfg.get("activation_checkpointing")
        args = self.src.training_args
        hf = args.get("gradient_checkpointing", args.get("activation_checkpointing"))
        if section is not None:
            ckpt: str | None = "full"
            self.add("mapped", "activation_checkpointing", "checkpointing full (the section configures the "
                     "checkpointing the model's layers call)", {})
        elif isinstance(hf, bool):
            ckpt = "full" if hf else "none"
        else:
            ckpt = None
        if ckpt is not None:
            self.flag_agrees("--checkpointing", self.flags.checkpointing, ckpt, "activation_checkpointing")
        cpu = get_path(self.cfg, "activation_checkpointing.cpu_checkpointing")
        if cpu and policy != "zero-infinity":
            raise self.fail("activation_checkpointing.cpu_checkpointing", "checkpoints to CPU memory are modelled "
                            "only with ZeRO-3 offload (zero-infinity's offload_checkpoints); set it false or use "
                            "stage 3 with offload_param")
        if cpu is False and policy != "zero-infinity":
            self.add("checked", "activation_checkpointing.cpu_checkpointing", "checkpoints stay on the GPU")
        return ckpt if ckpt is not None else self.flags.checkpointing

    # -- everything else ---------------------------------------------------------------------------------------
    def classify_rest(self, policy: str) -> None:
        for path, value in leaves(self.cfg):
            if path in self.done:
                continue
            self.classify(path, value, policy)

    def classify(self, path: str, value: Any, policy: str) -> None:
        for key, (ok, refusal) in REFUSED.items():
            if (path == key and value not in ok) or (path.startswith(f"{key}.") and ok == (None,)):
                raise self.fail(path, f"{refusal}; remove it")
        checked = self.checked(path, value, policy)
        if checked is not None:
            self.add(*checked)
            return
        why: str | None = ignored_reason(path)
        if why is None and any(k.path == path for k in KNOB_KEYS):
            why = f"DeepSpeed uses it only with {', '.join(k.policy for k in KNOB_KEYS if k.path == path)} settings"
            if path.endswith(("pipeline_read", "pipeline_write")):
                why = "used by DeepSpeed only with offload_optimizer nvme"
        if why is not None:
            self.add("ignored", path, why)
            return
        if path.startswith("zero_optimization."):
            raise self.fail(path, "not a DeepSpeed zero_optimization key (DeepSpeed 0.19.8 refuses unknown keys "
                            "there too); check the spelling")
        self.add("ignored", path, "not a key tiersim models (DeepSpeed passes over unknown top-level keys)")

    def checked(self, path: str, value: Any, policy: str) -> tuple[str, str, str] | None:
        """(status, path, detail) for a value that is tiersim's own assumption (or close to it), else None."""
        if path == "optimizer.type":
            if not isinstance(value, str) or value.lower() not in ADAM_LIKE:
                raise self.fail(path, "tiersim models Adam's optimizer state (fp32 master, m, v: 12 B/param); use "
                                "Adam or AdamW")
            return "checked", path, "Adam's 12 B/param of fp32 master, m and v, as tiersim models"
        if path == "zero_optimization.overlap_comm":
            if value is True:
                return "checked", path, "tiersim's plans overlap gradient reduction with the backward"
            return "approx", path, ("tiersim's plans overlap gradient reduction with the backward; DeepSpeed "
                                    "without overlap_comm runs it after, so the real step is slower than simulated")
        if path.endswith(".pin_memory"):
            if value is True:
                return "checked", path, "pinned host buffers, as tiersim's copies assume"
            return "approx", path, "tiersim prices copies at pinned-memory bandwidth; pageable copies are slower"
        if path.endswith(".device") and value == "none":
            return "checked", path, "nothing offloaded there"
        return None


def map_config(src: DeepSpeedSource, *, n_gpus: int, hidden: int, flags: JobRequest | None = None) -> DeepSpeedJob:
    """The tiersim job a DeepSpeed config asks for on a machine of ``n_gpus`` GPUs, for a model of ``hidden``
    width (HF's "auto" bucket sizes); ``flags`` are the workload flags given with it (they resolve "auto" and
    must agree with what the config sets). Raises :class:`DeepSpeedConfigError` (one line) when it cannot."""
    m = _Mapper(src, n_gpus, hidden, flags or JobRequest())
    if src.num_processes is not None and src.num_processes != n_gpus:
        raise DeepSpeedConfigError(f"{src.label}: num_processes {src.num_processes}, but the hardware has {n_gpus} "
                                   "GPU(s); pick the matching --hw (or --set gpu.count=N)")
    tp = get_path(src.config, "tensor_parallel.autotp_size")
    tp = tp if isinstance(tp, int) and not isinstance(tp, bool) and tp > 0 else 1
    if n_gpus % tp:
        raise m.fail("tensor_parallel.autotp_size", f"does not divide the hardware's {n_gpus} GPUs")
    world = n_gpus // tp
    stage = get_path(src.config, "zero_optimization.stage")
    m.resolve_auto(stage if isinstance(stage, int) else 0, world)
    policy, stage = m.pick_policy()
    knobs = m.knobs_of(policy, stage)
    if tp > 1 and policy == "zero-infinity":
        raise m.fail("tensor_parallel.autotp_size", "tensor parallelism with ZeRO-3 offload is not a tiersim "
                     "policy; remove it")
    micro, global_batch = m.batch(world)
    m.wrapper_precision()
    precision = m.precision()
    ckpt = m.checkpointing(policy, knobs)
    m.classify_rest(policy)
    request = JobRequest(micro_batch=micro, seq_len=m.flags.seq_len, global_batch=global_batch, precision=precision,
                         checkpointing=ckpt, flash_attention=m.flags.flash_attention)
    return DeepSpeedJob(src.label, m.cfg, policy, knobs, request, world, tuple(m.entries))
