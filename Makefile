# Two commands do all the set-up on a fresh machine:
#   make run    venv + package + MPI, every kernel compiled once (mpikmeans warmup), a demo input,
#               then mpirun -np 2 mpikmeans run
#   make test   venv + package + test tools, then the whole suite (MPI tests included)

PYTHON   ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.installed
NP       ?= 2
DEMO     ?= data/demo.arff
DEMO_N   ?= 200000
DEMO_M   ?= 16
DEMO_K   ?= 8
PYTEST_ARGS ?=

# Open MPI refuses root unless told; more ranks than cores need --oversubscribe
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export PRTE_MCA_rmaps_default_mapping_policy := :oversubscribe

.PHONY: run test venv warm clean system-test-deps

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[mpi,test]"
	touch $(STAMP)

$(DEMO): | $(STAMP)
	mkdir -p $(dir $(DEMO))
	$(BIN)/mpirun -np $(NP) $(BIN)/mpikmeans gen-data $(DEMO) -n $(DEMO_N) -m $(DEMO_M) -k $(DEMO_K) --seed 1

# every kernel of this machine, once (the shared cache; later runs compile nothing)
warm: $(STAMP)
	$(BIN)/mpikmeans warmup

run: $(STAMP) warm $(DEMO)
	$(BIN)/mpirun -np $(NP) --bind-to none $(BIN)/mpikmeans run $(DEMO) -k $(DEMO_K) --output-dir data/demo.mpikmeans --overwrite

# Best effort, Debian packages (tests skip and say why where these are missing):
# a real one-node Slurm for tests/test_slurm_real.py (~15 s, needs root), and Weka
# for tests/test_weka.py (its .deb unpacked into .venv/weka: no root, ~2 s).
SLURM_PKGS := slurmctld slurmd slurm-client libpmix-dev
system-test-deps: | $(STAMP)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		need=""; \
		command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need="slurm"; \
		[ -f /usr/share/java/weka.jar ] || [ -f $(VENV)/weka/usr/share/java/weka.jar ] || need="$$need weka"; \
		if [ -n "$$need" ]; then apt-get update -qq >/dev/null 2>&1 || true; fi; \
		case "$$need" in *slurm*) echo "installing a local Slurm for the job-template tests"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SLURM_PKGS) \
				>/dev/null 2>&1 || echo "Slurm not installed: its test will skip";; esac; \
		case "$$need" in *weka*) echo "unpacking Weka into $(VENV)/weka for the Weka tests"; \
			(cd $(VENV) && apt-get download weka >/dev/null 2>&1 && dpkg-deb -x weka_*.deb weka && rm -f weka_*.deb) \
				|| echo "Weka not available: its tests will skip";; esac; \
	fi

test: $(STAMP) system-test-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q --durations=20 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) data/demo.arff data/*.mpikmeans
