"""The chaos suite's own local control plane (module-scoped): the cases kill its API server and restart
its components, so the session's shared cluster (tests/conftest.py ``cluster``) is never touched. Started
beside it, it takes free ports and a loopback pod CIDR of its own (disagg.cluster.local)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from disagg.chaos import ChaosCluster
from disagg.cluster.binaries import BinaryError
from disagg.cluster.local import ClusterError


@pytest.fixture(scope="module")
def chaos_cluster(
    control_plane_programs: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChaosCluster]:
    workdir: Path = tmp_path_factory.mktemp("chaos")
    try:
        cc = ChaosCluster.start(workdir)
    except (ClusterError, BinaryError) as exc:
        pytest.fail(f"the chaos suite's control plane did not start: {exc}", pytrace=False)
    try:
        yield cc
    finally:
        cc.close()
