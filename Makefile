# disagg — see README.md. Everything runs from a local virtual environment (.venv);
# slow builds (Kubernetes binaries, etcd, kwok, helm, Prometheus) are cached under ~/.cache/disagg.
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
DISAGG    := $(BIN)/disagg
PYTEST_ARGS ?=

.PHONY: venv test unit lint crds chart-docs golden demo cluster-build cluster-up cluster-down bench bench-twin policy-table clean

$(BIN)/disagg: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,twin]'
	@touch $(BIN)/disagg

venv: $(BIN)/disagg

## make test: lint, type-check, then every test (unit, golden, integration, e2e) on the local control plane
test: venv lint
	$(BIN)/pytest $(PYTEST_ARGS)

## make unit: the tests that need no control plane, less the slow ones (marked slow: they run in make test)
unit: venv
	$(BIN)/pytest -m "not integration and not e2e and not slow" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check operator tests bench
	$(BIN)/ruff format --check operator tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

## make crds: regenerate crds/ from the API models and copy them into the charts (disagg-operator/crds, disagg-crds/templates)
crds: venv
	$(DISAGG) crds
	sh charts/sync-crds.sh

## make golden: regenerate the golden manifests of every example (review the diff!)
## make chart-docs: the chart's policy library copy and both charts' READMEs (helm-docs, from values.yaml's comments)
chart-docs: venv
	sh charts/sync-policies.sh
	helm_docs=$$($(BIN)/python -c 'from disagg.cluster.binaries import ensure_binary; print(ensure_binary("helm-docs"))') \
	  && cd charts && $$helm_docs --chart-search-root . --template-files README.md.gotmpl

golden: crds
	for f in examples/*.yaml; do $(DISAGG) render -f $$f > tests/golden/$$(basename $$f) || exit 1; done

## make demo: the closed loop on the local control plane (builds the binaries on first use)
demo: venv
	$(DISAGG) demo

## make cluster-build: build or reuse the control-plane programs in ~/.cache/disagg (cold: ~20 min on 2 cores)
cluster-build: venv
	$(DISAGG) cluster build

cluster-up: venv
	$(DISAGG) cluster up

cluster-down: venv
	$(DISAGG) cluster down

## make bench: every benchmark under bench/ (some start a local control plane; minutes)
bench: venv
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

## make policy-table: replay each library policy through the twin and rewrite the table in policies/README.md
policy-table: venv
	$(BIN)/python bench/policy_table.py --write

## make bench-twin: the simulator's speed and P/D vs colocated goodput (about 30 s)
bench-twin: venv
	$(BIN)/python bench/twin_speed.py
	$(BIN)/python bench/pd_vs_colocated.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache reports
