"""A stand-in for the vLLM server that TRL 1.16.0's `VLLMClient` talks to, for tests without a GPU.

vLLM cannot run here (it needs CUDA), so the weight sync from a trainer to `vllm serve` is tested against this:

- an HTTP server on 127.0.0.1 with the routes the client calls (`ROUTES`; checked against the wheels of vLLM
  0.22-0.31 by `tests/build/test_vllm_contract.py`), in a process of its own, taking the bodies vLLM's OpenAI server
  takes with its development endpoints and `--weight-transfer-config '{"backend": "nccl"}'` and answering what the
  client reads. It is stricter than vLLM in one place: `init_info` / `update_info` must carry exactly the release's
  keys, with `packed` true (vLLM ignores unknown keys and accepts unpacked transfers);
- a fake `vllm` package (`write_fake_vllm`), put on the trainer's `sys.path`, with the few functions the client
  imports (`get_ip`, the trainer side of the weight-transfer group, the broadcast of the weights) and a
  `vllm-<version>.dist-info`, so that `trl` takes the code paths of that vLLM release. The NCCL group between trainer
  and workers is a gloo group between the trainer and the stand-in (rank 0 hosts the store, as in vLLM), and the
  weights are broadcast in the order and with the names, dtypes and shapes the client announced.

What the client sends is recorded: `RECORD/update-<n>.pt` holds the tensors of the n-th `/update_weights` by name
(on the CPU), `RECORD/requests.jsonl` every request (method, path, JSON body without tensors). Nothing of vLLM is
imported or copied; the stand-in is written from the client's side of the contract.

    python vllm_standin.py --port 0 --record DIR --version 0.31.0   # prints "listening on <port>"
"""

import argparse
import json
import sys
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse


