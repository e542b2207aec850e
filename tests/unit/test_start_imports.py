"""A start imports only what a start needs: what serves ``/metrics``, config files, auth, TLS
upgrades and compression is loaded by its first use, so ``exec`` to ``/ping`` stays short."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import REPO

#: Loaded by a first use, never by a plain start (what each costs a start, about).
LATER = {
    "prometheus_client": "the first scrape of /metrics (20 ms)",
    "tomllib": "--config (6 ms)",
    "re2": "the first auth pattern (2 ms)",
    "httpx": "an auth server or nsqlookupd's HTTP API",
    "email": "nothing: the Date header is formatted in place (7 ms)",
    "importlib.metadata": "nothing: crc32c's extension loads without its package (20 ms)",
    "decimal": "a float that needs fixed notation (3 ms)",
    "broker.server.auth": "--auth-http-address",
    "broker.server.upgrade": "a client that negotiates TLS, snappy or deflate",
    "cramjam": "a client that negotiates snappy (1 ms)",
    "broker.observe.stats": "the first /stats, /metrics or statsd push (5 ms)",
    "broker.observe.statsd_pusher": "--statsd-address",
    "broker.lookup.peer": "a --lookupd-tcp-address (4 ms with the HTTP query)",
    "diskqueue.check": "python -m diskqueue, the checker",
    "pyspark": "nothing in the broker",
}


def test_a_start_leaves_what_it_does_not_use_unloaded():
    code = ("import json, sys\n"
            "import broker.cli, broker.daemon, broker.http.api\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    loaded = json.loads(subprocess.run([sys.executable, "-P", "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO)},
                                       capture_output=True, text=True, check=True, timeout=60).stdout)
    early = {name: why for name, why in LATER.items() if name in loaded}
    assert not early, early
    assert "broker.http.api" in loaded and "trio" in loaded  # the probe imported what a start does


#: The dataclasses a start may create: each costs about 0.4 ms (its methods are generated and
#: compiled when the class is made; a NamedTuple costs a fifth of that, a plain class nothing).
#: Options is the flag table itself; the others hold mutable fields or are not plain records.
START_DATACLASSES = {
    "broker.config.schema.Options", "broker.core.host.CoreHost", "broker.core.latency.HistogramStats",
    "broker.gocompat.unmarshal.GoStruct", "broker.storage.nsqdimport.ImportedQueue",
    "diskqueue.recovery.Recovered", "diskqueue.scan.SegmentScan",
}


def test_a_start_makes_only_the_dataclasses_it_must():
    code = ("import dataclasses, json, sys\n"
            "made = []\n"
            "process = dataclasses._process_class\n"
            "def counted(cls, *args):\n"
            "    made.append(f'{cls.__module__}.{cls.__qualname__}')\n"
            "    return process(cls, *args)\n"
            "dataclasses._process_class = counted\n"
            "import broker.cli, broker.daemon, broker.http.api\n"
            "print(json.dumps(sorted(m for m in made if m.startswith(('broker', 'diskqueue')))))\n")
    made = json.loads(subprocess.run([sys.executable, "-P", "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO)},
                                     capture_output=True, text=True, check=True, timeout=60).stdout)
    assert made, "the probe saw no dataclass made: it no longer counts"
    assert set(made) <= START_DATACLASSES, sorted(set(made) - START_DATACLASSES)
