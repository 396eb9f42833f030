# HCS Portal: `make run` starts the whole portal on the embedded default, `make test` runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt pyproject.toml | sha1sum | cut -c1-12)

.PHONY: venv vram run demo test lint bench bench-django bench-slurm bench-api bench-demo bench-reaction gpu-check slurm-up slurm-down clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .  # the `hcs` command-line client
	rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP)

VRAM_LIB := native/vram/build/libhcsvram.so

vram: $(VRAM_LIB)  ## the VRAM interceptor that holds shares of a card to their memory (docs/vram.md)

$(VRAM_LIB): native/vram/hcsvram.c
	mkdir -p $(@D)
	$(CC) -O2 -g -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden -o $@.tmp $< -ldl -lpthread
	chmod 0644 $@.tmp && mv $@.tmp $@

HOST ?= 127.0.0.1
PORT ?= 8000

run: venv  ## web (ASGI + WebSocket), Celery worker and beat, embedded Redis and SQLite unless configured; `make run PORT=8080 HOST=0.0.0.0`
	bash scripts/setup_local_jobs.sh || echo "local jobs cannot run isolated here; the local cluster will say why"
	$(MAKE) -s vram || echo "no VRAM interceptor (needs a C compiler): local tasks on part of a card are refused"
	$(BIN)/python manage.py runportal --host $(HOST) --port $(PORT)

lint: venv  ## ruff, and the import contracts of pyproject.toml (docs/architecture.md)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=. $(BIN)/lint-imports --no-cache

# Test processes (pytest-xdist): two per core, as many tests wait on jobs, sockets and timers rather than compute.
TEST_WORKERS ?= $(shell echo $$((2 * $$(nproc))))

test: venv lint vram  ## lint, Django checks, migrations up to date, the whole pytest suite in parallel with its coverage
	$(BIN)/python manage.py check
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --cov --cov-report= $(PYTEST_ARGS)

bench: venv  ## every engine benchmark, each prints a table
	$(BIN)/python -m benchmarks.run_all

bench-django: venv  ## one scheduling cycle through Django on PostgreSQL (needs DATABASE_URL=postgres://...)
	$(BIN)/python -m benchmarks.django_cycle

bench-slurm: venv  ## the portal vs raw sbatch on the dev Slurm cluster (needs DATABASE_URL and REDIS_URL, root)
	$(BIN)/python -m benchmarks.slurm_control

bench-api: venv  ## submit and list latency at 1/10/50 clients on the real web server (needs DATABASE_URL=postgres://... and REDIS_URL)
	$(BIN)/python -m benchmarks.api_load

bench-demo: venv  ## submit -> running on the demo as `make run` starts it (embedded default), next to raw bwrap
	$(BIN)/python -m benchmarks.demo_submit

bench-reaction: venv  ## the autoscaler's reaction time (load step -> new replica serving) through the real worker pools, quiet and busy
	$(BIN)/python -m benchmarks.autoscale_reaction

slurm-up:  ## a real dev Slurm cluster on this host (installs Debian's slurm-wlm when missing)
	bash scripts/dev_slurm.sh start

slurm-down:
	bash scripts/dev_slurm.sh stop

gpu-check:  ## on a host with an NVIDIA card: the NVML report, the VRAM interceptor and remote GPU on the real card
	$(PYTHON) scripts/gpu_check.py

clean:
	rm -rf var/ .pytest_cache .ruff_cache
