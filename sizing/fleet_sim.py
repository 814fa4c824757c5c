"""A multi-model endpoint's model cache under a traffic mix, simulated: what fleet sizing
(``mme capacity --catalogue``) predicts the cache hit ratio and the load waits from.

The endpoint as SageMaker describes its MME: each instance keeps models in memory up to its
budget (the threshold of its memory, less the server's baseline and the requests in flight) and
evicts the least recently used ones to make room; a request goes to an instance that has its
model (loaded or loading), else to one chosen at random, which loads it. A model takes its size
at rest when it loads and grows to its serving size once it serves (``SimModel.rest_bytes`` and
``bytes``). Room is made as ``mme serve`` makes it (``admission="largest"``, the default): before
a load, for the largest at-rest footprint the instance has loaded so far (a load's own size is
known only once it is in), counting the models already there at their serving size; ``"exact"``
makes room for the model's own serving size (an optimistic bound). An evicted model holds its
memory until its unload gives it back (``SimModel.unload_seconds``, measured by ``mme capacity``
as the time from the unload call until half the model's memory is free), and a load that needs
that memory starts only then, as the endpoint's admission waits for it. A request is a hit when
its model is there and loaded; otherwise it waits for a load (its own, or one in progress).
Requests arrive as independent Poisson streams at each model's rate. Everything is seeded: the
same inputs give the same figures.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class SimModel:
    target: str
    bytes: int  # what a copy holds while serving
    load_seconds: float
    rate: float  # requests/s
    rest_bytes: int | None = None  # right after its load, before requests (None: as ``bytes``)
    unload_seconds: float = 0.0  # an eviction holds the model's memory this long

    @property
    def at_rest(self) -> int:
        return self.bytes if self.rest_bytes is None else self.rest_bytes


@dataclass
class ModelOutcome:
    target: str
    requests: int = 0
    hits: int = 0
    waited: int = 0  # requests that waited for a load (theirs or one in progress)
    loads: int = 0
    wait_seconds: float = 0.0  # summed over the requests that waited
    fits: bool = True

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / self.requests if self.requests else None

    def to_dict(self) -> dict:
        return {"target": self.target, "requests": self.requests, "hits": self.hits, "waited": self.waited,
                "loads": self.loads, "hit_ratio": None if self.hit_ratio is None else round(self.hit_ratio, 4),
                "mean_wait_s": round(self.wait_seconds / self.waited, 3) if self.waited else 0.0, "fits": self.fits}


@dataclass
class SimResult:
    instances: int
    budget_bytes: int
    duration_s: float
    warmup_s: float
    models: dict[str, ModelOutcome] = field(default_factory=dict)
    evictions: int = 0

    @property
    def requests(self) -> int:
        return sum(m.requests for m in self.models.values())

    @property
    def hit_ratio(self) -> float | None:
        return sum(m.hits for m in self.models.values()) / self.requests if self.requests else None

    @property
    def waited_share(self) -> float | None:
        return sum(m.waited for m in self.models.values()) / self.requests if self.requests else None

    def to_dict(self) -> dict:
        return {"instances": self.instances, "budget_bytes": self.budget_bytes, "duration_s": self.duration_s,
                "warmup_s": self.warmup_s, "requests": self.requests, "evictions": self.evictions,
                "hit_ratio": None if self.hit_ratio is None else round(self.hit_ratio, 4),
                "waited_share": None if self.waited_share is None else round(self.waited_share, 4),
                "models": [m.to_dict() for m in self.models.values()]}


class _Instance:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0  # loaded, loading and still unloading
        self.largest = 0  # the largest at-rest footprint loaded here so far
        self.cache: OrderedDict[str, float] = OrderedDict()  # target -> time its load completes
        self.unloading: list[tuple[float, int]] = []  # (when an evicted model's memory is free, its bytes)

    def make_room(self, size: int, now: float, sizes: Mapping[str, int], unload_s: Mapping[str, float]) -> tuple[int, float]:
        """Evict least recently used models (not one still loading) until ``size`` fits once their
        unloads end: (the count, when the load can start). The memory of the unloads it waits for
        is handed to the load (freed now, the load starting when they end)."""
        self.used -= sum(b for end, b in self.unloading if end <= now)
        self.unloading = [(end, b) for end, b in self.unloading if end > now]
        evicted = 0
        for target in list(self.cache):
            if self.used - sum(b for _, b in self.unloading) + size <= self.budget:
                break
            if self.cache[target] > now:
                continue  # a load in progress is not evicted
            del self.cache[target]
            self.unloading.append((now + unload_s.get(target, 0.0), sizes[target]))
            evicted += 1
        start = now
        self.unloading.sort()
        while self.unloading and self.used + size > self.budget:
            end, freed = self.unloading.pop(0)
            self.used -= freed
            start = max(start, end)
        return evicted, start


def simulate(models: list[SimModel], instances: int, budget_bytes: int, duration_s: float, warmup_s: float = 0.0,
             seed: int = 0, admission: str = "largest") -> SimResult:
    """The cache over ``duration_s`` seconds of traffic from an empty endpoint; requests in the
    first ``warmup_s`` seconds shape the cache but are not counted."""
    if instances < 1:
        raise ValueError("instances must be 1 or more")
    rng = random.Random(seed)
    sizes = {m.target: m.bytes for m in models}
    unload_s = {m.target: m.unload_seconds for m in models}
    result = SimResult(instances, budget_bytes, duration_s, warmup_s,
                       {m.target: ModelOutcome(m.target, fits=m.bytes <= budget_bytes) for m in models})
    fleet = [_Instance(budget_bytes) for _ in range(instances)]
    arrivals: list[tuple[float, int]] = []
    for index, model in enumerate(models):
        if model.rate > 0:
            heapq.heappush(arrivals, (rng.expovariate(model.rate), index))
    while arrivals:
        now, index = heapq.heappop(arrivals)
        if now >= duration_s:
            break
        model = models[index]
        heapq.heappush(arrivals, (now + rng.expovariate(model.rate), index))
        counted = now >= warmup_s
        outcome = result.models[model.target]
        if counted:
            outcome.requests += 1
        if not outcome.fits:
            continue  # never loads: every request fails (reported as not fitting)
        holders = [i for i in fleet if model.target in i.cache]
        if holders:
            instance = rng.choice(holders)
            ready = instance.cache[model.target]
            instance.cache.move_to_end(model.target)
            if ready <= now:
                if counted:
                    outcome.hits += 1
            elif counted:
                outcome.waited += 1
                outcome.wait_seconds += ready - now
            continue
        instance = rng.choice(fleet)
        room = max(model.at_rest, instance.largest) if admission == "largest" else model.bytes
        evicted, start = instance.make_room(min(room, instance.budget), now, sizes, unload_s)
        if instance.used + min(room, model.bytes) > instance.budget:  # everything else is still loading
            if counted:
                outcome.waited += 1
            continue
        result.evictions += evicted if counted else 0
        instance.cache[model.target] = start + model.load_seconds  # after the unloads it waits for
        instance.used += model.bytes
        instance.largest = max(instance.largest, model.at_rest)
        if counted:
            outcome.loads += 1
            outcome.waited += 1
            outcome.wait_seconds += start + model.load_seconds - now
    return result


def smallest_fleet(models: list[SimModel], budget_bytes: int, duration_s: float, warmup_s: float,
                   max_waited_share: float, max_instances: int = 64, seed: int = 0) -> SimResult:
    """The simulation of the fewest instances whose share of requests waiting for a load is at
    most ``max_waited_share`` (the largest tried, ``max_instances``, when none is)."""
    result = None
    for count in range(1, max_instances + 1):
        result = simulate(models, count, budget_bytes, duration_s, warmup_s, seed)
        if (result.waited_share or 0.0) <= max_waited_share:
            return result
    assert result is not None  # max_instances >= 1
    return result
