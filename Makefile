# mpgpu-edu: the course in two commands.
#   make course   set up .venv (first time only) and open the notebooks in JupyterLab
#   make test     set up .venv (first time only) and run every test
#   make doctor   is this machine ready for the course?
#   make clean    remove caches and build leftovers (keeps .venv); make distclean also drops .venv

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Every install goes through the constraints file: it pins torch==2.13.0 and the rest.
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check -c constraints.txt
# Reinstall only when the dependency lists change.
STAMP := $(VENV)/.mpgpu-installed
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: course test doctor setup clean distclean

course: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

test: setup
	$(PY) -m pytest tests -q
# Next, with the notebooks: run them top to bottom with nbval, e.g.
#	$(PY) -m pytest --nbval-lax notebooks -q

doctor: setup
	$(VENV)/bin/mpgpu-edu doctor

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PIP_INSTALL) -e '.[test]'
	touch $(STAMP)

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis artifacts
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) \
		-type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
