"""Helpers shared by the test layers; no tests live here.

- ``paths``: where the repository and its parts are.
- ``waiting``: ``wait_for`` a condition instead of sleeping a fixed time.
- ``v2client``: a raw V2 TCP client (bytes out, decoded frames back).
- ``http_client``: a keep-alive HTTP/1.1 client on h11.
- ``processes``: a real ``pynsqd`` process (``BrokerProcess``).
- ``snapshots``: stats snapshots built from plain dataclasses.
- ``interop``: real NSQ client libraries run as separate processes.
"""
