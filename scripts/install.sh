#!/usr/bin/env bash
# Creates .venv (once) and installs the client, the server and, with --test, the test tools.
# torch/torchvision are pinned by constraints.txt to the pair our machines install from disk.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints.txt -e ./client -e ".${extras}"
