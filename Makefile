# The two Quickstart commands: `make run` (set up, then the main job on the embedded default)
# and `make test` (set up, then the whole test suite). Both are idempotent.
.PHONY: setup run test lint bench lock

setup:
	@scripts/setup.sh

run: setup
	.venv/bin/evalrun run $(ARGS)

test: setup
	.venv/bin/python -m pytest -q $(ARGS)

lint: setup
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python scripts/bench_overhead.py

# Regenerate requirements/{cpu,gpu}.lock after a dependency change in pyproject.toml (README "Setup").
lock:
	scripts/lock.sh $(ARGS)
