"""The errors that leave a communicator unusable (a `netreduce.meta.CallRejected` leaves it
usable: the call was refused alike on every rank before anything moved)."""
from __future__ import annotations


class CommunicatorError(RuntimeError):
    """The communicator cannot be used (closed, or broken by an earlier transfer error)."""


class PeerFailure(CommunicatorError):
    """A call failed because other ranks died, went silent or aborted (`ranks`, with the
    reasons in the message); the communicator is unusable afterwards."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


class SwitchFailure(CommunicatorError):
    """A loss of the switch that could not be settled (a rank lacks the sum or records the
    agreed plan needs, or a good seal disagrees with the sum recovered over the host
    ring); the message names the switch. The communicator is unusable afterwards. A switch
    that restarts or loses the ring is settled instead (`netreduce.away`)."""


class TransportFault(CommunicatorError):
    """A transport fault (a QP in the error state, a work completion with an error status)
    that kept coming back after the bounded recoveries (`netreduce.transport_fault`), or
    one that cannot be recovered yet; the message names the connection, the statuses seen
    and the attempts, alike on every rank. A recovered fault costs one call's time and
    raises nothing. The communicator is unusable afterwards."""
