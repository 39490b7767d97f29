#!/usr/bin/env bash
# The test command: install (once) into .venv, then run the whole suite.
# Needs Redis on 127.0.0.1:6379 (and uses PostgreSQL on 127.0.0.1:5432 when it answers).
# With CI=true (.ci/run) a missing Redis, PostgreSQL or Chromium fails the tests that need
# it instead of skipping them (tests/environment.py); pytest's header lists what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
.venv/bin/ruff check .
# Two test processes, each taking whole files (their module fixtures start services and train
# models once): most tests wait on servers and workers, so two share two cores well (11-12
# min against 20 serial). STITCHSIM_TEST_PROCESSES=0 runs in this process.
exec .venv/bin/python -m pytest -n "${STITCHSIM_TEST_PROCESSES:-2}" --dist loadfile "$@"
