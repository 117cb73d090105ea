# plexgpu — two commands on a fresh machine:
#   make demo   set up .venv, synthesize the demo data, run the workflow on it (CPU, written in config/demo.yaml)
#   make test   set up .venv, run the whole test suite (make check: lint + the fast tier, no SLURM)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.plexgpu-installed
CORES  ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: demo test check lint venv clean-demo bench bench-env

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@test -f demo/raw/experiment.json || $(BIN)/plexgpu synth demo/raw --cycles 3 --grid 6x6 --tile 192x192 --z 5 --channels 2 --seed 0
	$(BIN)/plexgpu validate --configfile config/demo.yaml
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake registration --configfile config/demo.yaml --profile profiles/local
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake qc --configfile config/demo.yaml --profile profiles/local
	@echo
	@echo "plexgpu demo finished:"
	@echo "  raw data (synthetic, truth in demo/raw/truth/):  demo/raw"
	@echo "  registered multiplex image:                       demo/results/registered/plex.ome.tif"
	@echo "  per cycle: demo/results/{stitched,deconvolved,edf,registered}/cyc00N/"
	@echo "  QC report:                                        demo/results/qc/index.html"
	@echo "  logs:                                             demo/results/logs/"

# lint first: ruff (config in pyproject.toml), snakefmt on the rules, and snakemake --lint (exit 1 on any
# lint) on a 2x2-tile synthetic data set made for it in a temporary folder (the Snakefile reads the raw
# data's layout when it is parsed)
lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/snakefmt --check --line-length 110 Snakefile rules/
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	  $(BIN)/plexgpu synth "$$d/raw" --cycles 1 --grid 2x2 --tile 64x64 --z 3 --channels 1 --seed 0 >/dev/null && \
	  printf 'raw_dir: %s/raw\nresults_dir: %s/results\n' "$$d" "$$d" > "$$d/config.yaml" && \
	  PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --lint --configfile "$$d/config.yaml" && echo "snakemake --lint: clean"

test: lint
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest

# the fast tier while working: lint + every test that needs no SLURM cluster and is not marked slow
# (no workflow runs end to end, no real-data runs); `make test` stays the full suite CI runs
check: lint
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -m "not slurm and not slow" -q

# basicpy 2.0.0 (the BaSiC reference) pins scipy<1.13 and needs torch: its own environment,
# CPU torch from the wheel present on these machines.
bench/.venv-basicpy/.ok:
	$(PYTHON) -m venv bench/.venv-basicpy
	bench/.venv-basicpy/bin/pip install -q torch==2.13.0
	bench/.venv-basicpy/bin/pip install -q basicpy==2.0.0
	@touch $@

# ASHLAR 1.20 (the stitching peer): its own environment too.
bench/.venv-ashlar/.ok:
	$(PYTHON) -m venv bench/.venv-ashlar
	bench/.venv-ashlar/bin/pip install -q ashlar==1.20.0
	@touch $@

bench-env: bench/.venv-basicpy/.ok bench/.venv-ashlar/.ok

bench: $(STAMP) bench-env
	cd bench && PATH="$(CURDIR)/$(BIN):$$PATH" ../$(BIN)/python run_all.py

clean-demo:
	rm -rf demo
