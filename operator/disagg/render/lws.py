"""LeaderWorkerSet (sigs.k8s.io/lws, leaderworkerset.x-k8s.io/v1): what rendering a multi-node replica
needs to know about it. Pure.

A pool whose replicas span several nodes (spec.<role>.parallelism.nodesPerReplica > 1) is one
LeaderWorkerSet: a group per replica, a leader pod (worker index 0) and nodesPerReplica - 1 worker pods.
Facts from kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go: the environment variables
its pod webhook adds to every container of a group (LwsLeaderAddress, LwsGroupSize, LwsWorkerIndex), the
leader address ``<leader pod>.<LeaderWorkerSet name>.<namespace>`` resolved through the headless
Service the controller creates under the LeaderWorkerSet's own name (pkg/controllers,
CreateHeadlessServiceIfNotExists: skipped when a Service of that name exists), and the worker-index label
(WorkerIndexLabelKey).
"""

from __future__ import annotations

from typing import Literal

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"

# Added by the LeaderWorkerSet pod webhook to every container of a group (leaderworkerset_types.go).
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"  # <leader pod>.<lws name>.<namespace>
GROUP_SIZE_ENV = "LWS_GROUP_SIZE"  # leaderWorkerTemplate.size
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"  # 0 on the leader, 1..size-1 on the workers
# Set on every pod of a group by the controller, "0" on leaders (WorkerIndexLabelKey).
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# Set on every pod of a group: the group's index (GroupIndexLabelKey); groups beyond spec.replicas are removed
# highest index first (the leaders are a StatefulSet's pods).
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"

# Which pod of a replica an engine container is for: the only pod of a single-node replica (a Deployment's),
# or the leader or a worker of a LeaderWorkerSet group. Only the leader (and a single pod) serves HTTP.
Member = Literal["single", "leader", "worker"]

# The ``$(VAR)`` forms the kubelet expands in command and args.
LEADER_ADDRESS = f"$({LEADER_ADDRESS_ENV})"
WORKER_INDEX = f"$({WORKER_INDEX_ENV})"
