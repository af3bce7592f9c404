"""``kubectl disagg``: the kubectl plugin (the ``kubectl-disagg`` console script; kubectl runs any executable
named ``kubectl-NAME`` on PATH as ``kubectl NAME``).

``kubectl disagg status NAME [-n NS]`` prints what a DisaggregatedDeployment is doing: P:D desired and
ready per pool, the SLO of the RatioPolicy it references, the latest evaluation, the recent decisions
with their causes, and the conditions, all read from the object's status (written by the operator) and
the policy. It reads the user's kubeconfig like kubectl (``--kubeconfig``, else $KUBECONFIG or
~/.kube/config, else in-cluster: :func:`disagg.k8s.client.load_api_client`) and writes nothing.
Exit codes as every ``disagg`` command: 0 ok, 1 failure (not found, unreachable), 2 usage.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from disagg.api.common import parse_rfc3339, shorten
from disagg.api.ratiopolicy import RatioPolicySpec
from disagg.api.status import DisaggregatedDeploymentStatus, ScalingDecision
from disagg.clicommon import EPILOG, EXIT_FAILURE, EXIT_OK

PROG = "kubectl disagg"
DEFAULT_DECISIONS = 5
MESSAGE_WIDTH = 100


def _age(moment: str | None, now: float) -> str:
    """How long ago an RFC 3339 time was, kubectl style (45s, 3m, 2h, 4d); '?' when unreadable."""
    at = parse_rfc3339(moment)
    if at is None:
        return "?"
    seconds = max(0, int(now - at))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _decision_line(decision: ScalingDecision, now: float) -> str:
    message = f"  {shorten(decision.message, MESSAGE_WIDTH)}" if decision.message else ""
    pd = f"{decision.prefill}:{decision.decode}"
    return f"  {decision.time} ({_age(decision.time, now)} ago)  {pd:<7} {decision.cause}{message}"


def _slo_line(policy_name: str, policy: Mapping[str, Any] | None) -> str:
    if policy is None:
        return f"SLO:        RatioPolicy {policy_name} not found"
    try:
        spec = RatioPolicySpec.model_validate(policy.get("spec") or {})
    except ValidationError:
        return f"SLO:        RatioPolicy {policy_name} is invalid"
    ttft, itl = spec.slo.ttft, spec.slo.itl
    return (
        f"SLO:        TTFT p{ttft.percentile:g} <= {ttft.target_seconds:g}s, "
        f"ITL p{itl.percentile:g} <= {itl.target_seconds * 1000:g}ms  (RatioPolicy {policy_name})"
    )


def format_status(
    dd: Mapping[str, Any], policy: Mapping[str, Any] | None, now: float, decisions: int = DEFAULT_DECISIONS
) -> str:
    """The text ``kubectl disagg status`` prints for ``dd`` (as read from the API server) and the
    RatioPolicy it references (None when it has none or it does not exist)."""
    metadata = dd.get("metadata") or {}
    spec = dd.get("spec") or {}
    status = DisaggregatedDeploymentStatus.model_validate(dd.get("status") or {})
    lines = [
        f"{dd.get('kind', 'DisaggregatedDeployment')} {metadata.get('namespace')}/{metadata.get('name')}"
    ]
    prefill, decode = status.prefill, status.decode
    if prefill is None or decode is None:
        lines.append("P:D:        no status yet (is the operator running?)")
    else:
        lines.append(
            f"P:D:        {prefill.desired}:{decode.desired} desired, {prefill.ready}:{decode.ready} ready "
            f"(prefill {prefill.ready}/{prefill.desired}, decode {decode.ready}/{decode.desired} "
            "ready/desired)"
        )
    if status.router is not None:
        endpoint = f", {status.router.endpoint}" if status.router.endpoint else ""
        lines.append(f"Router:     {status.router.ready}/{status.router.replicas} ready{endpoint}")
    autoscaling = spec.get("autoscaling") or {}
    policy_name = (autoscaling.get("policyRef") or {}).get("name")
    scaled = status.autoscaling
    total = spec.get("replicas")
    if not autoscaling.get("enabled"):
        origin = "the ratio" if total is not None else "replicas"
        lines.append(f"Autoscaling: off ({origin} from spec.prefill.replicas and spec.decode.replicas)")
    else:
        mode = (scaled.mode if scaled else None) or autoscaling.get("mode") or "the policy's"
        lines.append(f"Autoscaling: {mode}, RatioPolicy {policy_name}")
    if total is not None:
        where = "spec.replicas, /scale: HPA, KEDA or kubectl scale"
        lines.append(f"Scale:      {total} replicas in all ({where})")
    if policy_name:
        lines.append(_slo_line(str(policy_name), policy))
    if scaled is not None and scaled.last_evaluation is not None:
        lines.append("Last evaluation:")
        lines.append(_decision_line(scaled.last_evaluation, now))
    recent = scaled.decisions[:decisions] if scaled is not None else []
    if recent:
        lines.append(f"Decisions (newest first, {len(recent)} of {len(scaled.decisions) if scaled else 0}):")
        lines += [_decision_line(decision, now) for decision in recent]
    elif autoscaling.get("enabled"):
        lines.append("Decisions:  none yet")
    if status.conditions:
        lines.append("Conditions:")
        for condition in status.conditions:
            why = f"  {shorten(condition.message, MESSAGE_WIDTH)}" if condition.message else ""
            lines.append(f"  {condition.type:<17} {condition.status:<7} {condition.reason}{why}")
    return "\n".join(lines) + "\n"


def _default_namespace(kubeconfig: str | None) -> str:
    """The current context's namespace, as kubectl uses it; default when it names none."""
    from kubernetes import config as k8s_config

    try:
        _, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except Exception:  # no kubeconfig (in-cluster) or an unreadable one: load_api_client reports it
        return "default"
    return str(((active or {}).get("context") or {}).get("namespace") or "default")


