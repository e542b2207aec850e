"""A Spark standalone cluster on 127.0.0.1: one master and its workers, each a JVM of its own.

Started the way Spark's own scripts start them, from the installed pyspark's
``bin/spark-class`` (``org.apache.spark.deploy.master.Master`` and
``org.apache.spark.deploy.worker.Worker``), on ports chosen free, with small heaps.
``spark-class`` ends in ``exec``, so each process id is the JVM's: :meth:`StandaloneCluster.stop`
kills exactly the JVMs this object started, by process id.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["StandaloneCluster", "java_missing", "spark_class"]

#: Heap of the master and worker daemons (``SPARK_DAEMON_MEMORY``); they only schedule.
DAEMON_MEMORY = "256m"
#: Memory each worker offers its executor; Spark refuses executors below 450 MiB.
WORKER_MEMORY = "640m"
#: How long the master and the workers may take to come up on a busy machine.
START_TIMEOUT_S = 60.0


def spark_class() -> Path:
    """The installed pyspark's ``bin/spark-class``."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def java_missing() -> str | None:
    """Why no JVM can start (no ``java`` on PATH and no ``JAVA_HOME``), or None."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return None
    if shutil.which("java"):
        return None
    return "no Java found (java on PATH or JAVA_HOME); Debian: apt-get install openjdk-17-jre-headless"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class StandaloneCluster:
    """A master and ``workers`` workers (one core each) under ``root``; logs in ``root``.

    ``env`` is the environment of the daemons, which their executors inherit (put
    ``PYSPARK_PYTHON`` and ``PYTHONPATH`` there for the executors' Python workers).
    The caller must :meth:`stop` it, in a ``finally``.
    """

    def __init__(self, root: Path, env: dict[str, str], *, workers: int = 2):
        self.root = root
        self.env = dict(env, SPARK_DAEMON_MEMORY=DAEMON_MEMORY, SPARK_LOCAL_IP="127.0.0.1",
                        SPARK_LOG_DIR=str(root), SPARK_WORKER_DIR=str(root / "work"))
        self.workers = workers
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def _start(self, name: str, *args: str) -> Path:
        log = self.root / f"{name}.log"
        with open(log, "ab") as out:
            self.processes.append(subprocess.Popen(
                [str(spark_class()), *args], env=self.env, stdout=out, stderr=out,
                stdin=subprocess.DEVNULL, cwd=self.root))
        return log

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker has registered.

        Raises RuntimeError (with the logs) when a JVM exits or the registration takes
        longer than START_TIMEOUT_S.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        master_log = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                 "--port", str(self.port), "--webui-port", str(free_port()))
        for n in range(self.workers):
            self._start(f"worker{n}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "1",
                        "--memory", WORKER_MEMORY, "--work-dir", str(self.root / f"work{n}"), self.url)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            registered = len(re.findall(r"Registering worker 127\.0\.0\.1:", master_log.read_text(errors="replace")))
            if registered >= self.workers:
                return self
            if any(process.poll() is not None for process in self.processes):
                break
            time.sleep(0.2)  # a JVM's log is the only signal it gives
        raise RuntimeError(f"the standalone cluster did not come up:\n{self.logs()}")

    def logs(self) -> str:
        """The tail of every daemon's log."""
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
                         for log in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        """SIGTERM each JVM this object started, by process id; SIGKILL what is still running
        after a while. Idempotent."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
