"""A reference auth server for ``--auth-http-address``, answering nsqd's ``GET /auth`` from a JSON file.

Run it on its own (standard library only)::

    python tests/support/auth_server.py --address=127.0.0.1:4181 --secrets=secrets.json

``secrets.json`` maps each secret a client may send in ``AUTH`` to the answer for it, in the
format nsqd expects::

    {"s3cret": {"identity": "billing", "identity_url": "https://example.com/billing", "ttl": 3600,
                "authorizations": [{"topic": "^orders$", "channels": [".*"],
                                    "permissions": ["subscribe", "publish"]}]}}

An unknown secret gets ``403 {"message":"NOT_AUTHORIZED"}``. For tests an entry may also hold
``delay`` (seconds to wait before answering) or ``raw`` (a body sent as it is instead of
JSON). Every query's parameters are kept in :attr:`AuthServer.queries`.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

__all__ = ["AuthServer"]


class AuthServer:
    """An auth server on ``host:port`` (0: any free port) answering from ``secrets``."""

    def __init__(self, secrets: dict, host: str = "127.0.0.1", port: int = 0):
        self.secrets = secrets
        self.queries: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/auth":
                    self._answer(404, b'{"message":"NOT_FOUND"}')
                    return
                query = {key: values[0] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
                server.queries.append(query)
                entry = server.secrets.get(query.get("secret", ""))
                if entry is None:
                    self._answer(403, b'{"message":"NOT_AUTHORIZED"}')
                    return
                time.sleep(entry.get("delay", 0))
                if "raw" in entry:
                    self._answer(200, entry["raw"].encode())
                    return
                answer = {key: value for key, value in entry.items() if key not in ("delay", "raw")}
                self._answer(200, json.dumps(answer).encode())

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.address = f"{host}:{self._server.server_address[1]}"
        self._thread: threading.Thread | None = None

    def start(self) -> AuthServer:
        """Serve from a background thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:4181", help="host:port to listen on")
    parser.add_argument("--secrets", required=True, type=Path, help="JSON file: secret -> answer")
    args = parser.parse_args()
    host, _, port = args.address.rpartition(":")
    server = AuthServer(json.loads(args.secrets.read_text()), host or "127.0.0.1", int(port))
    print(f"auth server listening on {server.address}", flush=True)
    try:
        server._server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
