"""``bench channels``: hold many subscriptions at once (nsq's bench_channels).

nsq's tool subscribes one connection with RDY 1 to channel ``ch`` of each of
``--num`` topics ``t0 .. tN`` and consumes forever; it measures whether a server
copes with many topics, channels and connections. This one does the same for
``--runfor``, timing each subscription (connect + IDENTIFY + SUB), and counts
what arrives meanwhile (run ``bench writer`` at the same time to add load) and
how many connections the server dropped. ``--mode channels`` subscribes
``--num`` channels of one topic instead, so every published message is fanned
out ``--num`` times.
"""

from __future__ import annotations

import functools

from .arguments import ChannelsConfig
from .pool import run_pool
from .reader import ConsumerPlan, ReaderWorker
from .report import BenchResult, build_result
from .writer import split_quotas

__all__ = ["subscriptions", "run_channels"]


def subscriptions(config: ChannelsConfig) -> list[tuple[str, str]]:
    """Every (topic, channel) pair the benchmark subscribes to, one per connection."""
    if config.mode == "channels":
        return [(config.topic, f"{config.channel}{i}") for i in range(config.num)]
    return [(f"{config.topic}{i}", config.channel) for i in range(config.num)]


def run_channels(config: ChannelsConfig) -> BenchResult:
    """Run the channels benchmark; raises BenchFailed or OSError."""
    subs = subscriptions(config)
    factories, pos = [], 0
    for share in split_quotas(config.num, config.processes):
        plan = ConsumerPlan(
            host=config.host,
            port=config.port,
            subscriptions=subs[pos : pos + share],
            rdy=config.rdy,
            client_id="bench_channels",
            identify=config.identify,
            max_latency_samples=config.max_latency_samples,
            tolerate_close=True,
        )
        factories.append(functools.partial(ReaderWorker, plan))
        pos += share
    outcome = run_pool(factories, label="channels", runfor=config.runfor, deadline=config.deadline,
                       progress=config.progress)
    return build_result("channels", config, outcome)
