"""deploy/'s cluster files: the node configs, the systemd template and the compose file."""

from __future__ import annotations

import re

import pytest
import yaml

from broker.config.options import parse_args
from tests.support.http_client import request
from tests.support.nsq_programs import NsqProgram, nsq_bin_missing
from tests.support.paths import DEPLOY, REPO
from tests.support.waiting import wait_until

NODES = sorted((DEPLOY / "cluster").glob("node-*.toml"))


def test_the_node_files_differ_where_nodes_on_one_machine_must():
    options = [parse_args([f"--config={path}"]) for path in NODES]
    assert len(options) == 3
    for field in ("node_id", "tcp_address", "http_address", "data_path"):
        assert len({getattr(o, field) for o in options}) == 3, field
    assert {o.nsqlookupd_tcp_addresses for o in options} == {("127.0.0.1:4160",)}
    assert {o.broadcast_address for o in options} == {"127.0.0.1"}


@pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")
async def test_nodes_started_from_the_files_register_with_nsqlookupd(broker_process, tmp_path):
    lookupd = NsqProgram("nsqlookupd", tmp_path / "lookupd.log", "--tcp-address=127.0.0.1:0",
                         "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1").start()
    try:
        nodes = [broker_process(f"--config={path}", f"--lookupd-tcp-address={lookupd.address('TCP')}",
                                data_path=tmp_path / path.stem / "data") for path in NODES]  # a log each
        for node in nodes:
            reply = await request(node.http, "POST", "/topic/create?topic=deployed")
            assert reply.status == 200

        async def all_three_listed() -> list | None:  # lookupd learns of the nodes asynchronously
            lookup = await request(lookupd.http, "GET", "/lookup?topic=deployed")
            return lookup.json()["producers"] if lookup.status == 200 and len(lookup.json()["producers"]) == 3 else None

        producers = await wait_until(all_three_listed, timeout=10)
        assert sorted(p["tcp_port"] for p in producers) == sorted(node.tcp[1] for node in nodes)
        assert {p["broadcast_address"] for p in producers} == {"127.0.0.1"}
        ids = sorted(int(re.search(r"INFO: ID: (\d+)", node.log_text()).group(1)) for node in nodes)
        assert ids == [1, 2, 3]
    finally:
        lookupd.kill()


def test_the_systemd_template_runs_one_node_per_instance():
    unit = (DEPLOY / "pynsqd@.service").read_text()
    assert re.search(r"(?m)^ExecStart=/opt/pynsqd/bin/pynsqd --config=/etc/pynsqd/%i\.toml$", unit)
    assert re.search(r"(?m)^StateDirectory=pynsqd/%i$", unit)
    assert re.search(r"(?m)^WorkingDirectory=/var/lib/pynsqd/%i$", unit)
    # the install steps put each node file where its instance reads it
    install = re.search(r"install -D -m 0644 (deploy/cluster/node-\$node\.toml) /etc/pynsqd/\$node\.toml", unit)
    assert install and [f"node-{n}.toml" for n in "abc"] == [p.name for p in NODES]
    assert "python3 -m venv /opt/pynsqd && /opt/pynsqd/bin/pip install ." in unit


def test_the_compose_file_joins_three_nodes_to_nsqs_own_lookupd_and_admin():
    compose = yaml.safe_load((DEPLOY / "cluster" / "compose.yaml").read_text())
    services = compose["services"]
    for name in ("nsqlookupd", "nsqadmin"):
        assert services[name]["image"].startswith("docker.io/nsqio/nsq:v1.3.0")
    assert services["nsqadmin"]["command"].endswith("--lookupd-http-address=nsqlookupd:4161")
    build = services["pynsqd-a"]["build"]
    assert ((DEPLOY / "cluster" / build["context"]).resolve() / build["dockerfile"]) == DEPLOY / "Containerfile"
    assert (DEPLOY / "cluster" / build["context"]).resolve() == REPO
    nodes = {name: parse_args(service["command"]) for name, service in services.items() if name.startswith("pynsqd")}
    assert len(nodes) == 3 and len({o.node_id for o in nodes.values()}) == 3
    for name, options in nodes.items():
        assert options.broadcast_address == name
        assert options.nsqlookupd_tcp_addresses == ("nsqlookupd:4160",)
        assert services[name]["image"] == "pynsqd"
