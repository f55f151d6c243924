"""Fluid (flow-level) sharing of bandwidth-like resources, max-min fair, inside a SimPy environment.

Every transfer, compute kernel and CPU optimizer step is a *flow*: an amount of work (bytes, seconds of
GPU work, parameters) pushed through one or more resources (a link direction, a link's duplex budget,
a GPU's SMs, the host's CPU-Adam throughput). While flows are active they share each resource's
capacity max-min fairly across every resource of their path (progressive filling). Rates are recomputed
whenever a flow starts or ends, but only for the *component* of flows that transitively share a resource
with the flow that changed, so independent GPUs do not slow each other's bookkeeping.

This is the bandwidth model of docs/design.md ("a FIFO simpy.Resource per link is not a bandwidth
model"). The rates themselves are the pure max-min fair allocation of :func:`costs.max_min_rates`
(progressive filling, Bertsekas & Gallager, Data Networks, §6.5.2), so estimators that price with
``costs`` get the figures this network runs at; this module keeps only the SimPy side: who is active,
when each flow's work is done, and the per-resource statistics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import simpy

from costs import max_min_rates, solo_rate, usage

_EPS = 1e-12


@dataclass
class Flow:
    fid: int
    remaining: float
    resources: tuple[str, ...]
    done: simpy.Event
    weights: tuple[float, ...] = ()  # units of each resource used per unit of flow (default 1 each)
    rate: float = 0.0
    updated: float = 0.0
    version: int = 0

    wmap: dict[str, float] = field(default_factory=dict)  # resource -> weight, for lookups

    def weight(self, resource: str) -> float:
        return self.wmap[resource]


@dataclass
class ResourceStats:
    busy_s: float = 0.0
    busy_since: float | None = None
    rate_log: list[tuple[float, float]] = field(default_factory=list)  # (time, total rate) when it changes


class FlowNetwork:
    """Flows over named resources with fixed capacities (units per second)."""

    def __init__(self, env: simpy.Environment, capacities: Mapping[str, float]):
        self.env = env
        self.capacity = dict(capacities)
        self._flows: dict[int, Flow] = {}
        self._on: dict[str, set[int]] = {r: set() for r in self.capacity}
        self._next_id = 0
        self._prepared: dict[tuple, tuple[tuple[str, ...], tuple[float, ...], dict[str, float]]] = {}
        self.stats: dict[str, ResourceStats] = {r: ResourceStats() for r in self.capacity}

    def start(self, amount: float, resources: Sequence[str], weights: Sequence[float] | None = None) -> simpy.Event:
        """Start a flow of ``amount`` units over ``resources``; the returned event fires when it is done.

        ``weights`` (one per listed resource, default 1) say how many units of a resource one unit of the
        flow uses; a resource listed more than once adds up its weights (:func:`costs.usage`): a ring
        collective is one flow whose every link carries it once, except links the ring crosses twice.
        """
        ev = self.env.event()
        if amount <= 0 or not resources:
            ev.succeed()
            return ev
        key = (tuple(resources), None if weights is None else tuple(weights))
        prepared = self._prepared.get(key)
        if prepared is None:  # a route is prepared once and reused by every flow over it
            prepared = self._prepared[key] = self._prepare(resources, weights)
        res, w, wmap = prepared
        fid = self._next_id
        self._next_id += 1
        now = self.env.now
        f = Flow(fid, float(amount), res, ev, w, updated=now, wmap=wmap)
        self._flows[fid] = f
        alone = True
        for r in f.resources:
            on = self._on[r]
            if not on:
                self.stats[r].busy_since = now
            else:
                alone = False
            on.add(fid)
        if alone:  # fast path: nothing to share with, nobody else's rate changes
            f.rate = solo_rate(f.wmap, self.capacity)
            for r, x in zip(f.resources, f.weights, strict=True):
                self.stats[r].rate_log.append((now, f.rate * x))
            f.version = 1
            self.env.timeout(f.remaining / f.rate).callbacks.append(self._make_finisher(fid, 1))
        else:
            self._rebalance(f.resources)
        return ev

    def _prepare(self, resources: Sequence[str], weights: Sequence[float] | None
                 ) -> tuple[tuple[str, ...], tuple[float, ...], dict[str, float]]:
        for r in resources:
            if r not in self.capacity:
                raise KeyError(f"unknown resource {r!r}")
        acc = usage(resources, weights)
        return tuple(acc), tuple(acc.values()), acc

    def active(self) -> int:
        return len(self._flows)

    # -- internals ------------------------------------------------------------------------------------
    def _component(self, seeds: Sequence[str]) -> tuple[list[Flow], set[str]]:
        res_seen: set[str] = set()
        flows: dict[int, Flow] = {}
        stack = list(seeds)
        while stack:
            r = stack.pop()
            if r in res_seen:
                continue
            res_seen.add(r)
            for fid in self._on[r]:
                if fid not in flows:
                    f = self._flows[fid]
                    flows[fid] = f
                    stack.extend(x for x in f.resources if x not in res_seen)
        return sorted(flows.values(), key=lambda f: f.fid), res_seen

    def _rebalance(self, seeds: Sequence[str]) -> None:
        now = self.env.now
        flows, resources = self._component(seeds)
        old_rates = {f.fid: f.rate for f in flows}
        for f in flows:  # bring every flow's remaining work up to now at its old rate
            f.remaining = max(0.0, f.remaining - f.rate * (now - f.updated))
            f.updated = now
        if len(flows) == 1:  # fast path: a flow alone on its resources gets the narrowest of them
            flows[0].rate = solo_rate(flows[0].wmap, self.capacity)
        else:  # the component holds every flow on its resources: share them max-min fairly
            for f, rate in zip(flows, max_min_rates([f.wmap for f in flows], self.capacity), strict=True):
                f.rate = rate
        totals = dict.fromkeys(resources, 0.0)  # the component holds every flow on these resources
        for f in flows:
            for r, x in zip(f.resources, f.weights, strict=True):
                totals[r] += f.rate * x
        stats = self.stats
        for r, total in totals.items():
            log = stats[r].rate_log
            if not log or abs(log[-1][1] - total) > _EPS * max(1.0, total):
                log.append((now, total))
        for f in flows:
            if f.rate == old_rates[f.fid] and f.version > 0:
                continue  # same rate: its pending finish event is still right
            f.version += 1
            if f.rate > 0:
                ev = self.env.timeout(f.remaining / f.rate)
                ev.callbacks.append(self._make_finisher(f.fid, f.version))

    def _make_finisher(self, fid: int, version: int):  # noqa: ANN202 - SimPy callback
        def finish(_ev: simpy.Event) -> None:
            f = self._flows.get(fid)
            if f is None or f.version != version:
                return
            del self._flows[fid]
            now = self.env.now
            shared = False
            for r in f.resources:
                on = self._on[r]
                on.discard(fid)
                if not on:
                    st = self.stats[r]
                    st.rate_log.append((now, 0.0))
                    if st.busy_since is not None:
                        st.busy_s += now - st.busy_since
                        st.busy_since = None
                else:
                    shared = True
            f.remaining = 0.0
            f.done.succeed()
            if shared:
                self._rebalance([r for r in f.resources if self._on[r]])

        return finish
