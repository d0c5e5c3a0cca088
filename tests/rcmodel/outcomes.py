"""How a failed allreduce call must end on the model's ranks (docs/rcmodel.md, "Outcomes").

Fail fast: the rank whose own stream gives up (a `StallError` after the collective timeout,
or a `CompletionError` when rxe's retries ran out) aborts through the rendezvous, and every
other rank still in a call raises `PeerFailure` naming it. So a failure is legitimate only
when every `PeerFailure` names ranks that did fail on their own, and at least one did.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

from netreduce.comm import PeerFailure


def check_fail_fast(errors: Mapping[int, BaseException],
                    own_failure: Callable[[BaseException], bool]) -> set[int]:
    """`errors`: each failed rank's first error. Asserts that some rank failed on its own
    (`own_failure(error)`) and that every other one raised `PeerFailure` naming only such
    ranks. Returns the ranks that failed on their own."""
    own = {rank for rank, exc in errors.items() if own_failure(exc)}
    assert own, f"no rank failed on its own: {dict(errors)!r}"
    for rank, exc in sorted(errors.items()):
        if rank in own:
            continue
        assert isinstance(exc, PeerFailure), f"rank {rank}: {exc!r}"
        assert exc.ranks and set(exc.ranks) <= own, \
            f"rank {rank}'s PeerFailure names ranks {exc.ranks}, but only {sorted(own)} " \
            f"failed on their own: {exc}"
    return own


def assert_every_rank_failed_fast(results: Sequence[object],
                                  own_failure: type[BaseException]) -> set[int]:
    """Every rank of one call raised: some `own_failure`, the others `PeerFailure` naming
    them (see `check_fail_fast`). Returns the ranks that raised `own_failure`."""
    assert all(isinstance(r, BaseException) for r in results), results
    errors = {rank: exc for rank, exc in enumerate(results) if isinstance(exc, BaseException)}
    return check_fail_fast(errors, lambda exc: isinstance(exc, own_failure))
