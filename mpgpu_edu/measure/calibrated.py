"""A calibration profile: the JSON file ``mpgpu-edu calibrate`` writes, and the simulated
cluster it loads as.

``save_profile`` writes what ``mpgpu_edu.measure.calibrate.calibrate`` measured; ``read_profile``
reads it back, checked; ``load_calibrated(path)`` turns it into a ``Cluster`` whose routes
carry the measured alpha and beta, so that ``launch(fn, load_calibrated(path))`` predicts
this machine. A gloo profile is wired as ``shared_host`` (every transfer holds the host's
copy bandwidth; ``mpgpu_edu.measure.calibrate`` says why), an nccl profile as a uniform topology.
"""

from __future__ import annotations

import json
from pathlib import Path

from mpgpu_edu.cluster import Cluster, LinkInfo, Route, topology
from mpgpu_edu.cluster.hardware import GPUS

FORMAT = "mpgpu-edu calibration 1"


def default_profile_path() -> Path:
    """``.mpgpu/calibration.json`` in the repository (the folder holding ``pyproject.toml``
    next to the package), else in the current directory."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        root = Path.cwd()
    return root / ".mpgpu" / "calibration.json"


def save_profile(profile: dict, path: str | Path) -> Path:
    """Write ``profile`` as JSON at ``path`` (folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=2) + "\n")
    return path


def read_profile(path: str | Path) -> dict:
    """The profile at ``path``, checked; ``ValueError`` saying what is wrong otherwise."""
    try:
        profile = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read calibration profile {str(path)!r}: {exc}") from None
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a calibration profile (run `mpgpu-edu "
                         "calibrate` to make one)")
    alpha, beta = profile.get("alpha_s"), profile.get("beta_Bps")
    if not (isinstance(alpha, (int, float)) and isinstance(beta, (int, float))
            and alpha >= 0 and beta > 0):
        raise ValueError(f"{str(path)!r}: alpha_s must be >= 0 and beta_Bps > 0, got "
                         f"{alpha!r} and {beta!r}")
    shared = profile.get("alpha_shared", 1.0)
    if not (isinstance(shared, (int, float)) and 0 <= shared <= 1):
        raise ValueError(f"{str(path)!r}: alpha_shared must be between 0 and 1, got {shared!r}")
    memory, overhead = profile.get("memory_Bps"), profile.get("op_overhead_s")
    if memory is not None and not (isinstance(memory, (int, float)) and memory > 0):
        raise ValueError(f"{str(path)!r}: memory_Bps must be > 0 (or absent), got {memory!r}")
    if overhead is not None and not (isinstance(overhead, (int, float)) and overhead >= 0):
        raise ValueError(f"{str(path)!r}: op_overhead_s must be >= 0 (or absent), got "
                         f"{overhead!r}")
    if profile.get("topology", "uniform") not in ("uniform", "shared_host"):
        raise ValueError(f"{str(path)!r}: topology must be 'uniform' or 'shared_host', got "
                         f"{profile['topology']!r}")
    return profile


def shared_host(n: int, alpha_s: float, beta_Bps: float, name: str,
                alpha_shared: float = 1.0) -> topology.Topology:
    """``n`` processes on one machine: every transfer holds its sender's out port, its
    receiver's in port and the one ``host.copy`` resource (the cores that copy the bytes
    through the kernel), so two transfers at once take twice as long, in either direction.
    Alpha is per-message work: ``alpha_shared`` of it also holds ``host.copy``, the rest only
    the two ports (two ranks do that part side by side)."""
    def route_of(s: int, d: int) -> Route:
        return Route(alpha_s, beta_Bps, (f"gpu{s}.out", "host.copy", f"gpu{d}.in"),
                     alpha_holds=(f"gpu{s}.out", f"gpu{d}.in"), alpha_shared=alpha_shared)

    links = [LinkInfo(f"gpu{g}", "host", name, beta_Bps, "host.copy") for g in range(n)]
    return topology.Topology("shared_host", n, route_of, links, {"host": tuple(range(n))})


def load_calibrated(path: str | Path | None = None, world_size: int | None = None,
                    gpu: str | None = None) -> Cluster:
    """A ``Cluster`` of ``world_size`` devices (default: the profile's) in which every pair
    has the measured alpha and beta, wired as the profile's ``topology`` says (``shared_host``
    for gloo, ``uniform``: a port in and out per device). ``gpu`` names the device profile
    for compute (default ``CPU-16GB`` for a gloo profile; name one for an nccl profile).
    FLOPs cost peak x 1.0; every op pays the profile's measured ``op_overhead_s`` and moves
    its bytes at ``memory_Bps``, so a reduction's adds cost what they cost here. A profile
    without them (older, or too noisy to fit) leaves memory traffic free and ops without
    overhead, as in ``Cluster.uniform``."""
    profile = read_profile(path or default_profile_path())
    n = world_size or int(profile["world_size"])
    backend = profile.get("backend", "gloo")
    if gpu is None and backend != "gloo":
        raise ValueError(f"the profile measured {backend}: name the GPU, e.g. "
                         "load_calibrated(path, gpu='H100-SXM-80GB')")
    alpha, beta = profile["alpha_s"], profile["beta_Bps"]
    name = f"loopback-{backend} (calibrated)"
    shared = float(profile.get("alpha_shared", 1.0))
    wiring = (shared_host(n, alpha, beta, name, shared)
              if profile.get("topology") == "shared_host"
              else topology.uniform(n, alpha, beta, spec_name=name))
    memory = profile.get("memory_Bps") or 0.0
    overhead = (profile.get("op_overhead_s") or 0.0) if memory else 0.0
    return Cluster(f"calibrated-{n}x{backend}", GPUS[gpu or "CPU-16GB"], wiring,
                   efficiency=1.0, launch_overhead_s=overhead, memory_Bps=memory)