ROUTES = frozenset(
    {
        ("GET", "/health"),
        ("GET", "/v1/models"),
        ("GET", "/server_info"),
        ("GET", "/get_world_size"),
        ("POST", "/init_weight_transfer_engine"),
        ("POST", "/start_weight_update"),
        ("POST", "/update_weights"),
        ("POST", "/finish_weight_update"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/v1/completions"),
    }
)
# The keys of `init_info` and `update_info` the stand-in accepts on the newest protocol (vLLM >= 0.28: `packed` moved
# from the update to the init info)
INIT_INFO_KEYS = frozenset({"master_address", "master_port", "rank_offset", "world_size", "packed"})
UPDATE_INFO_KEYS = frozenset({"names", "dtype_names", "shapes"})
MODEL_ID = "standin/tiny-model"
GROUP_TIMEOUT = timedelta(seconds=60)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


class _Group:
    """One side of the weight-transfer group: a gloo group over a TCP store hosted by the trainer (rank 0)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int):
        import torch.distributed as dist

        self.store = dist.TCPStore(
            host, port, world_size, is_master=rank == 0, timeout=GROUP_TIMEOUT, wait_for_workers=False
        )
        self.socket = None  # what `VLLMClient.close_communicator` clears
        self.rank, self.world_size = rank, world_size
        self.pg = dist.ProcessGroupGloo(self.store, rank, world_size, GROUP_TIMEOUT)

    def broadcast(self, tensor, src: int = 0):
        self.pg.broadcast(tensor, src).wait()


# ----------------------------------------------------------------------------------------------- the server


class StandInServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, record: Path, version: str):
        super().__init__(("127.0.0.1", port), _Handler)
        self.record, self.version = record, _version_tuple(version)
        self.group = None
        self.updates = 0
        self.lock = threading.Lock()
        record.mkdir(parents=True, exist_ok=True)

    def log(self, method: str, path: str, body):
        with self.lock, open(self.record / "requests.jsonl", "a") as log:
            log.write(json.dumps({"method": method, "path": path, "body": body}) + "\n")


class _Refused(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class _Handler(BaseHTTPRequestHandler):
    server: StandInServer

    def log_message(self, *args):  # quiet
        pass

    def _answer(self, status: int, payload=None):
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, method: str):
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.log(method, url.path, body)
        if (method, url.path) not in ROUTES:
            return self._answer(404, {"detail": "Not Found"})
        try:
            handler = getattr(self, "_" + url.path.strip("/").replace("/", "_"))
            status, payload = handler(body, parse_qs(url.query))
        except _Refused as refused:
            status, payload = refused.status, {"detail": refused.detail}
        except Exception as exc:  # a bug of the stand-in or a broken transfer: as vLLM, a 500 with the error
            status, payload = 500, {"detail": f"{type(exc).__name__}: {exc}"}
        self._answer(status, payload)

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    # The routes -------------------------------------------------------------------------------------------

    def _health(self, body, query):
        return 200, None

    def _v1_models(self, body, query):
        return 200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}

    def _server_info(self, body, query):
        if query.get("config_format", ["text"]) != ["json"]:
            raise _Refused(400, "the client asks for config_format=json")
        return 200, {"vllm_config": {"weight_transfer_config": {"backend": "nccl"}}}

    def _get_world_size(self, body, query):
        return 200, {"world_size": 1}

    def _init_weight_transfer_engine(self, body, query):
        info = _require(body, "init_info")
        keys = {"master_address", "master_port", "rank_offset", "world_size"}
        if self.server.version >= (0, 28, 0):
            keys.add("packed")
            _require_packed(info, "init_info")
        _exact_keys(info, keys, "init_info")
        # The workers join after the trainer's rank 0: the stand-in is the one worker
        self.server.group = _Group(
            info["master_address"], info["master_port"], info["rank_offset"], info["world_size"]
        )
        return 200, {}

    def _start_weight_update(self, body, query):
        if body is None and self.server.version < (0, 25, 0):
            raise _Refused(400, "Invalid JSON format")
        return 200, {}

    def _update_weights(self, body, query):
        import torch

        info = _require(body, "update_info")
        keys = set(UPDATE_INFO_KEYS)
        if self.server.version < (0, 28, 0):
            keys.add("packed")
            _require_packed(info, "update_info")
        _exact_keys(info, keys, "update_info")
        if self.server.group is None:
            raise _Refused(400, "the weight-transfer engine is not initialized")
        if not len(info["names"]) == len(info["dtype_names"]) == len(info["shapes"]):
            raise _Refused(400, "names, dtype_names and shapes differ in length")
        received = {}
        for name, dtype_name, shape in zip(info["names"], info["dtype_names"], info["shapes"]):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype_name))
            self.server.group.broadcast(tensor, src=0)
            received[name] = tensor
        with self.server.lock:
            self.server.updates += 1
            torch.save(received, self.server.record / f"update-{self.server.updates}.pt")
        return 200, {}

    def _finish_weight_update(self, body, query):
        return 200, {}

    def _reset_prefix_cache(self, body, query):
        return 200, ({"success": True} if self.server.version >= (0, 26, 0) else None)

    def _v1_completions(self, body, query):
        prompts = _require(body, "prompt")
        prompts = prompts if isinstance(prompts, list) and prompts and isinstance(prompts[0], list) else [prompts]
        n, max_tokens = body.get("n", 1), body.get("max_tokens", 16)
        choices = []
        for prompt in prompts:
            prompt_ids = prompt if isinstance(prompt, list) else [1] * len(str(prompt).split())
            for index in range(n):
                # Deterministic completions of small ids (any tokenizer has them), distinct per sample
                token_ids = [2 + (len(prompt_ids) + index + step) % 8 for step in range(max_tokens)]
                logprobs = None
                if body.get("logprobs") is not None:
                    logprobs = {
                        "tokens": [f"token_id:{token}" for token in token_ids],
                        "token_logprobs": [-1.0] * len(token_ids),
                        "top_logprobs": [None] * len(token_ids),
                    }
                choices.append(
                    {"index": len(choices), "text": "", "prompt_token_ids": prompt_ids, "token_ids": token_ids,
                     "logprobs": logprobs, "finish_reason": "length"}
                )  # fmt: skip
        return 200, {"id": "cmpl-standin", "object": "text_completion", "model": MODEL_ID, "choices": choices}


def _require(body, key):
    if not isinstance(body, dict) or key not in body:
        raise _Refused(400, f"field required: {key}")
    return body[key]


def _exact_keys(info, keys, what):
    if not isinstance(info, dict) or set(info) != keys:
        raise _Refused(400, f"{what} has keys {sorted(info or {})}, expected {sorted(keys)}")


def _require_packed(info, what):
    # The fake broadcast sends tensor by tensor; the client must still ask for vLLM's packed transfer
    if isinstance(info, dict) and info.get("packed") is not True:
        raise _Refused(400, f"{what}: the client always asks for packed transfers")


# --------------------------------------------------------------------------------------- the fake vllm package

_FAKE_MODULES = {
    "vllm/__init__.py": '''\
"""A stand-in for vLLM {version} (trl-fork tests): only what TRL's server client imports."""

__version__ = "{version}"


class _Unavailable:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the vLLM stand-in only serves the client of `vllm serve`")


LLM = RequestOutput = SamplingParams = _Unavailable
''',
    "vllm/sampling_params.py": "from vllm import _Unavailable as StructuredOutputsParams  # noqa: F401\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/network_utils.py": "def get_ip():\n    return '127.0.0.1'\n",
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/weight_transfer/__init__.py": "",
    "vllm/distributed/weight_transfer/nccl_common.py": """\
from types import SimpleNamespace

from vllm_standin import _Group


def trainer_init(init_info):
    # The trainer is rank 0 of the group and hosts its store, as in vLLM
    group = _Group(init_info["master_address"], init_info["master_port"], 0, init_info["world_size"])
    return SimpleNamespace(group=group, broadcast=group.broadcast)
""",
    "vllm/distributed/weight_transfer/packed_tensor.py": """\
def packed_nccl_broadcast_producer(iterator, group, src, post_iter_func):
    for item in iterator:
        group.broadcast(post_iter_func(item).detach().contiguous(), src=src)
""",
    "vllm/distributed/weight_transfer/nccl_engine.py": """\
from dataclasses import dataclass
from typing import Any

from vllm.distributed.weight_transfer.nccl_common import trainer_init as _trainer_init


@dataclass
class NCCLTrainerSendWeightsArgs:
    group: Any
    packed: bool = False


class NCCLWeightTransferEngine:
    @staticmethod
    def trainer_init(init_info):
        return _trainer_init(init_info)

    @staticmethod
    def trainer_send_weights(iterator, trainer_args):
        for _, tensor in iterator:
            trainer_args.group.broadcast(tensor.detach().contiguous(), src=0)
""",
}


def write_fake_vllm(root: Path, version: str) -> Path:
    """Writes the fake `vllm` package of release `version` (and its dist-info) under `root`; put `root` on the path."""
    root = Path(root)
    for relative, text in _FAKE_MODULES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{version}", version))
    dist_info = root / f"vllm-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (root / "vllm_standin.py").write_text(Path(__file__).read_text())  # `_Group`, for the trainer side
    return root


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--version", default="0.31.0")
    args = parser.parse_args(argv)
    server = StandInServer(args.port, args.record, args.version)
    print(f"listening on {server.server_address[1]}", flush=True)  # noqa: T201 (the test reads the port)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
