"""Should the pools run yet? The model cache gate, a pure function of the spec and the download Job.

With ``spec.model.cache`` the engine pods mount the cache claim read-only with HF_HUB_OFFLINE=1, so a pod
started before the download Job has filled the claim would fail to load the model. Until the Job has
succeeded the reconciler applies both pools with 0 replicas (router, Services, PDBs as usual) and the
``ModelCached`` condition says why; a Job that failed (its backoffLimit exhausted, or its deadline passed)
makes the object Degraded with a Warning Event naming it, and the pools stay at 0 until the spec changes
(a new model id or revision is a new Job) or someone deletes the failed Job (the next reconcile creates it
again).

Once a Job has succeeded, its success is remembered in the ``ModelCached`` condition (reason
``Downloaded``, its message names the Job): deleting the finished Job, or a re-created Job that runs
again, does not take the pools back to 0. Pure: dicts in, a dataclass out.

Job status semantics (batch/v1 JobStatus): the controller sets condition ``Complete`` when the Job has
succeeded and ``Failed`` when it has failed for good (reasons BackoffLimitExceeded, DeadlineExceeded,
...); ``succeeded`` / ``failed`` / ``active`` count pods.
Source: https://kubernetes.io/docs/concepts/workloads/controllers/job/#terminal-job-conditions
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disagg.api.deployment import DisaggregatedDeployment
from disagg.controller.status import MODEL_CACHED, Problem
from disagg.render.builders import build_model_download_job

__all__ = ["MODEL_CACHED", "CacheCondition", "ModelCacheState", "gated_replicas", "model_cache_state"]


@dataclass(frozen=True)
class CacheCondition:
    """The ModelCached condition to set."""

    status: bool
    reason: str  # Prefilled | Downloading | Downloaded | DownloadFailed
    message: str


@dataclass(frozen=True)
class ModelCacheState:
    """What the model cache means for this reconcile."""

    pools_run: bool  # False: apply prefill and decode with 0 replicas
    condition: CacheCondition | None  # None: no spec.model.cache (the condition is removed)
    problem: Problem | None = None  # the download failed: Degraded, with a Warning Event
    job_name: str | None = None  # the download Job of the spec, when one runs


def _job_condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return dict(condition)
    return None


def _count(job: Mapping[str, Any], key: str) -> int:
    value = (job.get("status") or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _cached_before(previous: Mapping[str, Any] | None, job_name: str) -> bool:
    """Whether the last ModelCached condition says this very Job (same model and revision) succeeded."""
    return (
        previous is not None
        and previous.get("status") == "True"
        and previous.get("reason") == "Downloaded"
        and job_name in str(previous.get("message") or "").split()
    )


def model_cache_state(
    dd: DisaggregatedDeployment,
    job: Mapping[str, Any] | None,
    previous: Mapping[str, Any] | None = None,
) -> ModelCacheState:
    """The gate for ``dd`` given its live download Job (None: not there) and the ModelCached condition
    of the current status (``previous``)."""
    cache = dd.spec.model.cache
    if cache is None:
        return ModelCacheState(pools_run=True, condition=None)
    claim = cache.claim_name
    if cache.prefilled:
        message = f"claim {claim} is prefilled: no download"
        return ModelCacheState(True, CacheCondition(True, "Prefilled", message))
    manifest = build_model_download_job(dd)
    assert manifest is not None  # a cache that is not prefilled always has a download Job
    name = str(manifest["metadata"]["name"])
    model = manifest["metadata"]["annotations"]
    what = model["disagg.dev/model-id"]
    if model.get("disagg.dev/model-revision"):
        what += f"@{model['disagg.dev/model-revision']}"
    before = _cached_before(previous, name)
    done = f"Job {name} downloaded {what} into claim {claim}"
    if job is not None and (_job_condition(job, "Complete") is not None or _count(job, "succeeded") > 0):
        return ModelCacheState(True, CacheCondition(True, "Downloaded", done), job_name=name)
    failed = _job_condition(job, "Failed") if job is not None else None
    if job is not None and failed is not None:
        why = f"{failed.get('reason') or 'Failed'}: {failed.get('message') or ''}".strip().rstrip(":")
        message = (
            f"download Job {name} of {what} into claim {claim} failed after {_count(job, 'failed')} "
            f"pod failures ({why}); see its pods' logs, then fix the spec or delete the Job to retry"
        )
        problem = Problem("ModelDownloadFailed", message)
        if before:  # the files were there: keep serving, but say the re-run failed
            return ModelCacheState(True, CacheCondition(True, "Downloaded", done), problem, name)
        return ModelCacheState(False, CacheCondition(False, "DownloadFailed", message), problem, name)
    if before:
        return ModelCacheState(True, CacheCondition(True, "Downloaded", done), job_name=name)
    if job is None:
        message = f"creating download Job {name} of {what} into claim {claim}; the pools wait at 0 replicas"
    else:
        message = (
            f"Job {name} is downloading {what} into claim {claim} ({_count(job, 'active')} active, "
            f"{_count(job, 'failed')} failed pods); the pools wait at 0 replicas"
        )
    return ModelCacheState(False, CacheCondition(False, "Downloading", message), job_name=name)


def gated_replicas(replicas: Mapping[str, int], state: ModelCacheState) -> dict[str, int]:
    """The pools' replicas with the gate applied: unchanged when the pools may run, 0 each otherwise."""
    return dict(replicas) if state.pools_run else {role: 0 for role in replicas}
