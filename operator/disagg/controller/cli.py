"""`disagg run`: the operator, against $KUBECONFIG (or ~/.kube/config, or the in-cluster service account).

Peering (high availability with kopf): ``--peering NAME`` uses kopf's ``KopfPeering`` objects
(kopf.dev/v1, namespaced, one per watched namespace) or, with ``--all-namespaces``, a
``ClusterKopfPeering``; the chart installs both CRDs and the peering object. ``--standalone`` needs none.
"""

from __future__ import annotations

import argparse
import logging
import random

from pydantic import ValidationError

from disagg.clicommon import usage_error
from disagg.controller.settings import ControllerSettings

# kopf's peering priorities are integers; "random" picks one so replicas of one operator never tie.
RANDOM_PRIORITY_RANGE = (1, 2**31 - 1)
QUIET_LOGGERS = ("kopf.objects", "aiohttp.access")


def _priority(value: str) -> int:
    if value == "random":
        return random.randint(*RANDOM_PRIORITY_RANGE)
    try:
        return int(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"--peering-priority: expected an integer or 'random', got {value!r}"
        ) from error


def configure(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable; kopf glob patterns allowed)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--standalone", action="store_true", help="run without peering (the default without --peering)"
    )
    peering.add_argument(
        "--peering", metavar="NAME", help="coordinate with other replicas via the (Cluster)KopfPeering NAME"
    )
    parser.add_argument(
        "--peering-priority",
        type=_priority,
        default=None,
        metavar="N|random",
        help="this replica's peering priority (the highest one runs)",
    )
    parser.add_argument(
        "--peering-lifetime", type=int, default=None, metavar="S", help="seconds a peering heartbeat lasts"
    )
    parser.add_argument(
        "--liveness-endpoint",
        metavar="URL",
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on PORT")
    parser.add_argument(
        "--metrics-host", default="0.0.0.0", metavar="ADDR", help="address for the metrics server"
    )
    parser.add_argument(
        "--prometheus-url", metavar="URL", help="Prometheus the autoscaling loop reads signals from"
    )
    parser.add_argument(
        "--prometheus-ca-file",
        metavar="PEM",
        help="verify Prometheus' TLS certificate against this CA bundle",
    )
    parser.add_argument(
        "--prometheus-bearer-token-file",
        metavar="FILE",
        help="send the token in FILE (re-read each evaluation) as 'Authorization: Bearer' to Prometheus",
    )
    parser.add_argument(
        "--prometheus-insecure-skip-verify",
        action="store_true",
        default=None,
        help="do not verify Prometheus' TLS certificate (verification is on by default)",
    )
    parser.add_argument(
        "--resync-interval",
        type=float,
        default=None,
        metavar="S",
        help="re-reconcile every object this often even without events (default: DISAGG_RESYNC_INTERVAL_S, "
        f"else {ControllerSettings.model_fields['resync_interval_s'].default})",
    )
    parser.add_argument(
        "--log-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log level"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log at DEBUG level")
    parser.set_defaults(func=run)


def operator_settings(args: argparse.Namespace) -> ControllerSettings:
    """The settings from the environment (DISAGG_*), the flags winning; validated."""
    settings = ControllerSettings()
    flags: dict[str, object] = {}
    if args.resync_interval is not None:
        flags["resync_interval_s"] = args.resync_interval
    prometheus = {
        "prometheus_url": args.prometheus_url,
        "prometheus_ca_file": args.prometheus_ca_file,
        "prometheus_bearer_token_file": args.prometheus_bearer_token_file,
        "prometheus_insecure_skip_verify": args.prometheus_insecure_skip_verify,
    }
    given = {name: value for name, value in prometheus.items() if value}
    if given:
        flags["autoscaling"] = {**settings.autoscaling.model_dump(), **given}
    # validated again with the flags (model_copy would not check them)
    return ControllerSettings.model_validate({**settings.model_dump(), **flags}) if flags else settings


def run(args: argparse.Namespace) -> int:
    from disagg.controller.operator import RunOptions, run_operator  # kopf is imported only here

    level = "DEBUG" if args.verbose else (args.log_level or "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        for chatty in QUIET_LOGGERS:  # one line per handler call and per probe is noise at INFO
            logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    try:
        settings = operator_settings(args)
    except ValidationError as error:  # a flag or a DISAGG_* variable out of range: how it was invoked
        usage_error("disagg run", " ".join(str(error).split()))
    options = RunOptions(
        namespaces=tuple(args.namespaces or ()),
        all_namespaces=bool(args.all_namespaces),
        standalone=args.peering is None,
        peering_name=args.peering,
        peering_priority=args.peering_priority,
        peering_lifetime_s=args.peering_lifetime,
        liveness_endpoint=args.liveness_endpoint,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        settings=settings,
    )
    return run_operator(options)
