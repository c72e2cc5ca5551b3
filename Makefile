# mpgpu-edu: the course in two commands.
#   make course   set up .venv (first time only) and open the notebooks in JupyterLab
#   make test     set up .venv (first time only) and run every test
#   make quick    the fast tests only, for everyday iteration
#   make doctor   is this machine ready for the course?
#   make clean    remove caches and build leftovers (keeps .venv); make distclean also drops .venv

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Every install goes through the constraints file: it pins torch==2.13.0 and the rest.
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check -c constraints.txt
# Reinstall only when the dependency lists change.
STAMP := $(VENV)/.mpgpu-installed
# JupyterLab's defaults for the course: no "Jupyter news?" prompt, no update check.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: course test quick doctor setup clean distclean wheelhouse

course: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

# Every test, then every notebook top to bottom twice (nbval): with the learner's stubs (every
# cell runs, checks say "not implemented", demos run the reference and say so) and with the
# solutions (every check must pass), where each solved function logs the calls made outside
# the checks: the last step proves that the lessons' demos ran the learner's code.
NBVAL := $(PY) -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider -q \
	-o addopts="" --timeout=300 notebooks
SOLVED := artifacts/solved
CALL_LOG := $(CURDIR)/artifacts/demo_calls.log
test: setup
	$(PY) -m pytest tests -q
	MPGPU_EDU_IMPL=exercises $(NBVAL)
	$(PY) -m tests.instrument $(SOLVED) > /dev/null && rm -f $(CALL_LOG)
	MPGPU_EDU_IMPL=$(CURDIR)/$(SOLVED) MPGPU_EDU_CALL_LOG=$(CALL_LOG) MPGPU_EDU_STRICT=1 $(NBVAL)
	$(PY) -m tests.instrument --verify $(CALL_LOG)

# Everyday iteration: the package's tests without the slow, gloo, notebook and browser ones.
quick: setup
	$(PY) -m pytest tests -q -m "not slow and not gloo and not notebooks and not browser and not mutants"

doctor: setup
	$(VENV)/bin/mpgpu-edu doctor

setup: $(STAMP) $(LAB_OVERRIDES)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PIP_INSTALL) -e '.[test]'
	touch $(STAMP)

$(LAB_OVERRIDES): $(STAMP)
	mkdir -p $(dir $(LAB_OVERRIDES))
	printf '%s\n' '{"@jupyterlab/apputils-extension:notification":' \
		' {"fetchNews": "false", "checkForUpdates": false}}' > $(LAB_OVERRIDES)

# For a room without good internet: build every wheel once, copy the folder (USB stick), then on
# each machine:  PIP_NO_INDEX=1 PIP_FIND_LINKS=$$PWD/wheelhouse make course
WHEELHOUSE ?= wheelhouse
wheelhouse: $(PY)
	$(PY) -m pip wheel --disable-pip-version-check -c constraints.txt -w $(WHEELHOUSE) '.[test]'
	$(PY) -m pip download --disable-pip-version-check -d $(WHEELHOUSE) setuptools wheel pip
	@echo "wheelhouse ready: $(WHEELHOUSE) ($$(ls $(WHEELHOUSE) | wc -l) files)"

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis artifacts
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) \
		-type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
