"""Is this machine ready for the course? Small checks, each with a fix.

A check is a function of no arguments that returns a `Check`: a name, a status (``"ok"``,
``"warn"`` or ``"fail"``), what it found, and what to do about it. The course can run when
no check fails; a warning is worth reading but blocks nothing. `run_checks` never raises:
a check that crashes is reported as failed, with its error, so one broken piece (a torch
that will not import) never hides the others.

Imports of torch, matplotlib and the Jupyter packages happen inside the checks, because
their failing to import is exactly what the doctor is there to report.
"""

from __future__ import annotations

import importlib.metadata as metadata
import io
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Callable

PINNED_TORCH = "2.13.0"  # the pin in constraints.txt (tests/test_packaging.py keeps them equal)
MIN_PYTHON = (3, 10)  # what the package needs
PINNED_PYTHON = (3, 11, 5)  # what the pins in constraints.txt need (numpy, soupsieve, ...)
SETUP_FIX = "run `make course` (or `make test`) from the repository to (re)install .venv"
VISIBLE_FIX = ("write physical GPU ids separated by commas, no spaces, e.g. "
               "`export CUDA_VISIBLE_DEVICES=0,1`, or `unset CUDA_VISIBLE_DEVICES` to see all")
_ANY_ID = 1 << 16  # a device count so large that no id is out of range: checks syntax only


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: str  # "ok", "warn" or "fail"
    detail: str
    fix: str = ""


def check_python() -> Check:
    version = ".".join(str(part) for part in sys.version_info[:3])
    if sys.version_info[:2] < MIN_PYTHON:
        return Check("python", "fail", f"Python {version} is older than 3.10",
                     "install Python 3.11.5 or newer, then `make distclean course`")
    if sys.version_info[:3] < PINNED_PYTHON:
        return Check("python", "warn", f"Python {version}: the package runs, but the pinned "
                     "versions in constraints.txt need 3.11.5 or newer",
                     "install Python 3.11.5 or newer, then `make distclean course`")
    return Check("python", "ok", f"Python {version} ({sys.executable})")


def check_torch() -> Check:
    try:
        import torch
    except ImportError as exc:
        return Check("torch", "fail", f"cannot import torch: {exc}", SETUP_FIX)
    version = torch.__version__
    if version.split("+")[0] != PINNED_TORCH:
        return Check("torch", "warn", f"torch {version}; the course is tested with {PINNED_TORCH}",
                     f"`.venv/bin/pip install -c constraints.txt torch=={PINNED_TORCH}`")
    return Check("torch", "ok", f"torch {version}")


def check_cuda() -> Check:
    import torch

    n_physical = _physical_gpu_count()
    if not torch.cuda.is_available():
        build = "a CPU-only torch build" if torch.version.cuda is None else "no CUDA device"
        if n_physical:
            return Check("cuda", "warn", f"nvidia-smi lists {n_physical} GPU(s), torch sees "
                         f"none ({build})", "check the driver and CUDA_VISIBLE_DEVICES; for GPUs "
                         f"install a CUDA build of torch {PINNED_TORCH}")
        return Check("cuda", "ok", f"{build}: lessons run on the simulator and on gloo (CPU)")
    count = torch.cuda.device_count()
    names = ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(count))
    return Check("cuda", "ok", f"CUDA {torch.version.cuda}, {count} visible: {names}")


def check_visible_devices() -> Check:
    import torch

    name = "CUDA_VISIBLE_DEVICES"
    value = os.environ.get(name)
    if value is None:
        return Check(name, "ok", "not set: every GPU is visible, in physical order")
    n_physical = _physical_gpu_count()
    if not n_physical:  # no GPU, or no nvidia-smi to count them: check the syntax only
        if not value.strip():
            return Check(name, "ok", "set but empty: hides every GPU")
        n_physical = _ANY_ID
    if torch.cuda.is_available() and value.strip().upper().startswith(("GPU-", "MIG-")):
        return Check(name, "ok", f"{value!r} (UUIDs): torch sees "
                     f"{torch.cuda.device_count()} device(s)")
    warnings, physical = read_visible(value, n_physical)
    if warnings:
        return Check(name, "warn", f"{value!r}: " + "; ".join(warnings), VISIBLE_FIX)
    if not torch.cuda.is_available():
        return Check(name, "ok", f"{value!r} reads as physical {physical}; no CUDA device is "
                     "visible here (the simulator takes the same string: visible=)")
    mapping = ", ".join(f"cuda:{i} = physical {p}" for i, p in enumerate(physical))
    return Check(name, "ok", f"{value!r}: {mapping}")


