"""Communication: one interface (``Communicator``), a simulated and a torch.distributed backend,
and ``launch`` to run an SPMD function on every rank."""

from mpgpu_edu.comm.base import CommStats, Communicator, MemoryRecorder, Work, nbytes_of
from mpgpu_edu.comm.errors import (CommError, DeadlockError, LaunchTimeoutError,
                                   MessageMismatchError, RankError, UnmatchedMessageError)
from mpgpu_edu.comm.launch import LaunchResult, launch

__all__ = ["CommError", "CommStats", "Communicator", "DeadlockError", "LaunchResult",
           "LaunchTimeoutError", "MemoryRecorder", "MessageMismatchError", "RankError",
           "UnmatchedMessageError", "Work", "launch", "nbytes_of"]
