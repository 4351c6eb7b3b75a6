# Set-up on a fresh machine is `make demo` or `make test`; both create .venv and
# (re)install the project from pyproject.toml with the exact versions in constraints.txt.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
OUT ?= runs/demo

.PHONY: venv install install-dev install-bench demo demo-live demo-real test test-portable \
	test-real test-under-load check bench lint typecheck check-flwr-141 clean

$(PY):
	$(PYTHON) -m venv $(VENV)

venv: $(PY)

install: venv
	$(PIP) install -c constraints.txt -e .

install-dev: venv
	$(PIP) install -c constraints.txt -e ".[dev]"

# dev plus python-paillier and gmpy2 for the HE section's Paillier baseline.
install-bench: venv
	$(PIP) install -c constraints.txt -e ".[dev,bench]"

# FedAvg against LB-BSP on 5 silos of emulated capacities 16:8:8:4:4, the silos' times from
# a cost model (the same table on every machine, however busy), run in this process.
DEMO_FLAGS := --dataset embedded --silos 5 --speeds 16,8,8,4,4 --partition labels:2 \
	--rounds 20 --local-steps 40 --batch-size 48 --lr 0.05 --seed 0 --quiet

demo: install
	$(VENV)/bin/fl-lbbsp compare $(DEMO_FLAGS) --model mlp --in-process --no-wait \
		--cost-model 1e-4,5e-4 --out $(OUT) --json $(OUT)/report.json

# The same federation on Flower's Simulation Engine (Ray), LeNet-5, each silo waiting out its
# slowdown so that the wall clock follows the emulated time: several minutes.
demo-live: install
	$(VENV)/bin/fl-lbbsp compare $(DEMO_FLAGS) --out $(OUT)-live --json $(OUT)-live/report.json

# LB-BSP against FedAvg on a local deployment whose silos are really slower (CPU groups with
# quotas 1/0.5/0.25 of a core): one pair, 4 short rounds, LeNet-5. Needs root and cgroups
# (it says why and writes nothing otherwise); a few minutes.
demo-real: install
	$(VENV)/bin/python benchmarks/bench_real_capacity.py --smoke --out $(OUT)-real --work $(OUT)-real

# The tests that make real CPU groups and start a federation in them (root only; `make test`
# skips them).
test-real: install-dev
	FL_LBBSP_REAL_GROUPS=1 $(VENV)/bin/python -m pytest -q tests/test_deploy_real.py

lint: install-dev
	$(VENV)/bin/ruff check fl_lbbsp tests examples benchmarks
	$(VENV)/bin/ruff format --check fl_lbbsp tests examples benchmarks

typecheck: install-dev
	$(VENV)/bin/mypy

test: install-dev
	$(MAKE) --no-print-directory check

# The same suite while 2 CPU-burning processes of its own share the machine (stopped by
# pid when it ends, passed or failed): no test may depend on how busy the machine is.
test-under-load: install-dev
	.ci/with-cpu-burners 2 $(MAKE) --no-print-directory check

# The suite with numpy's SIMD dispatch held down to its baseline (the AVX2 and AVX-512 paths
# of numpy 2.x switched off; a feature the CPU lacks is ignored), so that it runs as on a CPU
# of another kind: no test may hang on the last bit of a float sum. The end-to-end runs
# (`slow`: flwr run, deploy-local, the benchmarks' smoke runs) are left out: they assert what
# a run does, not figures, and `make test` runs them.
NPY_HELD_DOWN := X86_V3 X86_V4 AVX512_SKX AVX512_ICL AVX512_SPR AVX2 FMA3 AVX512F
test-portable: install-dev
	NPY_DISABLE_CPU_FEATURES="$(NPY_HELD_DOWN)" $(VENV)/bin/python -m pytest -q -m "not slow"

# ruff, mypy and pytest on what is installed (`make test` installs first).
check:
	$(VENV)/bin/ruff check fl_lbbsp tests examples benchmarks
	$(VENV)/bin/ruff format --check fl_lbbsp tests examples benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest -q

# The benchmark suite (not part of `make test`; its smoke version is): every section's JSON,
# PNGs and REPORT.md under benchmarks/results/. About two hours on 2 cores.
bench: install-bench
	$(PY) benchmarks/run_all.py --out benchmarks/results

# The plug-in tests against Flower 1.41.0 (pyproject.toml accepts flwr>=1.41), in a second
# virtual environment: constraints.txt with the pins of constraints-flwr141.txt in place of its own.
VENV141 ?= .venv-flwr141
PLUGIN_TESTS := tests/test_adapter.py tests/test_strategy.py tests/test_legacy.py \
	$(wildcard tests/test_quickstart_app.py)

check-flwr-141:
	test -x $(VENV141)/bin/python || $(PYTHON) -m venv $(VENV141)
	awk -F'==' 'NR == FNR { if (/^[^#]*==/) drop[tolower($$1)] = 1; next } \
		!(tolower($$1) in drop)' constraints-flwr141.txt constraints.txt \
		| cat - constraints-flwr141.txt > $(VENV141)/constraints.txt
	$(VENV141)/bin/python -m pip --disable-pip-version-check -q install \
		-c $(VENV141)/constraints.txt -e ".[dev]"
	$(VENV141)/bin/python -c "import flwr; assert flwr.__version__ == '1.41.0', flwr.__version__"
	$(VENV141)/bin/python -m pytest -q -p no:cacheprovider $(PLUGIN_TESTS)

clean:
	rm -rf $(VENV) $(VENV141) runs .pytest_cache .mypy_cache .ruff_cache
