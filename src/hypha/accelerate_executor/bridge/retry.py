"""Which bridge failures are worth another try, and trying again within a bound.

The bridge's peers are other people's machines on the open internet: a scheduler, a data
node or a parameter server that does not answer for a second is the normal case. So:

    transient (tried again)                       final (raised at once)
    5xx: the bridge's remote hop failed            4xx: the request itself is wrong
      (network_error, connector_error, io_error,     (invalid_request, 404, 413/415/422
       docs/protocol.md section 2)                    of the extractors)
    400 hash_mismatch: a data node's bytes did     the socket file is gone: the worker
      not hash to the slice's name                   stopped the job (BridgeGoneError)
    the bridge refused or reset the connection,
      or did not answer in time

hash_mismatch is a 400 whose cause is not the request: upstream's bridge answers it when the
bytes a data node streamed do not hash to the slice, deletes them, and retries the download
itself inside the same backoff as its 5xx (docs/faults.md cites the source); another fetch may
reach another data node.

Every try after the first waits a jittered, exponentially growing pause; no try starts once
`total_s` has passed since the first, so a request gives up after at most `total_s` plus
one try's own timeout. Giving up raises the last failure's kind, its message saying how
many tries over how long: BridgeRetriesExhausted (a BridgeAnswerError, so the action loop turns it
into `error{connection}` where a status exists) or BridgeGoneError (the executor ends with
that one line).

A request that may have reached the scheduler (its answer lost, or a 5xx from the hop
after it) is sent again as it was: the same status, never a changed one. The alternative,
not sending it again, leaves the executor without an answer and ends a job that may have
run for hours; sending it again risks at worst that a scheduler which did see it counts a
`batch-completed` twice and schedules the round's update a few batches early. The batches
and the loss a round reports come from `sent-update`'s metrics, which count what was
trained, so nothing is counted twice there (see training/actions/loop.py, send_update).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from hypha.accelerate_executor.errors import BridgeAnswerError, BridgeError, BridgeGoneError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    first_pause_s: float = 0.5
    max_pause_s: float = 10.0
    # No try starts later than this after the first: the worst case a request waits on a
    # peer that never comes back, plus that last try's own timeout.
    total_s: float = 120.0

    def pause(self, retry: int) -> float:
        """The pause before retry number `retry` (1, 2, ...): half of it fixed, half random,
        so workers that failed together do not all come back at the same instant."""
        ceiling = min(self.max_pause_s, self.first_pause_s * 2 ** (retry - 1))
        return ceiling / 2 + random.uniform(0.0, ceiling / 2)


DEFAULT_POLICY = RetryPolicy()


class BridgeRetriesExhausted(BridgeAnswerError):
    """A transient answer of the bridge that did not go away within the policy's bound."""

    def __init__(self, last: BridgeAnswerError, tries: int, seconds: float) -> None:
        super().__init__(
            last.route,
            last.status,
            last.error,
            f"{last.detail} (still failing after {tries} tries over {seconds:.0f} s)",
        )
        self.tries = tries


# The 4xx answers whose cause lies beyond the bridge, not in the request.
TRANSIENT_4XX = frozenset({"hash_mismatch"})


def is_transient(failure: Exception) -> bool:
    if isinstance(failure, BridgeRetriesExhausted):
        return False
    if isinstance(failure, BridgeAnswerError):
        return failure.status >= 500 or failure.error in TRANSIENT_4XX
    if isinstance(failure, BridgeGoneError):
        return failure.transient
    return False


def retrying(
    route: str,
    attempt: Callable[[], T],
    policy: RetryPolicy = DEFAULT_POLICY,
    until: float | None = None,
    may_retry: Callable[[], bool] = lambda: True,
) -> T:
    """`attempt()`, tried again after each transient failure until the policy's bound (or
    `until`, a time.time(), whichever comes first) has passed. `may_retry` is asked before
    each retry: False raises the last failure as it is."""
    started = time.monotonic()
    stop = started + policy.total_s
    if until is not None:
        stop = min(stop, time.monotonic() + (until - time.time()))
    tries = 0
    while True:
        tries += 1
        try:
            return attempt()
        except BridgeError as failure:
            pause = policy.pause(tries)
            if not is_transient(failure) or time.monotonic() + pause > stop or not may_retry():
                if not is_transient(failure) or tries == 1:
                    raise
                seconds = time.monotonic() - started
                if isinstance(failure, BridgeAnswerError):
                    raise BridgeRetriesExhausted(failure, tries, seconds) from None
                raise BridgeGoneError(
                    f"{failure} ({route}: still failing after {tries} tries over {seconds:.0f} s)"
                ) from None
            time.sleep(pause)
