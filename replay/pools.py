"""Where real tensors live: ``gpu*`` on the compute device, ``cpu`` in (pinned) host memory, ``nvme`` in
files of a directory, written and read for real."""

from __future__ import annotations

import itertools
import re
import shutil
import tempfile
import threading
from pathlib import Path

import torch
from torch import Tensor

Held = dict[str, Tensor] | Path  # tensors in memory, or the file holding them on "nvme"


class Pools:
    def __init__(self, device: torch.device, nvme_dir: str | Path | None = None):
        self.device = device
        self.pin = device.type == "cuda"
        self._nvme_dir = Path(nvme_dir) if nvme_dir is not None else None
        self._tmp: Path | None = None
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def torch_device(self, loc: str) -> torch.device:
        if loc.startswith("gpu"):
            return self.device
        return torch.device("cpu")

    def nvme_dir(self) -> Path:
        with self._lock:
            if self._nvme_dir is None:
                self._tmp = Path(tempfile.mkdtemp(prefix="tiersim-replay-nvme-"))
                self._nvme_dir = self._tmp
            return self._nvme_dir

    def put(self, loc: str, tensors: dict[str, Tensor], name: str) -> Held:
        """Copies ``tensors`` to ``loc`` (a file there for nvme) and returns what holds them."""
        if loc == "nvme":
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
            path = self.nvme_dir() / f"{safe}.{next(self._ids)}.pt"
            torch.save({k: v.detach().cpu() for k, v in tensors.items()}, path)
            return path
        dev = self.torch_device(loc)
        out = {}
        for k, v in tensors.items():
            t = v.detach().to(dev, copy=True)
            if self.pin and loc == "cpu":
                t = t.pin_memory()
            out[k] = t
        return out

    def get(self, held: Held, loc: str) -> dict[str, Tensor]:
        """The tensors of ``held`` on ``loc``'s device (read from the file for nvme)."""
        dev = self.torch_device(loc)
        if isinstance(held, Path):
            data = torch.load(held, weights_only=True)
            return {k: v.to(dev) for k, v in data.items()}
        return {k: v.to(dev) for k, v in held.items()}

    @staticmethod
    def drop(held: Held | None) -> None:
        if isinstance(held, Path):
            held.unlink(missing_ok=True)

    @staticmethod
    def nbytes(tensors: dict[str, Tensor]) -> int:
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
