"""Errors with an exit code, shared by every layer.

The CLI maps them to exit codes (see shared/DESIGN.md, Output contract):
usage errors exit 2, bad input data exits 3, anything else exits 1.

``collective`` says whether every rank raises the same error at the same point
(a bad option, a bad header, a data error agreed through a collective).  The CLI
then lets all ranks exit normally with the code; an error raised on one rank
alone must abort the job, or the other ranks would wait in a collective forever.
"""

from __future__ import annotations


class MpikmeansError(Exception):
    """Base class: a failure with a message for the user and an exit code."""

    exit_code = 1

    def __init__(self, message: str, *, collective: bool = False):
        super().__init__(message)
        self.message = message
        self.collective = collective


class UsageError(MpikmeansError):
    """Bad options or settings (exit code 2)."""

    exit_code = 2


class InputError(MpikmeansError):
    """Bad input data: the message names the file, line and attribute (exit code 3)."""

    exit_code = 3


class RunError(MpikmeansError):
    """A failure while running: I/O, an unusable device (exit code 1)."""

    exit_code = 1
