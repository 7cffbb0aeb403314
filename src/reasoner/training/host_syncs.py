"""Host syncs: the ops inside a block that read tensor data on the host, or whose output's
shape depends on tensor data, each with the line of reasoner code that made it.

On a GPU or NPU each such op waits for the device to finish everything queued before it (a
host sync), and under torch's FakeTensorMode none of them can run: a fake tensor has no data
to read (issue 52's rehearsal of a training step needs a step without them). `HostSyncs`
records them for a test to count and `report()` to list by call site.

What is recorded: reading values (`item`, `tolist`, `bool()`, `int()`, `float()`,
`operator.index`, `torch.equal`, ...), outputs shaped by data (`nonzero`, `masked_select`,
`unique`, `bincount`, indexing or assigning with a bool tensor, `repeat_interleave` with tensor
repeats and no `output_size`), `masked_scatter` (its backward is a `masked_select`), copies of a
device tensor to the CPU, and `torch.distributed.all_gather_object`. Everything inside the block
is recorded, whatever device the tensors are on: on a CPU-only run a read of a CPU tensor counts
too, so the count found on CPU is the one a GPU would see (the report names each call site).
Host data kept as numpy or Python numbers is never recorded (`Tensor.numpy()` cannot read a
device tensor). A `TorchDispatchMode` beside the function mode catches what Python never calls
directly: autograd's backward ops and ops inside other ops.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

PACKAGE = Path(__file__).resolve().parents[1]  # src/reasoner
_HERE = Path(__file__).resolve()
_TORCH = Path(torch.__file__).resolve().parent
_DISPATCH = {_HERE, _TORCH / "overrides.py", _TORCH / "utils" / "_python_dispatch.py"}

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__",
         "__format__", "equal", "allclose", "is_nonzero"}
DATA_SHAPED = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
               "bincount", "masked_scatter", "masked_scatter_"}
# what the dispatch mode records: the aten ops under the reads and data-shaped ops above
ATEN = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
        "unique_consecutive", "bincount", "masked_scatter", "masked_scatter_",
        "masked_scatter_backward", "equal"}


@dataclass(frozen=True)
class Sync:
    """One recorded op: what it was and where reasoner code made it."""

    op: str
    site: str  # file:line (function) of the innermost reasoner frame, relative to src/reasoner
    via: str  # the innermost frame outside torch's dispatch, when it is not reasoner's ("")


def _is_bool_index(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _to_cpu(func_name: str, args: tuple, kwargs: dict) -> bool:
    """`t.cpu()` / `t.to("cpu")` / `t.to(cpu_tensor)` of a tensor that is not on the CPU."""
    t = args[0] if args else None
    if not isinstance(t, torch.Tensor) or t.device.type in ("cpu", "meta"):
        return False
    if func_name == "cpu":
        return True
    targets = [*args[1:], kwargs.get("device"), kwargs.get("other")]
    for a in targets:
        if isinstance(a, torch.Tensor):
            a = a.device
        if isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu":
            return True
    return False


def is_host_sync(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a call of `name` (a torch function or Tensor method) with these arguments reads
    data on the host or makes an output whose shape depends on data."""
    if name in READS or name in DATA_SHAPED:
        return True
    if name in ("__getitem__", "__setitem__", "index_put", "index_put_"):
        return len(args) > 1 and _is_bool_index(args[1])
    if name == "repeat_interleave":
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    if name == "where":
        return len(args) == 1 and not kwargs  # torch.where(cond): nonzero
    if name in ("cpu", "to"):
        return _to_cpu(name, args, kwargs)
    return False


def _call_site() -> tuple[str, str]:
    """(site, via) of the op being recorded (see `Sync`)."""
    frame = sys._getframe(2)
    via = ""
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        line = f":{frame.f_lineno} ({frame.f_code.co_name})"
        if path.is_relative_to(PACKAGE) and path != _HERE:
            return f"{path.relative_to(PACKAGE)}{line}", via
        if not via and path not in _DISPATCH:
            via = str(path).removeprefix(str(_TORCH.parent) + "/") + line
        frame = frame.f_back
    return "(outside reasoner)", via


class _Functions(TorchFunctionMode):
    def __init__(self, owner: HostSyncs):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if self.owner.inside or not is_host_sync(name, args, kwargs):
            return func(*args, **kwargs)
        self.owner.record(name)
        self.owner.inside += 1  # its own aten ops are not recorded again
        try:
            return func(*args, **kwargs)
        finally:
            self.owner.inside -= 1


class _Aten(TorchDispatchMode):
    def __init__(self, owner: HostSyncs):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.owner.inside and (name in ATEN or (
                name == "repeat_interleave" and func._overloadname == "Tensor"
                and (kwargs or {}).get("output_size") is None)):
            self.owner.record(f"aten.{name}")
        return func(*args, **(kwargs or {}))


class HostSyncs:
    """For the block, every host sync (see the module's docstring), in order.

    `with HostSyncs() as syncs: step()`; then `len(syncs.found)`, `syncs.by_site()`,
    `syncs.report()`. The blocks of one recorder add up (enter it again for the next step).
    """

    def __init__(self) -> None:
        self.found: list[Sync] = []
        self.inside = 0  # > 0 while a recorded op runs: what it calls is part of it
        self._entered: list[tuple[list, Any]] = []  # (modes, the real gather) per open block

    def record(self, op: str) -> None:
        site, via = _call_site()
        self.found.append(Sync(op, site, via))

    def __enter__(self) -> HostSyncs:
        import torch.distributed as tdist

        real = tdist.all_gather_object

        def all_gather_object(*args: Any, **kwargs: Any) -> Any:
            if not self.inside:
                self.record("all_gather_object")
            self.inside += 1
            try:
                return real(*args, **kwargs)
            finally:
                self.inside -= 1

        tdist.all_gather_object = all_gather_object
        modes = [_Functions(self), _Aten(self)]
        for mode in modes:
            mode.__enter__()
        self._entered.append((modes, real))
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as tdist

        modes, real = self._entered.pop()
        for mode in reversed(modes):
            mode.__exit__(*exc)
        tdist.all_gather_object = real

    def by_site(self) -> Counter:
        """How many of each (site, op): the report's rows."""
        return Counter((s.site, s.op) for s in self.found)

    def report(self, title: str = "host syncs") -> str:
        """The syncs by call site, most frequent first, with the frame outside reasoner that
        made the op when it was not reasoner's own."""
        via = {(s.site, s.op): s.via for s in self.found}
        rows = [f"{title}: {len(self.found)}"]
        for (site, op), n in sorted(self.by_site().items(), key=lambda x: (-x[1], x[0])):
            rows.append(f"  {n:4d}  {op:<22} {site}" + (f"  via {via[site, op]}"
                                                        if via[site, op] else ""))
        return "\n".join(rows)
