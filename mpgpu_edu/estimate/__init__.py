"""Estimates for real model presets: one training step on a cluster preset, simulated
(``simulate_step``), from per-op costs on the roofline (``costs``)."""

from mpgpu_edu.estimate.plan import STRATEGIES, StepSetup
from mpgpu_edu.estimate.step import simulate_step

__all__ = ["STRATEGIES", "StepSetup", "simulate_step"]
