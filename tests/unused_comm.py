"""A communicator for the groups a test builds but never sends on (a refusal, a cache's key).

:class:`~stragglar.runtime.NcclGroup` takes only what has the calls its transport makes; this
has them all, and each one fails the test, so a call that should have been refused before it
reached NCCL cannot pass unseen."""

from __future__ import annotations

from typing import NoReturn


class UnusedComm:
    def _used(self, *args: object) -> NoReturn:
        raise AssertionError("a communicator the test never expected to be used was called")

    rank_id = size = send = recv = allGather = check_async_error = abort = _used
