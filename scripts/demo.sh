#!/usr/bin/env bash
# The main job: install, start the service on its embedded default (no Redis, no database
# server), and run two checks through the client, as CI would; each probes one published
# finding (the README gives the figures):
#   1. two seeds of one model: close under both protocols at shallow stitch points, parting
#      with depth under the invariance-aware one, yet above the threshold (exit 0);
#   2. a model that learnt a pixel shortcut: similar to the reference under the standard
#      protocol, exposed by the invariance-aware one (exit 1).
# The threshold 0.35 is this recipe's, measured under the default IRI method: between the
# shortcut model (0.25-0.33 over three trainings) and the benign retrains (another seed, an
# epoch more, another batch order: 0.41-0.63 and 0.57-0.73 in two series;
# bench/drift_power.py). Pick yours the same way (docs/client.md, "Choosing --max-drop").
# The report pages are written to files (--html), so they stay readable after the service
# stops. The three checkpoints are committed (examples/demo-models, made by `stitchsim-server
# demo-models --half examples/demo-models`; their digests are checked here, and a mismatch
# trains them afresh instead, a line per epoch). IRIs are cached in $demo. Each check prints its
# progress and ETA; while IRIs run the ETA is that of their cap (every round), so it starts high
# and only falls (docs/service.md, "Progress and ETA").
set -euo pipefail
cd "$(dirname "$0")/.."
phase() {  # a phase's name, with the time since the start: every phase says where it is
  echo "== [$(printf '%dm%02ds' $((SECONDS / 60)) $((SECONDS % 60)))] $*"
}

phase "installing the client and the server into .venv (minutes the first time, pip quiet)"
bash scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
demo=.stitchsim/demo
port="${STITCHSIM_PORT:-8000}"
export STITCHSIM_URL="http://127.0.0.1:$port"
mkdir -p "$demo"

models=examples/demo-models
if (cd "$models" && sha256sum --check --quiet SHA256SUMS) 2> /dev/null; then
  phase "the demo checkpoints: $models (digests checked against $models/SHA256SUMS)"
else
  models="$demo/models"
  phase "the committed checkpoints are missing or differ from their digests: training them" \
    "into $models (a small timm model on built-in digits; cached)"
  stitchsim-server demo-models "$models"
fi

phase "starting the service on $STITCHSIM_URL (embedded default)"
stitchsim-server serve --port "$port" --data-dir "$demo/data" > "$demo/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -fs "$STITCHSIM_URL/readyz" > /dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { cat "$demo/serve.log"; exit 1; }
  sleep 1
done

check() {  # name, front, back, extra options...
  local name=$1 front=$2 back=$3
  shift 3
  status=0
  stitchsim check "$models/$front.safetensors" "$models/$back.safetensors" \
    --spec examples/demo-spec.json --threshold 0.35 \
    --json "$demo/$name.json" --html "$demo/$name.html" "$@" || status=$?
  echo "exit code $status (0: similar, 1: below threshold)"
}

echo "== 1. stitchsim check reference retrained: the same model trained from another seed"
check seeds reference retrained
echo "== 2. stitchsim check shortcut reference: a model trained with a class-coloured marker"
# The conflict probe: the same digits, each with another class's marker (report.probes).
check shortcut shortcut reference --dataset digits_marker --probe digits_marker_conflict

echo "== what the two reports show"
python3 scripts/demo_findings.py "$demo/seeds.json" "$demo/shortcut.json" || true
echo
echo "report pages (files; the service stops with this script):"
echo "  $PWD/$demo/seeds.html"
echo "  $PWD/$demo/shortcut.html"
