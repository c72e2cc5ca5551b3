"""Every lesson in a real JupyterLab, driven by a headless Chromium: it opens, Run All runs it
to the end without a traceback, one prediction is answered by clicking its button (and lands
in the learner's progress), and one widget is moved. Lesson 04 also gets the deeper look of
``test_browser.py`` (figure, explorer redraw, check card).

One JupyterLab and one Chromium serve all lessons; each lesson leaves a screenshot of its
answered prediction in ``artifacts/browser/lessons/``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from browser_support import (ARTIFACTS, CHROMIUM_ARGS, INSTALL_HINT, ROOT, SLIDER,
                             SLIDER_HANDLE, LabPage, chromium_path, in_ci, start_jupyterlab,
                             wait_until)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LESSONS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.ipynb"))
PREDICT_BUTTON = ".mpgpu-predict .widget-toggle-button"
OUT = ARTIFACTS / "lessons"


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        message = f"no Chromium found for the browser test: {INSTALL_HINT}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, headless=True,
                                              args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("lab-home")
    server = start_jupyterlab(ROOT, home, ARTIFACTS / "jupyterlab-lessons.log")
    try:
        yield server
    finally:
        server.stop()


def _move_a_widget(page) -> str:
    """Move the first slider one step (else pick another option of the first dropdown, else
    type into the first text box); returns what moved."""
    sliders = page.locator(f".jp-NotebookPanel:not(.lm-mod-hidden) {SLIDER}")
    if sliders.count():
        slider = sliders.first
        handle = slider.locator(SLIDER_HANDLE)
        handle.scroll_into_view_if_needed(timeout=10_000)
        before = float(handle.get_attribute("aria-valuenow"))
        highest = float(handle.get_attribute("aria-valuemax"))
        handle.focus()
        handle.press("ArrowRight" if before < highest else "ArrowLeft")
        wait_until(lambda: float(handle.get_attribute("aria-valuenow")) != before, 10,
                   f"the slider to move from {before:g}")
        label = (slider.locator("label").first.text_content() or "").strip()
        return f"slider {label!r} from {before:g}"
    panel = ".jp-NotebookPanel:not(.lm-mod-hidden) .jupyter-widgets"
    selects = page.locator(f"{panel} select")
    if selects.count():
        select = selects.first
        options = select.locator("option").all_text_contents()
        current = select.input_value()
        other = next(o for o in options if o != current)
        select.select_option(label=other)
        return f"dropdown from {current!r} to {other!r}"
    texts = page.locator(f"{panel}.widget-text input[type=text]")
    assert texts.count(), "the lesson shows no slider, dropdown or text box to move"
    box = texts.first
    box.scroll_into_view_if_needed(timeout=10_000)
    current = box.input_value()
    new = "1" if current != "1" else "0"
    box.fill(new)
    box.press("Enter")
    return f"text box from {current!r} to {new!r}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("relative", LESSONS, ids=[Path(p).stem for p in LESSONS])
def test_lesson_runs_answers_a_prediction_and_moves_a_widget(lab, browser, relative) -> None:
    import nbformat

    code = [c for c in nbformat.read(ROOT / relative, as_version=4).cells
            if c.cell_type == "code"]
    to_run = [i for i, cell in enumerate(code) if cell.source.strip()]
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        lab_page = LabPage(page, lab, OUT / Path(relative).stem)
        started = time.monotonic()
        with lab_page.step(f"open {relative}"):
            # A workspace of its own, reset: the earlier lessons' tabs are not restored.
            page.goto(lab.url(f"/lab/workspaces/{Path(relative).stem}/tree/{relative}?reset"),
                      wait_until="domcontentloaded", timeout=90_000)
            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").first \
                .wait_for(state="visible", timeout=90_000)
            lab_page.wait_kernel_idle(timeout=120)
            wait_until(lambda: len(lab_page.prompts()) == len(code), 30,
                       f"the page to show the file's {len(code)} code cells")
        with lab_page.step("Run > Run All Cells, to the end"):
            lab_page.run_all_cells()
            lab_page.wait_all_cells_done(to_run, timeout=420)
        with lab_page.step("no traceback in any output"):
            errors = lab_page.error_outputs()
            assert not errors, "\n---\n".join(errors)
        with lab_page.step("answer a prediction"):
            button = page.locator(PREDICT_BUTTON).first
            button.wait_for(state="attached", timeout=30_000)
            button.scroll_into_view_if_needed(timeout=10_000)
            button.click()
            box = page.locator(".mpgpu-predict").first
            wait_until(lambda: "recorded" in (box.text_content() or ""), 20,
                       "the prediction's 'recorded' note")
            lab_page.shot(box, "prediction")
            state = json.loads((lab.home / "course" / ".mpgpu" / "progress.json").read_text())
            lesson = Path(relative).stem[:2]
            assert any(k.startswith(f"{lesson}.") for k in state.get("predictions", {})), state
        with lab_page.step("move a widget"):
            moved = _move_a_widget(page)
            lab_page.wait_kernel_idle(timeout=60)
            assert not lab_page.error_outputs(), lab_page.error_outputs()
        print(f"{relative}: ran in {time.monotonic() - started:.0f} s; answered a prediction; "
              f"moved the {moved}")
    finally:
        context.close()
        for kernel in lab.kernels():  # one lesson's kernel at a time: the machine is small
            lab.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=10)
