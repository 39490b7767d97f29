#!/usr/bin/env bash
# The main job: install, start the service on its embedded default (no Redis, no database
# server), and compare two demo checkpoints through the client, as a CI check would.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
demo=.stitchsim/demo
port="${STITCHSIM_PORT:-8000}"
export STITCHSIM_URL="http://127.0.0.1:$port"

echo "== training the demo checkpoints (small timm models on built-in digits; cached)"
stitchsim-server demo-models "$demo/models"

echo "== starting the service on $STITCHSIM_URL (embedded default)"
stitchsim-server serve --port "$port" --data-dir "$demo/data" > "$demo/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -fs "$STITCHSIM_URL/readyz" > /dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { cat "$demo/serve.log"; exit 1; }
  sleep 1
done

echo "== stitchsim check: reference vs a retrained model (another seed)"
status=0
stitchsim check "$demo/models/reference.safetensors" "$demo/models/retrained.safetensors" \
  --spec examples/demo-spec.json --threshold 0.8 --json "$demo/report.json" || status=$?
echo "exit code $status (0: similar, 1: below threshold); report: $demo/report.json"
echo "(two seeds of a tiny model agree under the standard protocol; the invariance-aware"
echo " protocol shows how much of that agreement rests on invariances they do not share)"
job=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['job_id'])" "$demo/report.json" 2>/dev/null || true)
[ -n "$job" ] && echo "page with plots: $STITCHSIM_URL/jobs/$job/report.html"
