"""The 1.16.0 line's vLLM server mode end to end, without a GPU: the real `VLLMClient` against the stand-in server.

`vllm_standin.py` serves, on 127.0.0.1 in a process of its own, the routes the client calls (checked against vLLM
0.22-0.31 by `build/test_vllm_contract.py`), and a fake `vllm` package of a given release makes `trl` take that
release's code paths (the weight-transfer protocol changed in 0.28, the cache reset's answer in 0.26). The weights go
over a gloo group instead of NCCL, in the order and under the names, dtypes and shapes the client announced; the
stand-in records what arrives. Each check runs in a fresh interpreter (the fake `vllm` on its path) launched from
here:

- `client`: the client alone: connect, weight-transfer engine, the whole model in one update, a grouped update of two
  tensors, the cache reset, a generation, close. Every tensor arrives equal to what was sent.
- `sync`: `VLLMGeneration`, as GRPO and RLOO use it, on 2 gloo ranks under no sharding, FSDP1, FSDP2 and ZeRO-3 with a
  LoRA policy: from the freshly wrapped model, the first sync delivers every weight of the checkpoint under its
  checkpoint name, equal to the model's full weights (base + merged adapter for LoRA); generation goes through the
  server; after every parameter changed through its own shard, a second sync delivers the changed weights; the
  requests come in the order vLLM expects. A start once more (after a gloo abort) checks only its own requests and
  updates.
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest


HERE = Path(__file__).resolve().parent
LINE = HERE.parent
TREE = LINE / "trl-src"  # its `tests` package holds the patches' test helpers
RELEASES = ["0.25.1", "0.27.1", "0.31.0"]  # before the 0.26 cache-reset answer, before the 0.28 protocol, newest
START_TIMEOUT = 150  # one start of the 2 ranks of a sync check
SYNC_TIMEOUT = 2 * START_TIMEOUT + 60  # a start once more (gloo aborted a process) included


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def standin(tmp_path, request):
    """Starts the stand-in for the release `request.param`; yields (base URL, record folder, fake vllm folder)."""
    import vllm_standin

    version = request.param
    record, fake = tmp_path / "record", vllm_standin.write_fake_vllm(tmp_path / f"vllm-{version}", version)
    server = subprocess.Popen(
        [sys.executable, str(HERE / "vllm_standin.py"), "--port", "0", "--record", str(record), "--version", version],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([server.stdout], [], [], 60)
        line = server.stdout.readline() if ready else "no answer within 60 s"
        assert line.startswith("listening on "), line
        yield f"http://127.0.0.1:{int(line.split()[-1])}", record, fake
    finally:
        server.kill()
        server.wait()


def _run(check, base_url, record, fake, *args, timeout=300):
    path = [str(fake), str(TREE), str(HERE), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), HF_HUB_OFFLINE="1", ACCELERATE_USE_CPU="true"
    )
    # A session of its own: on a timeout, the ranks it spawned are killed with it
    process = subprocess.Popen(
        [sys.executable, __file__, check, base_url, str(record), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{check} took over {timeout} s:\n{stderr[-6000:]}") from None
    assert process.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return stderr


def _requests(record):
    return [json.loads(line) for line in (record / "requests.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("standin", RELEASES, indirect=True)
def test_client_against_the_standin(standin):
    base_url, record, fake = standin
    _run("client", base_url, record, fake)
    paths = [entry["path"] for entry in _requests(record) if entry["path"] != "/health"]
    assert paths == [
        "/v1/models",
        "/server_info",
        "/get_world_size",
        "/init_weight_transfer_engine",
        "/start_weight_update",  # the whole model: one update
        "/update_weights",
        "/finish_weight_update",
        "/start_weight_update",  # `weight_update()`: two tensors, one start and one finish
        "/update_weights",
        "/update_weights",
        "/finish_weight_update",
        "/reset_prefix_cache",
        "/v1/completions",
    ], paths


def _assert_requests_of_one_sync_check(record):
    """The requests of one `check_sync`, in the order vLLM expects: connect, a sync, a generation, a sync."""
    paths = [entry["path"] for entry in _requests(record) if entry["path"] != "/health"]
    sync = ["/start_weight_update", "/update_weights", "/finish_weight_update", "/reset_prefix_cache"]
    setup = ["/v1/models", "/server_info", "/get_world_size", "/init_weight_transfer_engine"]
    assert paths == setup + sync + ["/v1/completions"] + sync, paths


@pytest.mark.parametrize("standin", ["0.31.0"], indirect=True)
@pytest.mark.parametrize("backend", ["ddp", "fsdp1", "fsdp2", "zero3"])
def test_sync_and_generation_against_the_standin(standin, backend):
    base_url, record, fake = standin
    _run("sync", base_url, record, fake, backend, timeout=SYNC_TIMEOUT)
    _assert_requests_of_one_sync_check(record)


@pytest.mark.parametrize("standin", ["0.31.0"], indirect=True)
def test_a_start_once_more_checks_only_its_own_requests(standin):
    """After a complete sync check, process 1 aborts as gloo was seen to at teardown, and `run_distributed` starts the
    check once more against the same stand-in, which holds the first start's requests and updates (emptied, so that a
    second start reading them fails). The second start checks only its own."""
    base_url, record, fake = standin
    stderr = _run("sync-aborted-once", base_url, record, fake, "ddp", timeout=SYNC_TIMEOUT)
    assert "check_sync_aborted_once: process 1 terminated with signal SIGABRT; starting it once more" in stderr, stderr
    assert len(list(record.glob("update-*.pt"))) == 4
    _assert_requests_of_one_sync_check(record)


@pytest.mark.parametrize("standin", ["0.31.0"], indirect=True)
def test_the_standin_refuses_what_the_client_must_not_send(standin):
    """An unknown route is a 404; keys other than the release's, an unpacked transfer, or an update before the engine
    exists are a 400."""
    import requests

    base_url, record, _ = standin
    assert requests.post(f"{base_url}/update_weight", json={}, timeout=10).status_code == 404
    answer = requests.post(f"{base_url}/update_weights", json={"update_info": {}}, timeout=10)
    assert answer.status_code == 400 and "expected" in answer.json()["detail"], answer.text
    init_info = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2, "packed": False}
    answer = requests.post(f"{base_url}/init_weight_transfer_engine", json={"init_info": init_info}, timeout=10)
    assert answer.status_code == 400 and "packed" in answer.json()["detail"], answer.text
    info = {"names": [], "dtype_names": [], "shapes": []}
    answer = requests.post(f"{base_url}/update_weights", json={"update_info": info}, timeout=10)
    assert answer.status_code == 400 and "not initialized" in answer.json()["detail"], answer.text


# ------------------------------------------------------------------------- run in a fresh interpreter (above)


def _force_cuda_device(client_class):
    """vLLM's NCCL engine needs CUDA, which the client checks; the stand-in's group is gloo. `cuda` without an index
    passes the check without any CUDA call."""
    init_communicator = client_class.init_communicator

    def on_the_standin(self, device=0):
        return init_communicator(self, device="cuda")

    client_class.init_communicator = on_the_standin


def check_client(base_url, record):
    import torch

    from tests.test_prepare_fsdp import make_model
    from trl.generation import vllm_client

    assert vllm_client.is_vllm_available()
    _force_cuda_device(vllm_client.VLLMClient)
    client = vllm_client.VLLMClient(base_url=base_url, group_port=_free_port(), connection_timeout=30)
    client.init_communicator()
    model = make_model()
    client.update_model_params(model)
    received = torch.load(record / "update-1.pt")
    expected = dict(model.named_parameters())
    assert list(received) == list(expected), (list(received), list(expected))
    for name, tensor in received.items():
        assert torch.equal(tensor, expected[name]), name
    with client.weight_update():
        client.update_named_param("a", torch.arange(6.0).reshape(2, 3))
        client.update_named_param("b", torch.ones(4, dtype=torch.bfloat16))
    assert torch.equal(torch.load(record / "update-2.pt")["a"], torch.arange(6.0).reshape(2, 3))
    b = torch.load(record / "update-3.pt")["b"]
    assert b.dtype == torch.bfloat16 and torch.equal(b, torch.ones(4, dtype=torch.bfloat16))
    client.reset_prefix_cache()
    output = client.generate([[5, 6, 7], [8, 9]], n=2, max_tokens=3, logprobs=0)
    assert output["prompt_ids"] == [[5, 6, 7], [8, 9]], output
    assert [len(ids) for ids in output["completion_ids"]] == [3] * 4, output
    assert [[len(position) for position in sample] for sample in output["logprobs"]] == [[1] * 3] * 4, output
    client.close_communicator()


def _expected_weights(backend, shift=0.0):
    """The model's full weights as a checkpoint names them (LoRA merged), each parameter shifted by `shift`: what vLLM
    must receive."""
    import torch

    from tests.test_prepare_fsdp import make_model
    from tests.test_vllm_peft_sync_per_unit import make_peft_model

    model = make_peft_model() if backend == "zero3" else make_model()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(shift)
    return model.merge_and_unload().state_dict() if backend == "zero3" else model.state_dict()


def _shift_local_parameters(model, shift):
    """Adds `shift` to every parameter of the wrapped `model`, through each process's own shard (as an optimizer step
    changes them)."""
    import torch

    with torch.no_grad():
        for param in model.parameters():
            if hasattr(param, "ds_tensor"):  # ZeRO-3: this process's partition
                param.ds_tensor.add_(shift)
            elif hasattr(param, "to_local"):  # FSDP2: this process's shard of the DTensor
                param.to_local().add_(shift)
            else:  # FSDP1's flat shard, or a whole parameter
                param.add_(shift)


def check_sync(backend, base_url, record):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from tests.test_vllm_failures_on_every_process import make_generation
    from trl.generation import vllm_client

    # A process left waiting in a collective fails after 60 s instead of hanging
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    _force_cuda_device(vllm_client.VLLMClient)
    generation = make_generation(backend)
    rank = dist.get_rank()
    # The port of the weight-transfer group, which only the main process opens: picked here, once gloo holds its own
    # ports (picked by the launching process, it was once taken by this run's rendezvous or gloo: EADDRINUSE)
    group_port = _free_port() if rank == 0 else 0
    generation.server_base_url, generation.group_port, generation.server_timeout = base_url, group_port, 30.0
    if rank == 0:
        # `run_distributed` starts the run once more when gloo aborts a process (seen at teardown, after a complete
        # run): what the stand-in recorded before this start belongs to the earlier one
        earlier_updates = len(list(record.glob("update-*.pt")))
        (record / "requests.jsonl").unlink(missing_ok=True)
    generation._init_vllm()  # the main process connects; the others wait for its outcome

    generation.sync_weights()  # the first sync of the freshly wrapped model
    prompts = [[1, 2, 3], [1, 2, 3]] if rank == 0 else [[4, 5], [4, 5]]
    completions = generation.generate(prompts, None, 2)
    assert completions[0] == prompts, completions
    _shift_local_parameters(generation.model, 0.5)  # what the second sync must send: the changed weights
    generation.sync_weights()
    dist.barrier()
    if rank != 0:
        return
    config = generation.model.config
    # A tied output head is sent once, as its embedding
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    for update, shift in ((earlier_updates + 1, 0.0), (earlier_updates + 2, 0.5)):
        expected = _expected_weights(backend, shift)
        received = torch.load(record / f"update-{update}.pt")
        assert set(expected) - set(received) == allowed_missing, sorted(set(expected) - set(received))
        assert set(received) <= set(expected), sorted(set(received) - set(expected))
        for name, tensor in received.items():
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-5, msg=name)


def check_sync_aborted_once(backend, base_url, record):
    """`check_sync`; then, at its first start, the first start's updates are emptied and process 1 aborts (SIGABRT,
    as gloo was seen to at teardown), so that `run_distributed` starts it once more against the same stand-in."""
    import torch
    import torch.distributed as dist

    check_sync(backend, base_url, record)
    marker = record / "aborted-once"
    first = not marker.exists()
    if first and dist.get_rank() == 0:
        for path in record.glob("update-*.pt"):
            torch.save({}, path)
    dist.barrier()
    if first:
        if dist.get_rank() == 1:
            marker.touch()
            os.abort()
        os._exit(0)  # process 0: no teardown barrier with a process that is gone


def _main():
    check, base_url, record, *args = sys.argv[1:]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if check == "client":
        check_client(base_url, Path(record))
    else:
        from tests.test_prepare_fsdp import run_distributed

        check_fn = check_sync_aborted_once if check == "sync-aborted-once" else check_sync
        run_distributed(check_fn, args[0], base_url, Path(record), timeout=START_TIMEOUT)


if __name__ == "__main__":
    _main()
