"""The user errors: mistakes a user can fix from the message alone.

The CLI prints one of these as one paragraph and exits 2. Everything else (a bug, a CUDA
out-of-memory error, an NCCL failure) keeps its traceback. Raise the most specific class; each
also derives from the built-in error it replaces, so `except ValueError` callers keep working.
"""

from __future__ import annotations


class ReasonerError(Exception):
    """Base of every user error; the message says what was wrong, where, and what to do."""


class ConfigError(ReasonerError, ValueError):
    """A config file, override or recipe that cannot be used."""


class DataError(ReasonerError, ValueError):
    """Input data (problems, SFT rows, benchmark files) that is missing or malformed."""


class ShardError(ReasonerError, ValueError):
    """A shard folder that is missing, incomplete, or holds bad rows."""


class InputError(ReasonerError, ValueError):
    """A bad command-line value, a missing file or model folder, a device that is not there."""


class DependencyError(ReasonerError, ImportError):
    """An optional package the chosen setting needs is not installed (the message names the extra)."""


class ServerError(ReasonerError, RuntimeError):
    """A model server that cannot be used: unreachable, refusing the key, serving another model
    or answering what is not the API (the message names the URL and what came back)."""


class TrainingError(ReasonerError, RuntimeError):
    """Training cannot go on (non-finite loss, no usable samples); the message says what to do."""


class Stopped(Exception):
    """A run ended early on a signal (SIGTERM or SIGHUP, as a scheduler or a closed terminal
    sends): not an error, the command says where it stopped and that a rerun resumes."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal_number = signal_number
