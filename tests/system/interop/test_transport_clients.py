"""Real clients publishing and consuming over TLS, snappy, deflate and with AUTH: pynsq, gnsq and
nsqjs with their own options, and nsq's to_nsq / nsq_tail (go-nsq) with --producer-opt/--consumer-opt."""

from __future__ import annotations

import ssl
import subprocess

import pytest
import trio

from tests.support.auth_server import AuthServer
from tests.support.http_client import request
from tests.support.interop import (
    GNSQ,
    NSQJS,
    PYNSQ,
    address,
    assert_no_errors,
    consume_config,
    nsqjs_missing,
    of_kind,
    run_client,
)
from tests.support.paths import nsq_bin
from tests.support.transports import make_certificates

BODIES = ["first " * 40, "second", "third \u00e9"]
GRANT_ALL = {"identity": "interop", "ttl": 3600,
             "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]}

#: (library, its options for each feature). pynsq and gnsq check the broker's certificate
#: against the test CA; nsqjs has no CA option and is run without verification.
CASES = {
    "pynsq": (PYNSQ, {
        "tls": lambda ca: {"tls_v1": True, "tls_options": {"ca_certs": ca, "cert_reqs": ssl.CERT_REQUIRED}},
        "snappy": lambda ca: {"snappy": True},
        "deflate": lambda ca: {"deflate": True, "deflate_level": 3},
        "tls+snappy": lambda ca: {"tls_v1": True, "snappy": True,
                                  "tls_options": {"ca_certs": ca, "cert_reqs": ssl.CERT_REQUIRED}},
        "auth": lambda ca: {"auth_secret": "interop"},
    }),
    "gnsq": (GNSQ, {
        "tls": lambda ca: {"tls_v1": True, "tls_options": {"ca_certs": ca, "cert_reqs": ssl.CERT_REQUIRED}},
        "snappy": lambda ca: {"snappy": True},
        "deflate": lambda ca: {"deflate": True, "deflate_level": 3},
        "auth": lambda ca: {"auth_secret": "interop"},
    }),
    "nsqjs": (NSQJS, {
        "tls": lambda ca: {"tls": True, "tlsVerification": False},
        "snappy": lambda ca: {"snappy": True},
        "deflate": lambda ca: {"deflate": True, "deflateLevel": 3},
        "auth": lambda ca: {"authSecret": "interop"},
    }),
}
#: gnsq 1.0.2's Producer cannot upgrade (it hands the upgrade's OK to a response queue it has
#: not made yet: KeyError, with nsqd as with pynsqd), so gnsq publishes plain and consumes upgraded.
PLAIN_PUBLISHERS = {"gnsq"}
UPGRADE_LOG = {"tls": ["TLS"], "snappy": ["snappy"], "deflate": ["deflate (level 3)"], "tls+snappy": ["TLS", "snappy"],
               "auth": []}


def _params():
    for name, (_, features) in CASES.items():
        marks = [pytest.mark.skipif(nsqjs_missing() is not None, reason=str(nsqjs_missing()))] if name == "nsqjs" else []
        for feature in features:
            yield pytest.param(name, feature, id=f"{name}-{feature}", marks=marks)


@pytest.fixture
def authd():
    server = AuthServer({"interop": GRANT_ALL}).start()
    yield server
    server.stop()


@pytest.mark.parametrize(("library", "feature"), list(_params()))
async def test_library_publishes_and_consumes_with_the_feature(broker_process, tmp_path, authd, logs,
                                                               library, feature):
    certs = make_certificates(tmp_path / "certs")
    flags = certs.broker_flags(*([f"--auth-http-address={authd.address}"] if feature == "auth" else []))
    broker = broker_process(*flags)
    argv, features = CASES[library]
    connection = features[feature](str(certs.ca_file))
    upgraded_publisher = library not in PLAIN_PUBLISHERS or feature == "auth"
    topic = f"{library}-{feature.replace('+', '-')}"
    with trio.fail_after(60):
        published = await run_client(argv, "publish", {
            "tcp": address(broker.tcp), "connection": connection if upgraded_publisher else {},
            "ops": [{"op": "pub", "topic": topic, "body": body} for body in BODIES],
        }, log_dir=logs)
        assert [e["response"] for e in of_kind(published, "published")] == ["OK"] * 3
        events = await run_client(argv, "consume", consume_config(broker, topic, expect=3, connection=connection),
                                  log_dir=logs)
    assert_no_errors(events)
    assert sorted(m["body"] for m in of_kind(events, "message")) == sorted(BODIES)
    log = broker.log_text()
    for upgrade in UPGRADE_LOG[feature]:
        assert log.count(f"upgrading connection to {upgrade}") == (2 if upgraded_publisher else 1)
    if feature == "auth":
        assert len(authd.queries) >= 2 and {q["secret"] for q in authd.queries} == {"interop"}


GO_OPTIONS = {
    "tls": ["tls_v1", "tls_root_ca_file,{ca}"],
    "snappy": ["snappy"],
    "deflate": ["deflate", "deflate_level,3"],
    "tls+deflate": ["tls_v1", "tls_root_ca_file,{ca}", "deflate", "deflate_level,3"],
}


@pytest.mark.skipif(nsq_bin() is None, reason="nsq 1.3.0's tools are not here (shared/nsq/bin)")
@pytest.mark.parametrize("feature", list(GO_OPTIONS))
async def test_nsq_tools_publish_and_tail_with_the_feature(broker_process, tmp_path, feature):
    certs = make_certificates(tmp_path / "certs")
    broker = broker_process(*certs.broker_flags())
    options = [option.format(ca=certs.ca_file) for option in GO_OPTIONS[feature]]
    tcp = f"--nsqd-tcp-address={address(broker.tcp)}"
    # the tail's channel exists before anything is published, so it gets every message
    await request(broker.http, "POST", "/topic/create?topic=go")
    await request(broker.http, "POST", "/channel/create?topic=go&channel=tail")
    tail = await trio.lowlevel.open_process(
        [str(nsq_bin() / "nsq_tail"), tcp, "--topic=go", "--channel=tail", "-n", "3",
         *(f"--consumer-opt={option}" for option in options)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        with trio.fail_after(30):
            await trio.run_process(
                [str(nsq_bin() / "to_nsq"), tcp, "--topic=go", *(f"--producer-opt={option}" for option in options)],
                stdin=b"one\ntwo\nthree\n", capture_stdout=True, capture_stderr=True)
            out = b""
            while out.count(b"\n") < 3:
                chunk = await tail.stdout.receive_some(4096)
                assert chunk, f"nsq_tail ended early: {out!r}"
                out += chunk
    finally:
        tail.kill()
        await tail.wait()
    assert out.splitlines() == [b"one", b"two", b"three"]
    for upgrade in UPGRADE_LOG.get(feature, ["TLS", "deflate (level 3)"]):
        assert broker.log_text().count(f"upgrading connection to {upgrade}") >= 2
