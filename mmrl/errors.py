"""Errors whose message is the whole story: the command line prints them as one line (``error: ...``)
and exits with status 2, no traceback. Each names the problem and the fix."""

from __future__ import annotations


class UserError(RuntimeError):
    """A problem the user can fix (a setting, a file, the machine); the message says how."""


class TrainingError(UserError):
    """Training cannot go on without training wrong (non-finite rewards or gradients, every episode
    lost); the newest complete checkpoint is left as it was."""


class RunLockedError(UserError):
    """Another process is running in the same run folder."""


class ConfigChangedError(UserError):
    """A resume with a config that differs from the checkpoint's in keys that change training."""


class DatasetError(UserError, ValueError):
    """A dataset's files or arguments are not what its builder reads (a missing column, a bad row,
    a file not found); the message names the dataset, the file and row, and the mapping that fixes it."""


class DatasetFileNotFoundError(UserError, FileNotFoundError):
    """A dataset's file is not where its arguments say; the message names it and where it comes from."""


class SimulatorError(UserError):
    """A user's simulator (a plugin, not one of mmrl's adapters) raised in one of its contract's
    calls; the message names the class, the call and the line (the training adds the newest complete
    checkpoint)."""


class TextTooLongError(UserError, ValueError):
    """An instruction or prompt longer than the policy stores; the message names the setting that
    widens it, where there is one."""
