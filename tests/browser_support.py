"""Helpers for the browser test: a throwaway JupyterLab server and a headless Chromium on it.

``start_jupyterlab`` runs ``jupyter lab`` on 127.0.0.1 with a random free port and a random
token, serving the course folder. Everything JupyterLab or IPython would write into the
learner's home goes to a temporary folder instead (config, data, runtime, settings,
workspaces, IPython profile), and so does the course state that ``mp.check`` records
(``MPGPU_EDU_ROOT`` names a temporary course folder holding a copy of ``exercises/``).
Autosave is off, so running a lesson in the browser leaves its ``.ipynb`` as it was.

``LabPage`` drives one notebook in that server the way a learner does: open it, wait for the
kernel, Run > Run All Cells, wait for every cell, then look at outputs and move widgets. Every
action runs inside ``step(name)``: when one fails, the message names the step and a
screenshot of the whole page is saved next to the others in ``artifacts/browser/``.

The browser is the system's Chromium (``apt-get install chromium``), never one downloaded by
Playwright; ``MPGPU_EDU_CHROMIUM`` may name another Chromium or Chrome binary.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM_ENV = "MPGPU_EDU_CHROMIUM"
INSTALL_HINT = ("install it with `sudo apt-get install chromium` (Debian, Ubuntu: "
                f"`chromium-browser`), or set {CHROMIUM_ENV} to a Chromium or Chrome binary")

# The real binary first: /usr/bin/chromium is a shell wrapper around it on Debian.
CHROMIUM_CANDIDATES = (
    "/usr/lib/chromium/chromium",
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/snap/bin/chromium",
    "/usr/bin/google-chrome",
    "/usr/bin/google-chrome-stable",
    "/Applications/Chromium.app/Contents/MacOS/Chromium",
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
)

# Headless, and quiet on the network: without the background-networking flags Chromium keeps
# trying to reach Google's services (updates, sync, safe browsing) from a machine that may
# have no internet at all.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]

# User settings for the throwaway JupyterLab: no news, no update check, no toasts over the
# notebook, and no autosave (the notebook on disk must stay clean: no outputs in git).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
        "doNotDisturbMode": True,
    },
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {
        "autosave": False,
    },
}

# The notebook's toolbar shows the kernel's state here: idle, busy, starting, ...
KERNEL_INDICATOR = ".jp-NotebookPanel .jp-Notebook-ExecutionIndicator"
RENDERED_HTML = ".jp-OutputArea-output.jp-RenderedHTMLCommon"
# Tracebacks and other stderr text.
STDERR_OUTPUT = ('.jp-NotebookPanel .jp-OutputArea-output'
                 '[data-mime-type="application/vnd.jupyter.stderr"]')
# An ipywidgets 8 IntSlider / FloatSlider; its handle is a noUiSlider handle.
SLIDER = ".jupyter-widgets.widget-slider"
SLIDER_HANDLE = ".noUi-handle"


def chromium_path() -> str | None:
    """The Chromium (or Chrome) binary to drive, or None when there is none."""
    named = os.environ.get(CHROMIUM_ENV)
    if named:
        return named if Path(named).is_file() else None
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_lab_settings(settings_dir: Path, settings: dict[str, dict] = LAB_SETTINGS) -> None:
    for name, values in settings.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=1))


# ---- the server -----------------------------------------------------------------------------

@dataclass
class JupyterLab:
    """A running ``jupyter lab``: its address, token, process and log."""

    port: int
    token: str
    process: subprocess.Popen
    log_path: Path
    home: Path
    kernel_pids: set[int] = field(default_factory=set)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """``path`` (``/lab/tree/...``) with the token, for the browser."""
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}{path}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 5.0) -> Any:
        """Call the REST API (``/api/...``) with the token; the decoded JSON, or None."""
        request = urllib.request.Request(self.base_url + path, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kernels(self, patience: float = 15.0) -> list[dict]:
        """The server's kernels. jupyter_server answers 500 when it lists a kernel that is
        still starting (its ``last_activity`` is None for a moment): ask again, a while."""
        deadline = time.monotonic() + patience
        while True:
            try:
                return self.api("/api/kernels")
            except urllib.error.HTTPError as exc:
                if exc.code != 500 or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def remember_kernels(self) -> None:
        """Note the server's child processes (kernels run in their own session, so killing
        the server's process group alone could leave them behind)."""
        try:
            import psutil
        except ImportError:
            return
        with contextlib.suppress(psutil.Error):
            self.kernel_pids |= {child.pid for child in
                                 psutil.Process(self.process.pid).children(recursive=True)}

    def stop(self) -> None:
        """Shut down kernels and server: politely through the API, then SIGTERM, then SIGKILL
        to the server's process group and to any kernel left over."""
        if self.process.poll() is None:
            self.remember_kernels()
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                self.api("/api/shutdown", method="POST", timeout=5)
            for sig, wait in ((None, 10), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                if sig is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.process.pid, sig)
                try:
                    self.process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._kill_leftover_kernels()

    def _kill_leftover_kernels(self) -> None:
        try:
            import psutil
        except ImportError:
            return
        leftovers = []
        for pid in self.kernel_pids:
            with contextlib.suppress(psutil.Error):
                leftovers.append(psutil.Process(pid))
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(leftovers, timeout=5)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()


