"""Chaos cases on the local control plane: the operator SIGKILLed mid-rollout, the API server down, etcd
down, Prometheus down or answering errors, slowly or garbage, an idle operator's writes, hundreds of
deployments under one operator, apply -> all children latency, hostile deployments applied to a running
operator, scale-downs under streaming traffic through the router.
Each case does something to the running system and measures what was lost; tests/chaos asserts the
correctness of each and bench/chaos_report.py prints them as a table.

* :mod:`~disagg.chaos.harness` - the cases' own local control plane, the operator as a process, and the
  accounting of deployments and their children (converged, duplicates, missing, orphans);
* :mod:`~disagg.chaos.cases` - the cases, each returning a :class:`~disagg.chaos.harness.CaseResult`;
* :mod:`~disagg.chaos.latency` - the time from an apply to all of its children announced on a watch;
* :mod:`~disagg.chaos.hostile` - hostile DisaggregatedDeployments from tables shared with the Hypothesis
  test of tests/integration, and what an operator-owned field taken looks like;
* :mod:`~disagg.chaos.promproxy` - a fault-injecting proxy in front of a real Prometheus (HTTP 500, slow
  answers, NaN/+Inf/negative/huge values, empty vectors, stale samples), switched at run time.
"""

from disagg.chaos.cases import CASES
from disagg.chaos.harness import CaseResult, ChaosCluster

__all__ = ["CASES", "CaseResult", "ChaosCluster"]
