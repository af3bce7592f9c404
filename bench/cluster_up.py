"""Benchmark: warm `disagg cluster up` time to a Ready node list.

Obtains the programs first (a cold build on a fresh machine; its time is printed from the cache's records),
then starts and stops a control plane in a temporary state directory ``--runs`` times and prints the
time from start to every kwok node Ready, plus the cache's size.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from disagg.cluster.binaries import PROGRAMS_OF, BuildSettings, cache_size_bytes, component_dir, ensure_all
from disagg.cluster.local import ClusterSettings, LocalCluster


def cold_build_seconds(settings: BuildSettings) -> dict[str, str]:
    """Recorded time of each component's first build or download ('unknown' if not recorded)."""
    recorded: dict[str, str] = {}
    for component in PROGRAMS_OF:
        path = component_dir(settings, component) / "build-seconds"
        recorded[component] = path.read_text().strip() + " s" if path.is_file() else "unknown"
    return recorded


def warm_up_seconds(runs: int) -> list[float]:
    times: list[float] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="disagg-bench-") as tmp:
            cluster = LocalCluster(
                state_dir=Path(tmp) / "cluster", settings=ClusterSettings(tie_to_parent=True)
            )
            started = time.monotonic()
            try:
                cluster.up()
                times.append(time.monotonic() - started)
            finally:
                cluster.down()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    settings = BuildSettings()
    started = time.monotonic()
    ensure_all()
    print(f"obtain binaries (this run): {time.monotonic() - started:.1f} s")
    for component, seconds in cold_build_seconds(settings).items():
        print(f"cold build/download {component:<11} {seconds}")
    times = warm_up_seconds(args.runs)
    print("warm cluster up to Ready nodes: " + ", ".join(f"{t:.1f} s" for t in times))
    print(f"warm cluster up median: {statistics.median(times):.1f} s over {len(times)} runs")
    print(f"cache size {settings.cache_root}: {cache_size_bytes(settings) / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
