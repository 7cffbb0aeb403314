"""What a rehearsal (pipeline/rehearsal.py) measures with: torch's FSDPMemTracker, also saying
where its peak was and able to pause, and a dispatch mode adding up each collective's bytes."""

from __future__ import annotations

from typing import Any


def _tracker_class(base: type) -> type:
    class Tracker(base):
        """torch's memory tracker (`base`), also saying where its peak was: the phase (forward,
        backward, optimiser) and the innermost module running; `paused`, it counts nothing."""

        where = ""
        paused = False
        module: Any = None
        elsewhere: frozenset = frozenset()  # storages counted on their own (`hold_apart`)

        def _track(self, reftype: Any, t: Any) -> None:
            if self.paused or (self.elsewhere and t.untyped_storage()._cdata in self.elsewhere):
                return
            super()._track(reftype, t)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            if self.paused:  # nothing counted, nothing of its bookkeeping either
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def __enter__(self) -> Any:
            # DTensor's sharding propagation runs each new op on fake tensors of the whole
            # (unsharded) size, under the rehearsal's own fake mode: shapes, not memory (a
            # vocab-parallel matrix's AdamW state would count 8x at 8 processes). Paused there.
            from torch.distributed.tensor._sharding_prop import ShardingPropagator

            real = ShardingPropagator._propagate_tensor_meta_non_cached
            tracker = self

            def propagate(prop: Any, *args: Any, **kwargs: Any) -> Any:
                was, tracker.paused = tracker.paused, True
                try:
                    return real(prop, *args, **kwargs)
                finally:
                    tracker.paused = was

            ShardingPropagator._propagate_tensor_meta_non_cached = propagate
            entered = super().__enter__()
            self._unpatch = [lambda: setattr(ShardingPropagator,
                                             "_propagate_tensor_meta_non_cached", real),
                             self._vocab_parallel()]
            return entered

        def __exit__(self, *exc: Any) -> None:
            try:
                super().__exit__(*exc)
            finally:
                for undo in self._unpatch:
                    undo()

        def _vocab_parallel(self) -> Any:
            """A vocab-parallel embedding and lm-head's rows (`models.vocab_parallel`: DTensors
            FSDP2 ignores, so its tracker neither) counted as shards, and their gradient too,
            from when backward makes it (an FSDP2 unit's is counted so); returns the undo."""
            from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

            from reasoner.models import vocab_parallel

            if self.module is None or not hasattr(self, "_fsdp_state"):
                return lambda: None
            for p in vocab_parallel.parameters(self.module):
                self._update_and_maybe_create_winfos(p, _FSDPRefType.SHARDED_PARAM)
            real = vocab_parallel._accumulator

            def accumulator(param: Any) -> Any:
                new = param.grad is None
                out = real(param)
                if new and not self.paused:
                    self._update_and_maybe_create_winfos(out, _FSDPRefType.SHARDED_GRAD)
                return out

            vocab_parallel._accumulator = accumulator
            return lambda: setattr(vocab_parallel, "_accumulator", real)

        def hold_apart(self, module: Any) -> float:
            """Leave `module`'s parameters and buffers out of every count (a model beside the
            one tracked: its storages, seen as the output of an in-place op or a view, would
            otherwise be counted as new memory of the moment); return their bytes."""
            storages = _storages(module)
            self.elsewhere = self.elsewhere | {st._cdata for st in storages}
            return float(sum(st.nbytes() for st in storages))

        def _update_peak_stats(self, peak_state: Any) -> None:
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if self._peak_mem != before:
                phase = ("optimiser" if getattr(self, "_in_opt", False) else
                         "backward" if self._mod_tracker.is_bw else "forward")
                inner = max(self._mod_tracker.parents, key=lambda m: m.count("."), default="")
                self.where = f"{phase}, {inner}"

        def held_now(self) -> float:
            """Bytes held by the module's parameters and buffers (this process's shards)."""
            return held(self.module)

        def peak_by_kind(self) -> dict[str, float]:
            snap = self.get_tracker_snapshot("peak")
            dev_snap = max(snap.values(), key=lambda s: s.get("Total", 0))
            return {getattr(k, "value", str(k)): float(v) for k, v in dev_snap.items()
                    if k != "Total"}

    return Tracker


def _storages(module: Any) -> list[Any]:
    """The storages of `module`'s parameters and buffers on this process (its shards), each
    once (a tied weight is one)."""
    import torch

    found: dict[int, Any] = {}
    for t in [*module.parameters(), *module.buffers()]:
        local = t.to_local() if hasattr(t, "to_local") else t
        if isinstance(local, torch.Tensor):
            st = local.untyped_storage()
            found.setdefault(st._cdata, st)
    return list(found.values())


def held(module: Any) -> float:
    """Bytes held by `module`'s parameters and buffers on this process (its shards)."""
    return float(sum(st.nbytes() for st in _storages(module)))


def tracker(module: Any, optimizer: Any) -> Any:
    """A memory tracker of `module` and `optimizer`: FSDPMemTracker for an FSDP2 root, torch's
    MemTracker (the module and optimizer tracked as external) for a whole model."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module, FSDPModule):
        found = _tracker_class(FSDPMemTracker)(module, optimizer)
    else:
        found = _tracker_class(MemTracker)()
        # MemTracker hooks every parameter's gradient, and a frozen one (a LoRA base) refuses
        # a hook: marked as hooked already, with handles that remove nothing
        for p in module.parameters():
            if not p.requires_grad:
                found._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
        found.track_external(module, optimizer)
    found.module = module
    return found


class _NoHook:
    def remove(self) -> None:
        pass


class Collectives:
    """A dispatch mode adding up the bytes of each collective: an all-gather's output, a
    reduce-scatter's input, an all-to-all's and an all-reduce's tensor."""

    def __init__(self) -> None:
        self.bytes: dict[str, float] = {}
        self._mode: Any = None

    def __enter__(self) -> Collectives:
        from torch.distributed._tools.fake_collectives import collective_ops
        from torch.utils._python_dispatch import TorchDispatchMode

        owner = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in collective_ops:
                    owner.add(func.overloadpacket.__name__, args)
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def add(self, name: str, args: tuple) -> None:
        import torch

        if name == "wait_tensor":  # waits on a collective counted when it was issued
            return

        def size(x: Any) -> int:
            if isinstance(x, torch.Tensor):
                return x.numel() * x.element_size()
            if isinstance(x, (list, tuple)):
                return sum(size(y) for y in x)
            return 0

        # the tensor that crosses the link: the larger of the op's first two tensor arguments
        moved = max((size(a) for a in args[:2]), default=0)
        key = name.strip("_").removesuffix("_")
        self.bytes[key] = self.bytes.get(key, 0.0) + moved