def start_jupyterlab(root_dir: Path, home: Path, log_path: Path, *,
                     course_root: Path = ROOT, timeout: float = 90.0) -> JupyterLab:
    """Start ``jupyter lab`` serving ``root_dir``; return once ``/api/status`` answers.

    ``home`` is a temporary folder for everything Jupyter and IPython write (settings,
    workspaces, runtime files, the IPython profile) and for the course state: ``mp.check``
    records progress in ``home/course/.mpgpu``, and checks a copy of ``course_root/exercises``."""
    settings_dir = home / "lab-settings"
    write_lab_settings(settings_dir)
    course = home / "course"
    course.mkdir(parents=True, exist_ok=True)
    exercises = course / "exercises"  # a copy: checks count no linked folder as the learner's
    if not exercises.exists():
        shutil.copytree(course_root / "exercises", exercises)

    env = dict(os.environ)
    # A notebook shows figures the way a learner's does: matplotlib's inline backend, not the
    # off-screen backend the other tests set.
    env.pop("MPLBACKEND", None)
    env.update({
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings_dir),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
        "MPGPU_EDU_ROOT": str(course),
        "PYTHONUNBUFFERED": "1",
    })
    log_path.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for _attempt in range(3):  # the free port may be taken before the server binds it
        port, token = free_port(), secrets.token_hex(24)
        command = [
            sys.executable, "-m", "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root_dir}",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            f"--LabApp.user_settings_dir={settings_dir}",
            f"--LabApp.workspaces_dir={home / 'workspaces'}",
            # Checkpoints (made when a notebook opens) go to the temporary folder too.
            f"--FileCheckpoints.root_dir={home / 'checkpoints'}",
        ]
        if hasattr(os, "getuid") and os.getuid() == 0:
            command.append("--allow-root")
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, cwd=root_dir, env=env, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        lab = JupyterLab(port, token, process, log_path, home)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if lab.api("/api/status", timeout=2) is not None:
                    return lab
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.3)
        if process.poll() is None:
            lab.stop()
            raise RuntimeError(f"JupyterLab did not answer /api/status within {timeout:.0f} s;"
                               f" its log ({log_path}) ends:\n{lab.log_tail()}")
        errors.append(f"exit status {process.returncode}:\n{lab.log_tail()}")
        if "is not available" not in lab.log_tail():
            break
    raise RuntimeError("JupyterLab did not start: " + "\n---\n".join(errors))


# ---- the page -------------------------------------------------------------------------------

class StepFailed(AssertionError):
    pass


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


