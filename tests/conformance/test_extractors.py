"""The extractors on small synthetic wheels shaped like the released ones: the rules they mirror (flag
names, arity, choices, --no- negation, env, routes) and that a wheel of another shape fails loudly."""

from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

import pytest

from disagg.conformance.engines import extract_sglang, extract_vllm
from disagg.conformance.facts import ExtractionError
from disagg.conformance.routers import extract_router, so_route_candidates

pytestmark = pytest.mark.conformance

VLLM_FILES = {
    "vllm/config/kv_transfer.py": """
        from typing import Any, Literal
        KVRole = Literal[Literal["kv_producer"], Literal["kv_consumer"]]

        @config
        class KVTransferConfig:
            kv_connector: str | None = None
            kv_role: KVRole | None = None
            kv_load_failure_policy: Literal["recompute", "fail"] = "fail"
    """,
    "vllm/config/model.py": """
        from typing import Literal
        ModelDType = Literal["auto", "bfloat16"]

        @config
        class ModelConfig:
            dtype: ModelDType = "auto"
            served_model_name: str | list[str] | None = None
            enforce_eager: bool = False
            max_model_len: int | None = None
            hf_token: bool | str | None = None
            kv_transfer_config: "KVTransferConfig | None" = None
    """,
    "vllm/engine/arg_utils.py": """
        def get_kwargs(cls): ...

        class EngineArgs:
            @staticmethod
            def add_cli_args(parser):
                model_kwargs = get_kwargs(ModelConfig)
                group = parser.add_argument_group("ModelConfig")
                group.add_argument("--dtype", **model_kwargs["dtype"])
                group.add_argument("--served-model-name", **model_kwargs["served_model_name"])
                group.add_argument("--enforce-eager", **{**model_kwargs["enforce_eager"], "default": None})
                group.add_argument("--max-model-len", "-mml", **model_kwargs["max_model_len"])
                group.add_argument("--hf-token", **model_kwargs["hf_token"])
                group.add_argument("--kv-transfer-config", **model_kwargs["kv_transfer_config"])
                group.add_argument("--tensor-parallel-size", "-tp", type=int)
                parser.add_argument("--old", action=argparse.BooleanOptionalAction)
                return parser
    """,
    "vllm/entrypoints/common/cli_args.py": """
        @config
        class BaseFrontendArgs:
            chat_template: str | None = None
            middleware: list[str] = field(default_factory=list)

            @classmethod
            def add_cli_args(cls, parser):
                frontend_kwargs = get_kwargs(cls)
                frontend_kwargs = cls._customize_cli_kwargs(frontend_kwargs)
                for key, value in frontend_kwargs.items():
                    extra_flags = value.pop("flags", [])
                    parser.add_argument(*extra_flags, f"--{key.replace('_', '-')}", **value)
                return parser

        @config
        class FrontendArgs(BaseFrontendArgs):
            host: str | None = None
            port: int = 8000
            uvicorn_log_level: Literal["info", "debug"] = "info"

            @classmethod
            def _customize_cli_kwargs(cls, frontend_kwargs):
                frontend_kwargs["middleware"]["action"] = "append"
                frontend_kwargs["chat_template"]["flags"] = ["-ct"]
                return frontend_kwargs

        def make_arg_parser(parser):
            parser.add_argument("model_tag", nargs="?")
            parser.add_argument("--headless", action="store_true")
            parser = FrontendArgs.add_cli_args(parser)
            parser = AsyncEngineArgs.add_cli_args(parser)
            return parser
    """,
    "vllm/entrypoints/cli/serve.py": """
        class ServeSubcommand:
            def subparser_init(self, subparsers):
                serve_parser = subparsers.add_parser("serve")
                return make_arg_parser(serve_parser)
    """,
    "vllm/envs.py": """
        import os
        environment_variables: dict[str, Callable[[], Any]] = {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": lambda: os.getenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
        }
    """,
    "vllm/distributed/kv_transfer/kv_connector/factory.py": """
        KVConnectorFactory.register_connector(
            "NixlConnector", "vllm.distributed.kv_transfer.kv_connector.v1.nixl", "NixlConnector"
        )
    """,
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/__init__.py": """
        class NixlConnector:
            def __init__(self, vllm_config):
                self.backends = vllm_config.kv_transfer_config.get_from_extra_config("backends", ["UCX"])
                if os.environ.get("UCX_TLS"):
                    pass
    """,
    "vllm/entrypoints/serve/instrumentator/health.py": """
        @router.get("/health", response_class=Response)
        async def health(raw_request):
            await client.check_health()
            return Response(status_code=200)
    """,
    "vllm/entrypoints/launchers/dp_supervisor.py": """
        @app.get("/readyz")
        async def ready():
            return None
    """,
}


def _wheel(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, textwrap.dedent(text))
    return path


def test_vllm_rules(tmp_path: Path) -> None:
    facts = extract_vllm(_wheel(tmp_path, "vllm-9.9.9-cp38-abi3-any.whl", VLLM_FILES))
    options = facts.options
    assert facts.package == "vllm" and facts.version == "9.9.9"
    assert options["--dtype"].choices == ("auto", "bfloat16")  # a Literal alias becomes choices
    assert options["--dtype"].source == "vllm/engine/arg_utils.py:9"  # line 1 is the blank one
    assert options["--served-model-name"].arity == "list"  # list in the union: nargs="+"
    assert options["--enforce-eager"].arity == "flag"  # bool: BooleanOptionalAction ...
    assert options["--no-enforce-eager"].arity == "flag"  # ... with its negation
    assert options["--no-old"].arity == "flag"
    assert options["-mml"] == options["--max-model-len"] and options["--max-model-len"].arity == "value"
    assert options["--hf-token"].arity == "optional"  # bool | str | None
    assert options["--kv-transfer-config"].arity == "value"  # a dataclass: JSON
    assert options["--headless"].arity == "flag" and options["-tp"].arity == "value"
    # generated from the frontend dataclasses, base class included, customisations applied
    assert {"--host", "--port", "--chat-template", "-ct", "--middleware"} <= set(options)
    assert options["--middleware"].arity == "value"  # action="append": one value per occurrence
    assert options["--uvicorn-log-level"].choices == ("info", "debug")
    assert "model_tag" not in options and "--model-tag" not in options
    assert facts.kv_transfer_fields["kv_role"].choices == ("kv_producer", "kv_consumer")
    assert facts.kv_transfer_fields["kv_load_failure_policy"].choices == ("recompute", "fail")
    assert set(facts.kv_connectors) == {"NixlConnector"}
    assert facts.kv_extra_config_keys == {"NixlConnector": ("backends",)}
    assert {"VLLM_NIXL_SIDE_CHANNEL_HOST", "UCX_TLS"} <= set(facts.env)
    assert set(facts.routes) == {"/health"}  # not the DP supervisor's separate server


def test_vllm_wheel_of_another_shape_fails_loudly(tmp_path: Path) -> None:
    without_frontend = {k: v for k, v in VLLM_FILES.items() if "cli_args" not in k}
    with pytest.raises(ExtractionError, match=r"cli_args\.py"):
        extract_vllm(_wheel(tmp_path, "vllm-9.9.9-cp38-abi3-any.whl", without_frontend))
    renamed = dict(VLLM_FILES)
    renamed["vllm/engine/arg_utils.py"] = VLLM_FILES["vllm/engine/arg_utils.py"].replace(
        '"--kv-transfer-config"', '"--kv-transfer-configuration"'
    )
    with pytest.raises(ExtractionError, match="--kv-transfer-config"):
        extract_vllm(_wheel(tmp_path, "vllm-9.9.8-cp38-abi3-any.whl", renamed))


SGLANG_FILES = {
    "sglang/srt/arg_groups/fields/disagg.py": """
        class Disagg(msgspec.Struct):
            _NS_PATH = "disagg"
            disaggregation_mode: A[Literal["null", "prefill", "decode"], "PD mode"] = "null"
            disaggregation_transfer_backend: A[
                str, Arg(help="backend", choices=DISAGG_TRANSFER_BACKEND_CHOICES)
            ] = "mooncake"
            disaggregation_bootstrap_port: A[int, "port"] = 8998
            hidden: A[bool, Arg(help="x", no_cli=True)] = False
            undecorated: int = 1
    """,
    "sglang/srt/arg_groups/fields/serving.py": """
        class Serving(msgspec.Struct):
            _NS_PATH = "serving"
            model_path: A[str, Arg(help="weights", aliases=["--model"])]
            port: A[int, "port"] = 30000
            tp_size: A[int, Arg(help="tp", aliases=["--tensor-parallel-size"])] = 1
            enable_metrics: A[bool, "metrics"] = False
            api_keys: A[Optional[List[str]], "keys"] = None
            old_flag: A[bool, Arg(help="old", action=DeprecatedStoreTrueAction)] = False
            served: A[str, Arg(help="name", cli_name="--served-model-name")] = ""
    """,
    "sglang/srt/arg_groups/choices.py": """
        DISAGG_TRANSFER_BACKEND_CHOICES = ["mooncake", "nixl"]
    """,
    "sglang/srt/server_args.py": """
        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                add_cli_args_from_dataclass(parser, ServerArgs)
                parser.add_argument("--config", type=str)

        _INPUT_NAMESPACES = [Disagg, Serving]
    """,
    "sglang/srt/environ.py": """
        class Envs:
            SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION = EnvBool(True)
            SGLANG_NEW = EnvBoolWithAlias(True, deprecated_name="SGLANG_OLD")
    """,
    "sglang/srt/utils/common.py": """
        def add_prometheus_middleware(app):
            metrics_route = Mount("/metrics", make_asgi_app(registry=registry))
    """,
    "sglang/srt/entrypoints/http_server.py": """
        if get_observability().enable_metrics:
            add_prometheus_middleware(app)

        @app.get("/health")
        @app.get("/health_generate")
        async def health_generate(request):
            if not envs.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.get() and request.url.path == "/health":
                return Response(status_code=200)
            task = asyncio.create_task(gen(tokenizer_manager.generate_request(gri, request)))
            while time.time() < tic + HEALTH_CHECK_TIMEOUT:
                await asyncio.sleep(1)
            return Response(status_code=503)
    """,
}


def test_sglang_rules(tmp_path: Path) -> None:
    facts = extract_sglang(_wheel(tmp_path, "sglang-9.9.9-cp311-cp311-any.whl", SGLANG_FILES))
    options = facts.options
    assert options["--disaggregation-mode"].choices == ("null", "prefill", "decode")
    assert options["--disaggregation-transfer-backend"].choices == ("mooncake", "nixl")  # a named list
    assert options["--model"] == options["--model-path"]
    assert "--tensor-parallel-size" in options and options["--tp-size"].arity == "value"
    assert options["--enable-metrics"].arity == "flag" and options["--old-flag"].arity == "flag"
    assert options["--api-keys"].arity == "list"
    assert "--served-model-name" in options and "--served" not in options  # Arg.cli_name
    assert "--hidden" not in options and "--undecorated" not in options  # no_cli, no Arg metadata
    assert "--config" in options  # explicit add_argument
    assert {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "SGLANG_NEW", "SGLANG_OLD"} <= set(facts.env)
    assert facts.route_requires == {"/metrics": "--enable-metrics"}
    health = {route.path: route for route in facts.health}
    assert health["/health"].generates and health["/health"].min_seconds == 1
    assert health["/health"].disabled_by_env == "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"
    assert health["/health_generate"].disabled_by_env is None


def test_router_rules(tmp_path: Path) -> None:
    router_args = """
        @dataclasses.dataclass
        class RouterArgs:
            bootstrap_port_annotation: str = "example.ai/bootstrap-port"
            health_check_endpoint: str = "/health"

            @classmethod
            def from_cli_args(cls, args, use_router_prefix=False):
                args_dict = {}
                args_dict["bootstrap_port_annotation"] = "vllm.ai/bootstrap-port"
                return cls(**args_dict)
    """
    extension = b"\x00/liveness/readinessindex\x01/healthvllm.ai/bootstrap-port\x02/v1/chat/completionsX"
    wheel = _wheel(
        tmp_path, "vllm_router-9.9.9-cp38-abi3-any.whl", {"vllm_router/router_args.py": router_args}
    )
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("vllm_router_rs.abi3.so", extension)
    facts = extract_router("vllm-router", wheel)
    assert facts.bootstrap_port_annotation == "vllm.ai/bootstrap-port"  # what from_cli_args forces
    assert facts.annotation_source == "vllm_router/router_args.py:10"
    assert set(so_route_candidates(extension)) == {
        "/liveness/readinessindex",
        "/healthvllm.ai/bootstrap-port",
        "/v1/chat/completions",
    }
