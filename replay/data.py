"""Deterministic synthetic training data: the token batch of every (step, micro-step)."""

from __future__ import annotations

import torch
from torch import Tensor


def batch(seed: int, step: int, micro: int, micro_batch: int, seq_len: int, vocab: int) -> tuple[Tensor, Tensor]:
    """(tokens, targets), each (micro_batch, seq_len): random token streams, targets shifted by one."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + micro)
    stream = torch.randint(0, vocab, (micro_batch, seq_len + 1), generator=g)
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()
