"""Notebooks are stored clean: no outputs, no execution counts, no saved widget state.

Outputs belong to the learner's run, not to git. To clean a notebook:
``.venv/bin/jupyter nbconvert --clear-output --inplace notebooks/NAME.ipynb``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "exercises", "solutions")
CLEAN_COMMAND = ".venv/bin/jupyter nbconvert --clear-output --inplace"


def find_notebooks(root: Path) -> list[Path]:
    found = []
    for folder in FOLDERS:
        found += [path for path in sorted((root / folder).rglob("*.ipynb"))
                  if ".ipynb_checkpoints" not in path.parts]
    return found


def notebook_problems(path: Path) -> list[str]:
    """What makes ``path`` not clean, one line each; an empty list when it is clean."""
    notebook = nbformat.read(path, as_version=4)
    problems = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {index} has {len(cell.outputs)} output(s)")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {index} has execution count {cell.execution_count}")
    if "widgets" in notebook.metadata:
        problems.append("notebook metadata holds saved widget state ('widgets')")
    return problems


def test_every_notebook_is_clean() -> None:
    assert (ROOT / "notebooks").is_dir()  # the scan below looked in the right place
    dirty = {}
    for path in find_notebooks(ROOT):
        problems = notebook_problems(path)
        if problems:
            dirty[str(path.relative_to(ROOT))] = problems
    assert not dirty, f"clean these with `{CLEAN_COMMAND} FILE`: {dirty}"


def test_the_checker_finds_outputs_and_counts(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# A lesson"),
                      nbformat.v4.new_code_cell("1 + 1", execution_count=3, outputs=[
                          nbformat.v4.new_output("execute_result", {"text/plain": "2"},
                                                 execution_count=3)])]
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    (tmp_path / "notebooks").mkdir()
    path = tmp_path / "notebooks" / "00_welcome.ipynb"
    nbformat.write(notebook, path)
    assert find_notebooks(tmp_path) == [path]
    assert notebook_problems(path) == ["cell 1 has 1 output(s)", "cell 1 has execution count 3",
                                       "notebook metadata holds saved widget state ('widgets')"]

    notebook.cells[1].outputs = []
    notebook.cells[1].execution_count = None
    del notebook.metadata["widgets"]
    nbformat.write(notebook, path)
    assert notebook_problems(path) == []
