"""A real Prometheus (Debian's package, installed by the Makefile) on a loopback port, scraping
the targets a test gives it every second and evaluating its rule files, for the dashboard and
alert tests."""

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from server_process import _free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
SCRAPE_INTERVAL_S = 1


@dataclass(frozen=True)
class Target:
    """A scrape target and the labels the Prometheus operator's PodMonitor would give it."""

    address: str
    labels: dict[str, str] = field(default_factory=dict)


class PrometheusProcess:
    """``with PrometheusProcess(workdir, targets, rule_files) as prom:`` → ready to query."""

    def __init__(self, workdir: Path, targets: list[Target], rule_files: list[Path]) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        interval = f"{SCRAPE_INTERVAL_S}s"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(f) for f in rule_files],
            "scrape_configs": [
                {
                    "job_name": "kvserve",
                    "static_configs": [
                        {"targets": [t.address], "labels": t.labels} for t in targets
                    ],
                }
            ],
        }
        self.num_targets = len(targets)
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "PrometheusProcess":
        command = [
            PROMETHEUS, f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start:\n{self.log.read_text()}")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: Any) -> Any:
        """The ``data`` of a ``/api/v1`` answer; ``AssertionError`` with Prometheus' error."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as r:
                answer = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            answer = json.loads(exc.read())
        assert answer["status"] == "success", f"{path} {params}: {answer.get('error')}"
        return answer["data"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict]:
        """Every series ``expr`` gives between ``start`` and ``end``, each second."""
        data = self.api("query_range", query=expr, start=start, end=end, step=SCRAPE_INTERVAL_S)
        assert data["resultType"] == "matrix"
        return data["result"]

    def wait_for_scrape(self) -> float:
        """Until every target was scraped after this call; the time then."""
        since = time.time()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            scraped = self.api("query", query="timestamp(up)")["result"]
            times = [float(series["value"][1]) for series in scraped]
            if len(times) == self.num_targets and min(times) > since:
                return time.time()
            time.sleep(0.2)
        raise AssertionError("no scrape of every target after the load")
