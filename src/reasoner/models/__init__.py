"""Models: loading and importing them (load.py), tiny ones from scratch (tiny.py), token
log-probs without a token x vocabulary tensor (logprobs.py), FSDP2 sharding as they load
(fsdp.py) and the vocabulary-parallel embedding and lm-head (vocab_parallel.py).

The loading API is re-exported: `from reasoner import models; models.load_tokenizer(...)`.
"""

from reasoner.models.load import (
    check_reachable,
    describe,
    import_model,
    load_model,
    load_tokenizer,
)
from reasoner.models.tiny import build_tiny

__all__ = ["build_tiny", "check_reachable", "describe", "import_model", "load_model",
           "load_tokenizer"]