def check_gloo() -> Check:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return Check("gloo", "fail", "torch.distributed has no gloo backend in this build",
                     f"install torch {PINNED_TORCH} from constraints.txt (on Windows, use WSL)")
    return Check("gloo", "ok", "torch.distributed gloo backend available")


def check_nccl() -> Check:
    import torch.distributed as dist

    if dist.is_available() and dist.is_nccl_available():
        return Check("nccl", "ok", "NCCL available (multi-GPU runs with --backend nccl)")
    return Check("nccl", "ok", "no NCCL in this torch build: fine, it is only for CUDA GPUs")


def check_port() -> Check:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    except OSError as exc:
        return Check("loopback port", "fail", f"cannot open a TCP port on 127.0.0.1: {exc}",
                     "gloo processes meet over loopback TCP: allow it in the firewall/sandbox")
    return Check("loopback port", "ok", f"127.0.0.1:{port} is free (gloo meets over loopback)")


def check_jupyterlab() -> Check:
    return _installed("jupyterlab", "JupyterLab")


def check_ipywidgets() -> Check:
    return _installed("ipywidgets", "ipywidgets", major="8", who="the explorers")


def _installed(package: str, label: str, major: str = "", who: str = "") -> Check:
    """The check named ``package``: installed (fails if not), of version ``major``.x (warns
    if not: ``who`` needs it)."""
    try:
        version = metadata.version(package)
    except metadata.PackageNotFoundError:
        return Check(package, "fail", f"{label} is not installed", SETUP_FIX)
    if major and not version.startswith(f"{major}."):
        return Check(package, "warn", f"{label} {version}; {who} need {major}.x",
                     f"`.venv/bin/pip install -c constraints.txt {package}`")
    return Check(package, "ok", f"{label} {version}")


def check_matplotlib() -> Check:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A Figure with its own Agg canvas: renders without touching pyplot's global backend.
    figure = Figure(figsize=(2, 1))
    FigureCanvasAgg(figure)
    figure.add_subplot().plot([0, 1], [1, 0])
    png = io.BytesIO()
    figure.savefig(png, format="png")
    return Check("matplotlib", "ok", f"matplotlib {matplotlib.__version__}: Agg renders a "
                 f"figure ({png.tell()} bytes of PNG)")


def all_checks() -> list[Callable[[], Check]]:
    """The checks, in report order (looked up at call time, so tests can replace one)."""
    return [check_python, check_torch, check_cuda, check_visible_devices, check_gloo,
            check_nccl, check_port, check_jupyterlab, check_ipywidgets, check_matplotlib]


def run_checks(checks: list[Callable[[], Check]] | None = None) -> list[Check]:
    """Run every check; a check that raises becomes a failed `Check` naming the error."""
    results = []
    for check in all_checks() if checks is None else checks:
        try:
            results.append(check())
        except Exception as exc:  # noqa: BLE001 - the doctor reports, it never crashes
            name = check.__name__.removeprefix("check_")
            results.append(Check(name, "fail", f"{type(exc).__name__}: {exc}", SETUP_FIX))
    return results


def course_can_run(checks: list[Check]) -> bool:
    return all(check.status != "fail" for check in checks)


def to_json(checks: list[Check]) -> dict:
    """``{"checks": [{"name", "status", "detail", "fix"}, ...], "ok": bool}``."""
    return {"checks": [asdict(check) for check in checks], "ok": course_can_run(checks)}


def format_table(checks: list[Check]) -> str:
    """A plain-text table: one row per check, its fix indented below when it is not ok."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        lines.append(f"  {check.status:<4}  {check.name:<{width}}  {check.detail}")
        if check.status != "ok" and check.fix:
            lines.append(f"  {'':<4}  {'':<{width}}  fix: {check.fix}")
    warnings = sum(check.status == "warn" for check in checks)
    failures = sum(check.status == "fail" for check in checks)
    if failures:
        lines.append(f"Not ready: {failures} check(s) failed; apply the fixes above.")
    else:
        lines.append(f"Ready: the course can run ({warnings} warning(s)).")
    return "\n".join(lines)


def read_visible(value: str, n_physical: int) -> tuple[list[str], list[int]]:
    """``(warnings, physical ids)`` for a CUDA_VISIBLE_DEVICES value, as the simulated
    cluster reads it (``mpgpu_edu.cluster.visible``, CUDA's own rules)."""
    from mpgpu_edu.cluster.visible import check_visible, parse_visible

    return check_visible(value, n_physical), parse_visible(value, n_physical)


def _physical_gpu_count() -> int | None:
    """GPUs the driver sees, ignoring CUDA_VISIBLE_DEVICES; None when nvidia-smi is absent."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=15, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(line.startswith("GPU ") for line in listing.splitlines())