def _status(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    from disagg.k8s.client import DISAGG_DEPLOYMENT, RATIO_POLICY, KubeApi, load_api_client

    namespace = args.namespace or _default_namespace(args.kubeconfig)
    try:
        kube = KubeApi(load_api_client(args.kubeconfig), request_timeout_s=args.request_timeout)
        dd = kube.get(DISAGG_DEPLOYMENT, namespace, args.name)
        if dd is None:
            print(
                f"{PROG} status: DisaggregatedDeployment {namespace}/{args.name} not found", file=sys.stderr
            )
            return EXIT_FAILURE
        policy_name = (((dd.get("spec") or {}).get("autoscaling") or {}).get("policyRef") or {}).get("name")
        policy = kube.get(RATIO_POLICY, namespace, str(policy_name)) if policy_name else None
    except (ApiException, OSError, ConfigException) as error:
        reason = getattr(error, "reason", None) if isinstance(error, ApiException) else None
        print(f"{PROG} status: {reason or error}".splitlines()[0], file=sys.stderr)
        return EXIT_FAILURE
    try:
        text = format_status(dd, policy, time.time(), args.decisions)
    except ValidationError as error:
        print(f"{PROG} status: unreadable status of {namespace}/{args.name}: {error}", file=sys.stderr)
        return EXIT_FAILURE
    sys.stdout.write(text)
    return EXIT_OK


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def parser() -> argparse.ArgumentParser:
    from disagg.cli import version

    top = argparse.ArgumentParser(
        prog=PROG,
        description="The disagg kubectl plugin: what DisaggregatedDeployments are doing.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"kubectl-disagg {version()}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    status = sub.add_parser(
        "status",
        help="P:D desired and ready, the SLO, the last decisions and their causes, the conditions",
        description="Print a DisaggregatedDeployment's P:D (desired and ready per pool), the SLO of its "
        "RatioPolicy, the latest evaluation and decisions with their causes, and its conditions.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    status.add_argument("name", metavar="NAME", help="the DisaggregatedDeployment")
    status.add_argument(
        "-n", "--namespace", help="its namespace (default: the kubeconfig context's, else default)"
    )
    status.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    status.add_argument(
        "--decisions",
        type=_positive,
        default=DEFAULT_DECISIONS,
        help=f"how many recent decisions to show (default {DEFAULT_DECISIONS})",
    )
    status.add_argument(
        "--request-timeout", type=float, default=30.0, help="seconds per API request (default 30)"
    )
    status.set_defaults(func=_status)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))  # usage errors exit 2
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
