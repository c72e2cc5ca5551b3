"""Plain data: what a check's *compute* half may hand to its *judge* half (``comm.plain``,
where the simulator's rank processes use it too)."""

from mpgpu_edu.comm.plain import MAX_DEPTH, UNPLAIN, is_tensor, plain, type_name

__all__ = ["MAX_DEPTH", "UNPLAIN", "is_tensor", "plain", "type_name"]
