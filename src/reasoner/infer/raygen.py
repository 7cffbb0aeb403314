"""Generation on a Ray cluster: `ray.workers` actors, each holding one engine (hf or vllm).

The driver (the `reasoner infer` / `eval` / `verify` process) keeps the whole protocol of a
generator: it hands out chunks of `ray.chunk` requests to whichever actor is free, and each
actor streams every completion back as its engine finishes it (a Ray streaming generator), so
the engine refills itself as requests end and nothing waits for a chunk's longest answer. infer
and the judge write the same shards as in one process, resumable the same way, and only the
driver touches the output folder (no shared file system needed; the model must be loadable on
every node: an HF id or a shared path). Samples do not depend on which actor drew them: every
request carries its own seed. Actors reserve the cluster's accelerators: GPUs, or Ascend NPUs
(Ray's `NPU` resource), `vllm.tensor_parallel_size` each.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from reasoner.config import ModelConfig, RayConfig, SamplingConfig, VLLMConfig
from reasoner.errors import DependencyError
from reasoner.infer.base import Completion, Request, Streaming


class EngineActor:
    """One engine on one Ray actor (wrapped by `ray.remote` at run time)."""

    def __init__(self, build: dict, threads: int):
        import torch

        from reasoner.infer.engines import local_generator

        torch.set_num_threads(threads)  # the CPUs Ray gave this actor, not the whole node's
        self.gen = local_generator(**build)

    def context_window(self) -> int:
        return self.gen.context_window

    def engine_info(self) -> dict[str, str]:
        return self.gen.engine_info()

    def stream(self, requests: list[Request], sampling: SamplingConfig
               ) -> Iterator[tuple[int, Completion]]:
        """Each completion as the engine finishes it (called as a Ray streaming generator)."""
        yield from self.gen.stream(requests, sampling)


def accelerators(ray: Any, per_worker: float | None, tp: int) -> dict[str, Any]:
    """What each actor reserves: GPUs (`num_gpus`), Ascend NPUs (Ray's `NPU` resource, whose
    actors then see only their own devices), or nothing on CPUs."""
    from reasoner import device as dev

    found = ray.cluster_resources()
    if found.get("GPU", 0) > 0 or dev.cuda_available():
        return {"num_gpus": tp if per_worker is None else per_worker}
    if found.get("NPU", 0) > 0:
        return {"resources": {"NPU": tp if per_worker is None else per_worker}}
    return {"num_gpus": per_worker or 0}


def ray_address(address: str | None) -> str:
    """What `ray.init` joins: the config's address, else RAY_ADDRESS (what `reasoner run
    --launcher slurm` sets), else a fresh local cluster ("local"). Ray's own default (None)
    joins whichever cluster was last started on the machine, found in /tmp/ray: a run would
    join another job's cluster and hang in `ray.init` when that job took it down."""
    return address or os.environ.get("RAY_ADDRESS") or "local"


class RayGenerator(Streaming):
    name = "ray"

    def __init__(self, cfg: RayConfig, model: ModelConfig, backend: str, engine: VLLMConfig,
                 max_model_len: int | None, seed: int, logprobs: bool, batch_size: int):
        try:
            import ray
        except ImportError as exc:
            raise DependencyError("ray.workers needs Ray: pip install 'reasoner[ray]'") from exc
        from reasoner.models import load_tokenizer

        self.ray, self.cfg = ray, cfg
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            ray.init(address=ray_address(cfg.address), include_dashboard=False,
                     log_to_driver=False)
        build = {"model": model, "backend": backend,  # resolved on the actor, by its devices
                 "engine": engine, "max_model_len": max_model_len, "seed": seed,
                 "logprobs": logprobs, "batch_size": batch_size}
        actor = ray.remote(EngineActor).options(
            num_cpus=cfg.cpus_per_worker,
            **accelerators(ray, cfg.gpus_per_worker, engine.tensor_parallel_size))
        self.actors = [actor.remote(build, max(1, int(cfg.cpus_per_worker)))
                       for _ in range(cfg.workers)]
        windows = ray.get([a.context_window.remote() for a in self.actors])  # engines are up
        self.context_window = int(windows[0])
        self.tokenizer = load_tokenizer(model.name_or_path, model.trust_remote_code)
        self.preferred_batch = cfg.chunk * cfg.workers

    def engine_info(self) -> dict[str, str]:
        """The first actor's engine (all are built alike), and how many there are."""
        info = self.ray.get(self.actors[0].engine_info.remote())
        return {**info, "ray_workers": str(len(self.actors))}

    def stream(self, requests: list[Request], sampling: SamplingConfig
               ) -> Iterator[tuple[int, Completion]]:
        """Chunks to free actors; every completion yielded as its actor's engine finishes it."""
        chunks = iter(range(0, len(requests), self.cfg.chunk))
        pending: dict[Any, tuple[Any, int]] = {}  # streaming generator -> (actor, chunk start)

        def submit(actor: Any) -> None:
            start = next(chunks, None)
            if start is not None:
                batch = requests[start:start + self.cfg.chunk]
                call = actor.stream.options(num_returns="streaming").remote(batch, sampling)
                pending[call] = (actor, start)

        for actor in self.actors:
            submit(actor)
        while pending:
            (call,), _ = self.ray.wait(list(pending), num_returns=1)
            actor, start = pending[call]
            try:
                ref = next(call)
            except StopIteration:  # this chunk is done: the actor takes the next one
                del pending[call]
                submit(actor)
                continue
            k, completion = self.ray.get(ref)
            yield start + k, completion

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
        if self.started_ray:
            self.ray.shutdown()
