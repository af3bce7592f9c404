"""The external metric an HPA or KEDA scales a DisaggregatedDeployment on, as prometheus-adapter serves it.

``disagg_requests_in_flight``: the requests running or waiting in both pools' engines of one deployment,
summed over its pods (the engines' own gauges, ENGINE_METRICS' ``running`` and ``waiting``, as the
Prometheus relabelling of :mod:`disagg.metrics.relabel` labels them: ``namespace`` and
``disagg_deployment``). An HPA asks for it per deployment with ``metric.selector.matchLabels:
{disagg_deployment: NAME}`` and an ``AverageValue`` target (requests in flight per replica); the
deployment's /scale total is then split at the ratio by the operator (:mod:`disagg.render.scale`).

:func:`adapter_config` is prometheus-adapter's configuration file for it (``externalRules``; the format
of sigs.k8s.io/prometheus-adapter v0.12.0, docs/config.md and docs/externalmetrics.md). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from disagg.metrics.queries import ENGINE_METRICS

REQUESTS_IN_FLIGHT = "disagg_requests_in_flight"
DEPLOYMENT_LABEL = "disagg_deployment"  # the target label disagg.cluster.prometheus / relabel.py set


def in_flight_series() -> tuple[str, ...]:
    """Every engine's running and waiting gauges, vLLM's then SGLang's."""
    names: list[str] = []
    for metrics in ENGINE_METRICS.values():
        names += [*metrics.running, *metrics.waiting]
    return tuple(names)


def adapter_config() -> dict[str, Any]:
    """prometheus-adapter's ``--config``: one external rule, namespaced (the adapter adds the HPA's
    namespace to the label matchers), summed per deployment."""
    names = "|".join(in_flight_series())
    return {
        "externalRules": [
            {
                "seriesQuery": f'{{__name__=~"{names}",{DEPLOYMENT_LABEL}!=""}}',
                # every matched series is exposed under the one name
                "name": {"matches": "^.*$", "as": REQUESTS_IN_FLIGHT},
                "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
                "metricsQuery": (f'sum by ({DEPLOYMENT_LABEL}) ({{__name__=~"{names}",<<.LabelMatchers>>}})'),
            }
        ]
    }
