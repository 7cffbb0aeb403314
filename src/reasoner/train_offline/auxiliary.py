"""What train-offline keeps beside the policy, and checkpoints with it: OREAL's token RM and its
optimiser, a reference that moves (ProRL's resets, the discounted objective's moving average) and
ProRL's plateau tracker. Models are checkpointed shard by shard (`checkpoints.aux_state`), the
tracker as a plain dict in the trainer state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from reasoner.models import lora
from reasoner.train_offline.kl_reference import Plateau
from reasoner.train_offline.token_rm import TokenRM
from reasoner.training import checkpoints


@dataclass(frozen=True)
class Auxiliary:
    token_rm: TokenRM | None = None
    moving_ref: nn.Module | None = None  # resident only when it moves (LoRA: an AdapterView)
    plateau: Plateau | None = None

    def models(self) -> tuple[dict[str, nn.Module], dict[str, tuple]]:
        """The models a resumed run needs beyond the policy, and their optimisers, by name."""
        models: dict[str, nn.Module] = {}
        optimizers: dict[str, tuple] = {}
        if self.token_rm is not None:
            models["token_rm"] = self.token_rm.model
            optimizers["token_rm_optim"] = (self.token_rm.model, self.token_rm.optimizer)
        if self.moving_ref is not None and not isinstance(self.moving_ref, lora.AdapterView):
            models["reference"] = self.moving_ref  # (a LoRA reference is saved as adapters)
        return models, optimizers

    def shards(self) -> dict | None:
        """This process's shards of the models, for a checkpoint (None: nothing to save)."""
        models, optimizers = self.models()
        return checkpoints.aux_state(models, optimizers) if models else None

    def trainer_state(self) -> dict:
        """What goes into the trainer state beside the models: the plateau tracker."""
        return {"plateau": dict(vars(self.plateau))} if self.plateau is not None else {}

    def restore(self, ckpt: Path | None, saved: dict) -> None:
        """Put back what the checkpoint resumed from held (`saved`: its trainer state)."""
        if self.plateau is not None and "plateau" in saved:
            vars(self.plateau).update(saved["plateau"])
        models, optimizers = self.models()
        if ckpt is not None and models:
            checkpoints.load_aux(ckpt, models, optimizers)
