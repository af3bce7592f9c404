# disagg — see README.md. Everything runs from a local virtual environment (.venv);
# slow builds (Kubernetes binaries, etcd, kwok, helm, Prometheus) are cached under ~/.cache/disagg.
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
DISAGG    := $(BIN)/disagg
PYTEST_ARGS ?=

.PHONY: venv test unit lint crds demo cluster-up cluster-down bench clean

$(BIN)/disagg: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $(BIN)/disagg

venv: $(BIN)/disagg

## make test: lint, type-check, then every test (unit, golden, integration, e2e) on the local control plane
test: venv lint
	$(BIN)/pytest $(PYTEST_ARGS)

## make unit: the tests that need no control plane
unit: venv
	$(BIN)/pytest -m "not integration and not e2e" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check operator tests bench
	$(BIN)/ruff format --check operator tests bench
	$(BIN)/mypy

crds: venv
	$(DISAGG) crds

## make demo: the closed loop on the local control plane (builds the binaries on first use)
demo: venv
	$(DISAGG) demo

cluster-up: venv
	$(DISAGG) cluster up

cluster-down: venv
	$(DISAGG) cluster down

bench: venv
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache reports
