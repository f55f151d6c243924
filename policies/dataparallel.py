"""Moved to ``policies.kit`` (layout, layers, grads, microstep); this module only re-exports for the
policies not yet ported onto the kit, and goes when they are."""

from policies.kit.grads import Grads
from policies.kit.layers import REPLICATED_ACT_FRACTION, TP_ALLREDUCES, saved_activation_bytes, workspace
from policies.kit.layout import Layout, check_tp, declare_streams, dtype_bytes, gpu
from policies.kit.microstep import emit_microstep

__all__ = ["REPLICATED_ACT_FRACTION", "TP_ALLREDUCES", "Grads", "Layout", "check_tp", "declare_streams",
           "dtype_bytes", "emit_microstep", "gpu", "saved_activation_bytes", "workspace"]
