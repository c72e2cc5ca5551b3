"""Lesson 04 in a real JupyterLab, driven by a headless Chromium.

The notebook tests run the lessons' code; this one checks what a learner *sees*: JupyterLab
opens the lesson, Run > Run All Cells runs it to the end, a matplotlib figure shows, the
pipeline explorer's microbatch slider redraws its figure when moved, and ``mp.check`` shows
its verdict as HTML. Screenshots of each go to ``artifacts/browser/``:

    01-figure.png            the first matplotlib figure of the lesson
    02-explorer-before.png   the pipeline explorer: controls, numbers, figure
    03-explorer-after.png    the same after one step of the microbatch slider
    04-check-result.png      the first ``mp.check`` card (with the stubs: not implemented)

On failure the message names the step, and ``FAILED-<step>.png`` shows the whole page.
Without Chromium the test is skipped (``apt-get install chromium``); on CI (``CI=true``) a
missing Chromium is an error, since ``.ci/run`` installs it.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pytest

from browser_support import (ARTIFACTS, CHROMIUM_ARGS, INSTALL_HINT, RENDERED_HTML, ROOT, SLIDER,
                             SLIDER_HANDLE, LabPage, chromium_path, image_src, in_ci,
                             start_jupyterlab, wait_until)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LESSON = "notebooks/04_pipeline.ipynb"
SLIDER_LABEL = re.compile(r"microbatch", re.IGNORECASE)
# mp.check's card: "<icon> Exercise 4.2: <title> — 0/4 points (not implemented)"
CHECK_CARD = re.compile(r"Exercise \d+\.\d+")
CHECK_ICONS = re.compile("[\u2705\u274c\u270f\U0001f4a5\u23f1]")  # ✅ ❌ ✏️ 💥 ⏱️
CHECK_HEADLINE = re.compile(r"Exercise \d+\.\d+: .*? (?P<points>\d+/\d+) points "
                            r"\((?P<verdict>[a-z ]+)\)")
VERDICTS = ("passed", "failed", "not implemented")  # error, timeout: the check itself broke


def _missing(what: str) -> None:
    message = f"{what}: {INSTALL_HINT}"
    if in_ci():
        pytest.fail(f"on CI the browser test must run; {message}")
    pytest.skip(message)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = chromium_path()
    if path is None:
        _missing("no Chromium found for the browser test")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("the Python package playwright is missing (pip install -c constraints.txt "
                 "-e '.[test]'); the browser itself comes from the system")
    return path


@pytest.fixture
def lesson() -> Path:
    notebook = ROOT / LESSON
    assert notebook.is_file(), f"{LESSON} is missing: the browser test drives that lesson"
    return notebook


@pytest.fixture
def chromium_browser(chromium: str):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # The system's Chromium: Playwright never downloads a browser here.
        launched = playwright.chromium.launch(executable_path=chromium, headless=True,
                                              args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def lab(tmp_path: Path):
    server = start_jupyterlab(ROOT, tmp_path / "home", ARTIFACTS / "jupyterlab.log")
    try:
        yield server
    finally:
        server.stop()


def fingerprint(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def saved_run(path: Path) -> list[str]:
    """What a save after running would have left in the notebook: outputs, execution counts,
    widget state (one line each; empty for a clean notebook)."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    found = [f"cell {i}: outputs or execution count" for i, cell in enumerate(notebook.cells)
             if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count"))]
    if "widgets" in notebook.metadata:
        found.append("saved widget state")
    return found


