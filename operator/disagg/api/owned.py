"""What the operator owns in an engine pod, and the rules that keep user input off it.

The operator renders the flags that wire a pool (the KV-transfer config, the role, ports, the served name,
the parallelism), the environment that carries the Hugging Face token's Secret reference and the NIXL side
channel, and the pod's ``dshm`` and ``model`` volumes. Extra ``args``/``env`` are appended after ours and a
``podTemplate`` is merged over the rendered pod, so without these rules a user's second
``--kv-transfer-config`` would win, an ``env`` ``HF_TOKEN`` would replace the Secret reference with plain
text, and a ``podTemplate`` volume named ``dshm`` would be merged into ours.

Where it is refused (docs/deployment.md, "What the operator owns"):
- ``args`` and ``env`` of ``spec.engine``, ``spec.prefill`` and ``spec.decode``: at admission, by a CEL rule
  on the list (the API server names the field) and by the same check in the model (``disagg render``).
- ``podTemplate`` (free-form: the API server keeps it as given, CEL can't see into it): by the model, so
  ``disagg render`` fails and the operator sets ``Degraded`` (reason ``InvalidSpec``) naming the field.
The explicit escape hatch is the engine container's own ``args``/``command`` in ``podTemplate``: a list
there replaces ours whole, on purpose.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from disagg.api.common import ArgList, EnvList, EnvVar, FreeFormObject

# flag -> where the operator takes its value from (vLLM and SGLang spellings; refused for either engine)
OWNED_ENGINE_FLAGS: dict[str, str] = {
    "--kv-transfer-config": "from spec.kvTransfer",
    "--served-model-name": "from spec.model.servedName",
    "--model": "from spec.model",
    "--model-path": "from spec.model",
    "--tensor-parallel-size": "from tensorParallelSize",
    "-tp": "from tensorParallelSize",
    "--tp-size": "from tensorParallelSize",
    "--tp": "from tensorParallelSize",
    "--host": "to the pod's address",
    "--port": "to the engine port the probes and Services use",
    "--shutdown-timeout": "from shutdownTimeoutSeconds",
    "--disaggregation-mode": "from the pool's role",
    "--disaggregation-transfer-backend": "from spec.kvTransfer.connector",
    "--disaggregation-bootstrap-port": "from spec.kvTransfer.bootstrapPort",
}
# env name -> where the operator takes its value from
OWNED_ENGINE_ENV: dict[str, str] = {
    "HF_TOKEN": "from spec.model.source.huggingFace.tokenSecretRef (a Secret reference, never plain text)",
    "POD_NAMESPACE": "to the pod's namespace",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "to the pod IP",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "from spec.kvTransfer.sideChannelPort",
}
# volumes of the rendered engine pod: /dev/shm and the model's claim
OWNED_VOLUMES: dict[str, str] = {
    "dshm": "/dev/shm (the engine's shared memory)",
    "model": "spec.model.source",
}
ENGINE_CONTAINER = "engine"

# The flags above as patterns, the same in RE2 (CEL's matches) and Python: the flag alone, as
# --flag=value, and in the other spellings vLLM's argument parser reads as the same flag: underscores for
# dashes (--kv_transfer_config) and a dotted key into a JSON flag (--kv-transfer-config.kv_role=x):
# FlexibleArgumentParser.parse_args turns '_' into '-' between the leading '--' and the first '.', and
# sets a dotted key inside the flag's JSON (vllm/utils/argparse_utils.py). Two patterns, each a rule of
# its own, factored by hand: the API server's cost estimate of a rule grows with its pattern's length (one
# pattern of every flag and spelling exceeded the per-rule budget over 128 args of 4096 characters by
# 1.15x); tests/unit/test_api_owned.py checks they match exactly these flags and spellings.
OWNED_FLAG_PATTERNS = (
    "^--(kv[-_]transfer[-_]config|served[-_]model[-_]name|model([-_]path)?|tensor[-_]parallel[-_]size)"
    "([=.]|$)",
    "^-(tp|-(tp([-_]size)?|host|port|shutdown[-_]timeout"
    "|disaggregation[-_](mode|transfer[-_]backend|bootstrap[-_]port)))([=.]|$)",
)
OWNED_FLAG_PATTERN = "|".join(f"({pattern})" for pattern in OWNED_FLAG_PATTERNS)
_OWNED_FLAG_RE = re.compile(OWNED_FLAG_PATTERN)


def _cel_list(names: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


ARGS_MESSAGE = (
    f"must not set a flag the operator sets from the spec ({', '.join(OWNED_ENGINE_FLAGS)}): set the spec "
    "field instead (docs/deployment.md, What the operator owns)"
)
ARGS_RULES: list[dict[str, Any]] = [
    {"rule": f"self.all(a, !a.matches('{pattern}'))", "message": ARGS_MESSAGE}
    for pattern in OWNED_FLAG_PATTERNS
]
ENV_RULE: dict[str, Any] = {
    "rule": f"self.all(e, !(e.name in {_cel_list(list(OWNED_ENGINE_ENV))}))",
    "message": f"must not set an environment variable the operator sets ({', '.join(OWNED_ENGINE_ENV)}); "
    "the Hugging Face token goes in spec.model.source.huggingFace.tokenSecretRef",
}


def owned_flag(arg: str) -> str | None:
    """The owned flag ``arg`` sets, as :data:`OWNED_ENGINE_FLAGS` spells it (``--port`` for ``--port``,
    ``--port=1`` or ``--kv_transfer_config.kv_role=x``'s ``--kv-transfer-config``), None when it sets none."""
    if _OWNED_FLAG_RE.match(arg) is None:
        return None
    flag = re.split("[=.]", arg, maxsplit=1)[0]
    return flag if not flag.startswith("--") else flag.replace("_", "-")


def check_args(args: list[str]) -> list[str]:
    for index, arg in enumerate(args):
        flag = owned_flag(arg)
        if flag is not None:
            raise ValueError(f"[{index}] {flag} is set by the operator {OWNED_ENGINE_FLAGS[flag]}")
    return args


def env_problem(names: Sequence[str]) -> tuple[int, str] | None:
    """The index of the first owned variable in ``names`` and why it is the operator's."""
    for index, name in enumerate(names):
        if name in OWNED_ENGINE_ENV:
            return index, f"{name} is set by the operator {OWNED_ENGINE_ENV[name]}"
    return None


def pod_template_problem(template: Mapping[str, Any] | None) -> str | None:
    """What a podTemplate override would take from the operator, as ``podTemplate.<path>: why``."""
    if not template:
        return None
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        return None
    volumes = spec.get("volumes")
    for index, volume in enumerate(volumes if isinstance(volumes, list) else []):
        name = volume.get("name") if isinstance(volume, Mapping) else None
        if name in OWNED_VOLUMES:
            return (
                f"spec.volumes[{index}]: the volume {name!r} is the operator's "
                f"({OWNED_VOLUMES[name]}): name yours differently"
            )
    containers = spec.get("containers")
    for index, container in enumerate(containers if isinstance(containers, list) else []):
        if not isinstance(container, Mapping) or container.get("name") != ENGINE_CONTAINER:
            continue
        env = container.get("env")
        names = [str(e.get("name")) for e in (env if isinstance(env, list) else []) if isinstance(e, Mapping)]
        problem = env_problem(names)
        if problem is not None:
            return f"spec.containers[{index}].env[{problem[0]}]: {problem[1]}"
    return None


def _checked_env(env: list[EnvVar]) -> list[EnvVar]:
    problem = env_problem([e.name for e in env])
    if problem is not None:
        raise ValueError(f"[{problem[0]}] {problem[1]}")
    return env


def _checked_pod_template(template: dict[str, Any]) -> dict[str, Any]:
    problem = pod_template_problem(template)
    if problem is not None:
        raise ValueError(problem)
    return template


EngineArgList = Annotated[
    ArgList, AfterValidator(check_args), Field(json_schema_extra={"x-kubernetes-validations": ARGS_RULES})
]
"""Extra engine arguments: any but the flags the operator owns (refused at admission, naming the field)."""
EngineEnvList = Annotated[
    EnvList, AfterValidator(_checked_env), Field(json_schema_extra={"x-kubernetes-validations": [ENV_RULE]})
]
"""Extra engine environment: any variable but those the operator owns (refused at admission)."""
PodTemplateOverride = Annotated[FreeFormObject, AfterValidator(_checked_pod_template)]
"""A pod template override that leaves the operator's volumes and engine env alone (checked by the
model: the operator reports Degraded, ``disagg render`` fails; the CRD keeps podTemplate free-form)."""
