#!/usr/bin/env bash
# The test command: install (once) into .venv, then run the whole suite.
# Needs Redis on 127.0.0.1:6379 (and uses PostgreSQL on 127.0.0.1:5432 when it answers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
