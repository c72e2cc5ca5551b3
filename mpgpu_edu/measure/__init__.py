"""Measuring the real thing, and the model against it: ``bench`` (the course's collectives and
DDP against torch's on gloo processes; ``recording``: the idle-machine rule and RESULTS.md),
``calibrate`` and ``calibrated`` (a simulator profile fitted to this machine's gloo),
``fidelity`` and ``fidelity_rows`` (simulated figures against published measurements), and
``doctor`` (is this machine ready?)."""