def drive_lesson(lab, browser, notebook: Path, relative: str, artifacts: Path = ARTIFACTS,
                 ) -> dict:
    """Open ``relative`` in ``lab``, run it all, and look at its figure, explorer and check.
    Returns what was seen (the slider's values, the verdict, the screenshots)."""
    import nbformat

    code = [cell for cell in nbformat.read(notebook, as_version=4).cells
            if cell.cell_type == "code"]
    # JupyterLab leaves an empty code cell unrun: no execution count to wait for.
    to_run = [i for i, cell in enumerate(code) if cell.source.strip()]
    seen: dict = {}
    for old in artifacts.glob("*.png"):  # screenshots of an earlier run
        old.unlink()
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        lab_page = LabPage(page, lab, artifacts)
        started = time.monotonic()

        with lab_page.step("check the server's settings: no autosave, no news"):
            docs = lab.api("/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
            news = lab.api("/lab/api/settings/@jupyterlab/apputils-extension:notification")
            assert docs["settings"].get("autosave") is False, docs["settings"]
            assert news["settings"].get("fetchNews") == "false", news["settings"]
        with lab_page.step(f"open {relative}"):
            lab_page.open_notebook(relative)
        with lab_page.step("wait for the kernel to be idle"):
            lab_page.wait_kernel_idle(timeout=120)
        with lab_page.step("find every code cell on the page"):
            wait_until(lambda: len(lab_page.prompts()) == len(code), 30,
                       f"the page to show the file's {len(code)} code cells")
        with lab_page.step("Run > Run All Cells"):
            lab_page.run_all_cells()
        with lab_page.step("wait for every cell to finish"):
            seen["prompts"] = lab_page.wait_all_cells_done(to_run, timeout=300)
        seen["run_s"] = time.monotonic() - started

        with lab_page.step("see a matplotlib figure"):
            # An image output of a cell itself, not one inside a widget.
            figure = page.locator(".jp-RenderedImage:not(.jupyter-widgets .jp-RenderedImage)"
                                  ).first
            figure.wait_for(state="attached", timeout=30_000)
            img = figure.locator("img")
            wait_until(lambda: img.evaluate("i => i.complete && i.naturalWidth > 0"), 20,
                       "the figure's image to decode")
            lab_page.shot(img, "01-figure")

        with lab_page.step("find the microbatch slider"):
            sliders = page.locator(SLIDER)
            slider = sliders.filter(has=page.locator("label.widget-label",
                                                     has_text=SLIDER_LABEL)).first
            try:
                slider.wait_for(state="attached", timeout=30_000)
            except Exception as exc:
                labels = [sliders.nth(i).locator("label").inner_text()
                          for i in range(sliders.count())]
                raise AssertionError(f"no slider labelled /microbatch/ among the "
                                     f"{len(labels)} sliders: {labels}") from exc
            cell = page.locator(".jp-NotebookPanel .jp-CodeCell").filter(has=slider).first
            explorer = cell.locator(".jp-Cell-outputArea")
            # The figure the explorer draws: an image inside the widget's own output.
            drawn = cell.locator(".jupyter-widgets .jp-RenderedImage img").first
            drawn.wait_for(state="attached", timeout=30_000)
            handle = slider.locator(SLIDER_HANDLE)
            before = float(handle.get_attribute("aria-valuenow"))
            highest = float(handle.get_attribute("aria-valuemax"))
            before_src = image_src(drawn)
            assert before_src.startswith("data:image/png"), before_src[:80]
            lab_page.shot(explorer, "02-explorer-before")

        with lab_page.step("move the microbatch slider one step"):
            key = "ArrowRight" if before < highest else "ArrowLeft"
            handle.focus()
            handle.press(key)
            def moved() -> list[float] | None:
                value = float(handle.get_attribute("aria-valuenow"))
                return [value] if value != before else None

            (after,) = wait_until(moved, 10, f"the slider to move from {before:g} with {key}")
            seen["slider"] = (before, after)

        with lab_page.step("see the explorer's figure redrawn"):
            wait_until(lambda: image_src(drawn) not in ("", before_src), 60,
                       f"a new figure after microbatches {before:g} -> {after:g}")
            wait_until(lambda: drawn.evaluate("i => i.complete && i.naturalWidth > 0"), 20,
                       "the new figure's image to decode")
            lab_page.wait_kernel_idle(timeout=60)
            readout = (slider.locator(".widget-readout").text_content() or "").strip()
            assert readout == f"{after:g}", f"the slider reads {readout!r}, not {after:g}"
            lab_page.shot(explorer, "03-explorer-after")

        with lab_page.step("see a check result"):
            cards = page.locator(RENDERED_HTML).filter(has_text=CHECK_CARD).filter(
                has_text=CHECK_ICONS)
            card = cards.first
            card.wait_for(state="attached", timeout=30_000)
            card.scroll_into_view_if_needed(timeout=10_000)
            text = " ".join((card.text_content() or "").split())
            headline = CHECK_HEADLINE.search(text)
            assert headline, f"no 'Exercise ... points (verdict)' in the card: {text[:600]!r}"
            assert headline["verdict"] in VERDICTS, \
                f"the check itself did not work ({headline['verdict']}): {text[:1500]!r}"
            seen["check"] = headline[0]
            lab_page.shot(card, "04-check-result")

        seen["screenshots"] = [str(path) for path in lab_page.saved]
        seen["console"] = lab_page.console
        return seen
    finally:
        context.close()


@pytest.mark.timeout(480)
def test_lesson_04_runs_and_reacts_in_jupyterlab(lesson, chromium_browser, lab) -> None:
    before, was_saved = fingerprint(lesson), saved_run(lesson)

    seen = drive_lesson(lab, chromium_browser, lesson, LESSON)

    # Autosave is off: the run stays in the browser. (A clean file that changed all the same
    # was edited by someone else meanwhile.)
    if fingerprint(lesson) != before:
        assert not was_saved and not saved_run(lesson), \
            f"JupyterLab saved the run into {LESSON}: {saved_run(lesson)[:5]}"
    print(f"opened and ran {LESSON} in {seen['run_s']:.0f} s; microbatches {seen['slider'][0]:g} -> "
          f"{seen['slider'][1]:g}; {seen['check']}; screenshots: {seen['screenshots']}")
