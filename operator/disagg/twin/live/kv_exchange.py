"""The P/D exchanges a live engine takes part in, as the released engines and routers speak them: vLLM's
NIXL ``kv_transfer_params`` (:func:`parse_kv_transfer_params`, :class:`RemotePrefill`) and SGLang's bootstrap
pairing (:func:`parse_bootstrap`, the in-process :class:`Rendezvous` standing in for its bootstrap server).
Request fields the engine refuses raise :class:`RequestError`, naming the field. The engine that acts on
them: :mod:`disagg.twin.live.engine`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple


class RequestError(ValueError):
    """A request the engine refuses; ``field`` names the offending request field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


BlockIds = tuple[tuple[int, ...], ...]  # one tuple of block ids per KV cache group, as vLLM's BlockIds


@dataclass(frozen=True)
class RemotePrefill:
    """Where a decode request's KV comes from (vLLM NixlConnector's kv_transfer_params)."""

    engine_id: str
    block_ids: BlockIds
    host: str
    port: int
    request_id: str
    tp_size: int = 1


class KvTransfer(NamedTuple):
    """What a request's ``kv_transfer_params`` ask of the engine."""

    remote_decode: bool  # a prefill for a remote decode engine: end after the prompt, keep the blocks
    remote: RemotePrefill | None  # a decode whose prompt KV is to be read from a prefill engine
    invalid: str | None = None  # do_remote_prefill with params no KV load can use: why (names the field)


KvPuller = Callable[[RemotePrefill], Awaitable[str | None]]  # None: read; else why the read failed


@dataclass(frozen=True)
class Bootstrap:
    """SGLang's P/D pairing: the prefill server's bootstrap address and the room both sides share."""

    host: str
    port: int
    room: int


BootstrapProbe = Callable[[Bootstrap], Awaitable[str | None]]  # None: a prefill serves there; else why not


def parse_bootstrap(body: Mapping[str, Any]) -> Bootstrap | None:
    """SGLang's ``bootstrap_host``/``bootstrap_port``/``bootstrap_room`` request fields, if present.

    Field names from sgl-project/sglang (the PD router adds them to the request it sends to both the
    prefill and the decode server; python/sglang/srt/disaggregation).
    """
    names = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
    present = [n for n in names if body.get(n) is not None]
    if not present:
        return None
    for name in names:
        if name not in present:
            raise RequestError(name, "required with the other bootstrap_* fields")
    host, port, room = body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"]
    if not isinstance(host, str) or not host:
        raise RequestError("bootstrap_host", "must be a host name")
    try:
        port, room = int(port), int(room)
    except (TypeError, ValueError):
        raise RequestError("bootstrap_port", "bootstrap_port and bootstrap_room must be integers") from None
    if not 0 < port < 65536:
        raise RequestError("bootstrap_port", f"must be a TCP port, got {port}")
    return Bootstrap(host, port, room)


class Rendezvous:
    """In-process stand-in for SGLang's bootstrap server: a decode request waits for its room's prefill.

    Shared by every simulated pod of one process (the pod pool owns it). Rooms are forgotten once the
    decode side has its KV, or, oldest first, when more than ``limit`` are open.
    """

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._rooms: dict[Bootstrap, asyncio.Future[int]] = {}

    def _room(self, key: Bootstrap) -> asyncio.Future[int]:
        room = self._rooms.get(key)
        if room is None:
            while len(self._rooms) >= self.limit:
                self._rooms.pop(next(iter(self._rooms)))
            room = asyncio.get_running_loop().create_future()
            self._rooms[key] = room
        return room

    def publish(self, key: Bootstrap, prompt_tokens: int) -> None:
        """The prefill side computed the prompt's KV."""
        room = self._room(key)
        if not room.done():
            room.set_result(prompt_tokens)

    async def wait(self, key: Bootstrap, timeout_s: float) -> int:
        """Until the prefill of ``key`` is done (TimeoutError after ``timeout_s`` wall seconds)."""
        room = self._room(key)
        try:
            return await asyncio.wait_for(asyncio.shield(room), timeout_s)
        finally:
            self._rooms.pop(key, None)


# The fields a decode engine needs to read a prefill's KV: vllm 0.33.0 wheel,
# vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py update_state_after_alloc (the
# request "will not utilize KVTransfer" unless all are present) and nixl/metadata.py add_new_req_to_recv.
NIXL_REMOTE_FIELDS = (
    "remote_block_ids",
    "remote_engine_id",
    "remote_request_id",
    "remote_host",
    "remote_port",
)


def _block_groups(value: Any) -> BlockIds | None:
    """``remote_block_ids`` as groups: vLLM 0.33 sends one list per KV cache group ([[0, 1, 2]]); a flat
    list of ints (older vLLM) is one group. None when it is neither."""
    if not isinstance(value, list | tuple):
        return None
    if all(isinstance(b, int) and not isinstance(b, bool) for b in value):
        return (tuple(value),)
    groups: list[tuple[int, ...]] = []
    for group in value:
        if not isinstance(group, list | tuple) or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in group
        ):
            return None
        groups.append(tuple(group))
    return tuple(groups)


def parse_kv_transfer_params(params: Any) -> KvTransfer:
    """What a request's ``kv_transfer_params`` ask for; RequestError when they are not an object.

    Field names are vLLM's NixlConnector (vllm 0.33.0 wheel, vllm/distributed/kv_transfer/kv_connector/v1/
    nixl/pull_scheduler.py ``get_num_new_matched_tokens``, ``update_state_after_alloc`` and
    ``request_finished``). A ``do_remote_prefill`` request whose remote fields are missing or unusable is
    not refused: vLLM logs "Got invalid KVTransferParams" and the KV never arrives, a KV load failure that
    ``kv_load_failure_policy`` resolves; ``invalid`` says which field is at fault.
    """
    if params is None:
        return KvTransfer(False, None)
    if not isinstance(params, Mapping):
        raise RequestError("kv_transfer_params", "must be an object")
    remote_decode = bool(params.get("do_remote_decode", False))
    if not params.get("do_remote_prefill", False):
        return KvTransfer(remote_decode, None)
    if remote_decode:
        raise RequestError("kv_transfer_params", "do_remote_prefill and do_remote_decode are exclusive")
    for name in NIXL_REMOTE_FIELDS:
        if params.get(name) is None:
            return KvTransfer(False, None, f"kv_transfer_params.{name}: required with do_remote_prefill")
    blocks = _block_groups(params["remote_block_ids"])
    if blocks is None:
        return KvTransfer(False, None, "kv_transfer_params.remote_block_ids: must be lists of block ids")
    engine_id, host, port = params["remote_engine_id"], params["remote_host"], params["remote_port"]
    if not isinstance(engine_id, str) or not engine_id:
        return KvTransfer(False, None, "kv_transfer_params.remote_engine_id: must be an engine id")
    if not isinstance(host, str) or not host:
        return KvTransfer(False, None, "kv_transfer_params.remote_host: must be a host")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return KvTransfer(False, None, "kv_transfer_params.remote_port: must be a TCP port")
    tp_size = params.get("tp_size", 1)
    tp = tp_size if isinstance(tp_size, int) and not isinstance(tp_size, bool) and tp_size > 0 else 1
    remote = RemotePrefill(engine_id, blocks, host, port, str(params["remote_request_id"]), tp)
    return KvTransfer(False, remote)