class LabPage:
    """One notebook open in JupyterLab, in a Playwright ``page``."""

    def __init__(self, page: Any, lab: JupyterLab, artifacts: Path = ARTIFACTS) -> None:
        self.page, self.lab, self.artifacts = page, lab, artifacts
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.saved: list[Path] = []
        self.console: list[str] = []
        page.on("console", lambda msg: self.console.append(f"{msg.type}: {msg.text}")
                if msg.type in ("error", "warning") else None)
        page.on("pageerror", lambda exc: self.console.append(f"pageerror: {exc}"))

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Run one step; on failure say which, and save the whole page as it was."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - re-raised with the step's name
            shot = self.artifacts / f"FAILED-{slug(name)}.png"
            try:
                self.page.screenshot(path=str(shot), full_page=True, timeout=15_000)
                where = f"screenshot of the page: {shot}"
            except Exception as shot_exc:  # noqa: BLE001
                where = f"(no screenshot: {shot_exc})"
            console = "\n".join(self.console[-15:]) or "(none)"
            raise StepFailed(f"browser step '{name}' failed: {exc}\n{where}\n"
                             f"browser console errors:\n{console}\n"
                             f"JupyterLab log ({self.lab.log_path}) ends:\n"
                             f"{self.lab.log_tail(15)}") from exc

    def shot(self, locator: Any, name: str) -> Path:
        """An element screenshot, ``artifacts/browser/<name>.png``."""
        path = self.artifacts / f"{name}.png"
        locator.scroll_into_view_if_needed(timeout=10_000)
        locator.screenshot(path=str(path), animations="disabled", timeout=20_000)
        self.saved.append(path)
        return path

    # -- notebook ------------------------------------------------------------------------

    def open_notebook(self, path: str, timeout: float = 90.0) -> None:
        """Open ``path`` (relative to the server's root) and wait for its first cell."""
        self.page.goto(self.lab.url(f"/lab/tree/{path}"), wait_until="domcontentloaded",
                       timeout=timeout * 1000)
        self.page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(
            state="visible", timeout=timeout * 1000)

    def kernel_status(self) -> str:
        indicator = self.page.locator(KERNEL_INDICATOR)
        if indicator.count() == 0:
            return "(no indicator)"
        return indicator.first.get_attribute("data-status") or "(none)"

    def wait_kernel_idle(self, timeout: float = 90.0) -> None:
        """Until the toolbar's indicator and the server both say the kernel is idle."""
        deadline = time.monotonic() + timeout
        api_state = "(no kernel)"
        while time.monotonic() < deadline:
            status = self.kernel_status()
            if status == "idle":
                kernels = self.lab.kernels()
                api_state = ", ".join(k.get("execution_state", "?") for k in kernels) or \
                    "(no kernel)"
                if kernels and all(k.get("execution_state") == "idle" for k in kernels):
                    self.lab.remember_kernels()
                    return
            time.sleep(0.5)
        raise TimeoutError(f"the kernel was not idle after {timeout:.0f} s: indicator says "
                           f"{self.kernel_status()!r}, /api/kernels says {api_state}")

    def run_all_cells(self) -> None:
        """Run > Run All Cells, from the menu bar."""
        menu = self.page.locator("#jp-MainMenu .lm-MenuBar-itemLabel",
                                 has_text=re.compile(r"^Run$"))
        menu.click(timeout=15_000)
        item = self.page.locator('.lm-Menu-item[data-command="runmenu:run-all"]')
        item.wait_for(state="visible", timeout=10_000)
        item.click(timeout=10_000)

    def prompts(self) -> list[str]:
        """The input prompt of every code cell, in order: ``[3]:``, ``[*]:``, ``[ ]:``."""
        return self.page.evaluate("""() => {
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            if (!panel) return [];
            return [...panel.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(cell => {
                const prompt = cell.querySelector('.jp-InputArea-prompt');
                return prompt ? prompt.textContent.trim() : '';
            });
        }""")

    def error_outputs(self) -> list[str]:
        """The text of every traceback shown in the notebook."""
        return self.page.evaluate("""selector => [...document.querySelectorAll(selector)]
            .map(o => o.textContent).filter(t => /Traceback|Error/.test(t))
            .map(t => t.slice(-1500))""", STDERR_OUTPUT)

    def wait_all_cells_done(self, expected: list[int], timeout: float = 180.0) -> list[str]:
        """Until every code cell whose index is in ``expected`` (positions among the code
        cells) shows an execution count and the kernel is idle; the prompts at the end."""
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        prompts: list[str] = []
        while time.monotonic() < deadline:
            prompts = self.prompts()
            numbered = [i for i, p in enumerate(prompts) if re.fullmatch(r"\[\d+\]:", p)]
            running = [i for i, p in enumerate(prompts) if p == "[*]:"]
            missing = sorted(set(expected) - set(numbered))
            idle = self.kernel_status() == "idle"
            if not running and not missing and idle:
                return prompts
            # Nothing queued, the kernel idle, some cells ran but not all: run-all stopped
            # at an error (the kernel drops the cells queued after it).
            if not running and numbered and missing and idle and \
                    time.monotonic() - started > 5:
                errors = "\n---\n".join(self.error_outputs()) or "(no traceback shown)"
                raise AssertionError(f"run-all stopped: code cells {missing} (counting code "
                                     f"cells only, from 0) never ran "
                                     f"(prompts {prompts}); errors shown:\n{errors}")
            time.sleep(0.5)
        raise TimeoutError(f"cells still running after {timeout:.0f} s; prompts: {prompts}, "
                           f"kernel {self.kernel_status()!r}")



def image_src(img: Any) -> str:
    return img.get_attribute("src") or ""


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll ``predicate()`` until it returns something truthy; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")
