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

.PHONY: course test doctor setup clean distclean wheelhouse

course: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

# Every test, then every notebook top to bottom twice (nbval): with the learner's stubs (every
# cell runs, checks say "not implemented") and with the solutions (every check must pass).
NBVAL := $(PY) -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider -q \
	-o addopts="" --timeout=300 notebooks
test: setup
	$(PY) -m pytest tests -q
	MPGPU_EDU_IMPL=exercises $(NBVAL)
	MPGPU_EDU_IMPL=solutions MPGPU_EDU_STRICT=1 $(NBVAL)

doctor: setup
	$(VENV)/bin/mpgpu-edu doctor

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PIP_INSTALL) -e '.[test]'
	touch $(STAMP)

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
