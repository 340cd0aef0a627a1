# Set-up on a fresh machine, then the main job / the tests.
#   make run    the main job (installs everything first)
#   make test   the test suite (installs everything first)
#   make docs   the documentation site, docs/_build/html
#   make notebooks  re-execute notebooks/*.ipynb and store them with their outputs
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test docs notebooks bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch 2.13.0 first: a local CPU wheel that then satisfies the `learning` range.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[learning,flower,dev,docs]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ebfl demo

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

# The documentation site (warnings are errors) into docs/_build/html.
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -b html -W --keep-going -q docs docs/_build/html

# Each notebook in a fresh kernel from notebooks/, stored with its outputs; the ones
# that read a dataset need it in the data home (EBFL_DATA).
notebooks: $(STAMP)
	$(PY) notebooks/execute.py

bench: $(STAMP)
	$(PY) benchmarks/bench_beta_bernoulli.py
	$(PY) benchmarks/bench_npmle.py --large
	$(PY) benchmarks/bench_validation.py
	$(PY) benchmarks/bench_federated.py
	$(PY) benchmarks/bench_adaped.py --model cnn
	$(PY) benchmarks/bench_adaped.py --model mlp
	$(PY) benchmarks/bench_fedhdp.py
	$(PY) benchmarks/bench_flower.py
	$(PY) benchmarks/bench_dppfl.py
	$(PY) benchmarks/bench_pfl.py

lint: $(STAMP)
	$(VENV)/bin/ruff check ebfl tests benchmarks docs/_ext docs/figures

clean:
	rm -rf $(VENV)
