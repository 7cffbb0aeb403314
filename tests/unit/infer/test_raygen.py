"""The Ray path's protocol against a stand-in `ray` (in this process): what each actor
reserves on a GPU, an Ascend or a CPU cluster, and that completions stream back as the engine
finishes them instead of a chunk at a time."""

import sys
import types

import pytest

from reasoner.config import ModelConfig, RayConfig, SamplingConfig, VLLMConfig
from reasoner.infer import raygen
from reasoner.infer.base import Completion, Request

RECEIVED: list[int] = []  # what the driver has yielded so far


class FakeEngine:
    """Finishes its requests one by one; each time, the driver must already hold the previous
    one (streamed), not wait for the whole chunk."""

    tokenizer, context_window = None, 128

    def stream(self, requests, sampling):
        for k, r in enumerate(requests):
            if k:  # the completion before this one has reached the driver already
                assert RECEIVED and RECEIVED[-1] == requests[k - 1].sample_idx, RECEIVED
            yield k, Completion([1], f"done {r.sample_idx}", "stop")


class FakeRay(types.ModuleType):
    """`ray` as the driver uses it, synchronously: actors built here, streaming calls are
    Python generators, `wait` returns the first one."""

    def __init__(self, resources):
        super().__init__("ray")
        self.resources, self.options_seen = resources, {}

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return self.resources

    def remote(self, cls):
        fake = self

        class Handle:
            def options(self, **kw):
                fake.options_seen = kw
                return self

            def remote(self, build, threads):
                instance = cls.__new__(cls)
                instance.gen = FakeEngine()
                return Actor(instance)

        return Handle()

    def wait(self, refs, num_returns):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return [a.context_window for a in ref] if isinstance(ref, list) else ref

    def kill(self, actor):
        pass


class Actor:
    def __init__(self, instance):
        self.instance = instance
        self.context_window = types.SimpleNamespace(remote=lambda: 128)
        self.stream = types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(
            remote=lambda batch, sampling: iter(instance.stream(batch, sampling))))


@pytest.fixture
def fake_ray(monkeypatch):
    from reasoner import device as dev
    from reasoner import models

    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    monkeypatch.setattr(models, "load_tokenizer", lambda *a: None)

    def install(resources):
        fake = FakeRay(resources)
        monkeypatch.setitem(sys.modules, "ray", fake)
        monkeypatch.setattr(fake, "get", lambda ref: [128] if isinstance(ref, list) else ref)
        return fake

    return install


def generator(workers=1, chunk=4, tp=2):
    return raygen.RayGenerator(RayConfig(workers=workers, chunk=chunk), ModelConfig(
        name_or_path="m"), "hf", VLLMConfig(tensor_parallel_size=tp), None, 0, False, 8)


@pytest.mark.parametrize("resources, reserved", [
    ({"CPU": 16, "GPU": 8}, {"num_gpus": 2}),
    ({"CPU": 16, "NPU": 16}, {"resources": {"NPU": 2}}),  # Ascend: Ray names them NPU
    ({"CPU": 16}, {"num_gpus": 0}),
])
def test_each_actor_reserves_the_clusters_accelerators(fake_ray, resources, reserved):
    """Actors reserved GPUs only: on Ascend they reserved nothing, several landed on one node
    and each engine opened devices 0..tp-1."""
    fake = fake_ray(resources)
    generator()
    assert fake.options_seen == {"num_cpus": 1.0, **reserved}


def test_completions_stream_back_as_the_engine_finishes_them(fake_ray):
    fake_ray({"CPU": 4})
    RECEIVED.clear()
    gen = generator(chunk=5)
    requests = [Request("p", k, [1, 2], k, 4) for k in range(12)]
    out = []
    for index, completion in gen.stream(requests, SamplingConfig()):
        RECEIVED.append(requests[index].sample_idx)
        out.append((index, completion.text))
    assert out == [(k, f"done {k}") for k in range(12)]


def test_a_run_without_an_address_starts_its_own_cluster(monkeypatch):
    """Ray's default address (None) joins the cluster last started on the machine (found in
    /tmp/ray): a stage without `ray.address` joined another job's cluster and hung in
    `ray.init` for good when that job took it down (seen in CI). Now: the config's address,
    else RAY_ADDRESS (the Slurm launcher's), else a fresh local cluster."""
    ray_address = raygen.ray_address
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None) == "local"
    assert ray_address("auto") == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert ray_address(None) == "10.0.0.1:6379"
    assert ray_address("10.0.0.2:6379") == "10.0.0.2:6379"
