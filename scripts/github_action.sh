#!/usr/bin/env bash
# The GitHub Action's step (action.yml): install the client from this repository, run
# `stitchsim check`, write its Markdown to $GITHUB_STEP_SUMMARY, comment on the pull request
# when asked, and set the outputs `status` and `exit-code`.
#
# Inputs come as STITCHSIM_ACTION_* variables (action.yml maps them); the service's URL and key
# as STITCHSIM_URL / STITCHSIM_API_KEY. Runs outside Actions too (tests, other CIs): every
# GITHUB_* variable is optional.
#
# Exit: the check's code (stitchsim --help), but the warn band (5) passes with a ::warning::
# unless STITCHSIM_ACTION_FAIL_ON_WARN=true.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
action_dir="${GITHUB_ACTION_PATH:-$here}"
python="${STITCHSIM_ACTION_PYTHON:-python3}"
out_dir="${STITCHSIM_ACTION_OUT:-${RUNNER_TEMP:-$(mktemp -d)}/stitchsim}"
mkdir -p "$out_dir"
markdown="$out_dir/summary.md"

if [ "${STITCHSIM_ACTION_INSTALL:-true}" = "true" ]; then
  "$python" -m pip install --quiet --disable-pip-version-check "$action_dir/client" || {
    echo "::error::could not install the stitchsim client from $action_dir/client"; exit 3; }
fi

args=(check "${STITCHSIM_ACTION_REFERENCE:?reference is required}"
      "${STITCHSIM_ACTION_CANDIDATE:?candidate is required}"
      --progress lines --markdown "$markdown"
      --junit-xml "$out_dir/junit.xml" --json "$out_dir/report.json")
add() { if [ -n "${2:-}" ]; then args+=("$1" "$2"); fi; }
add --threshold "${STITCHSIM_ACTION_THRESHOLD:-}"
add --baseline "${STITCHSIM_ACTION_BASELINE:-}"
add --gate "${STITCHSIM_ACTION_GATE:-}"
add --max-drop "${STITCHSIM_ACTION_MAX_DROP:-}"
add --max-relative-drop "${STITCHSIM_ACTION_MAX_RELATIVE_DROP:-}"
add --warn-below "${STITCHSIM_ACTION_WARN_BELOW:-}"
for probe in ${STITCHSIM_ACTION_PROBES:-}; do args+=(--probe "$probe"); done
if [ -n "${STITCHSIM_ACTION_ARGS:-}" ]; then
  # Extra arguments as the workflow writes them (shell quoting applies).
  eval "extra=(${STITCHSIM_ACTION_ARGS})"
  args+=("${extra[@]}")
fi

"$python" -m stitchsim.cli "${args[@]}"
rc=$?

case "$rc" in
  0) status=pass ;; 1) status=fail ;; 5) status=warn ;; *) status=error ;;
esac
if [ ! -s "$markdown" ]; then  # no report and no error summary: say why in words
  printf '<!-- stitchsim-check -->\n### stitchsim check: ❌ ERROR\n\nexit code %s: see the step log.\n' \
    "$rc" > "$markdown"
fi
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  cat "$markdown" >> "$GITHUB_STEP_SUMMARY"
fi
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  { echo "status=$status"; echo "exit-code=$rc"; echo "summary=$markdown"; } >> "$GITHUB_OUTPUT"
fi
if [ "${STITCHSIM_ACTION_COMMENT:-false}" = "true" ]; then
  "$python" "$action_dir/scripts/github_comment.py" "$markdown" ||
    echo "::warning::could not comment on the pull request (the check's result stands)"
fi

if [ "$rc" -eq 5 ] && [ "${STITCHSIM_ACTION_FAIL_ON_WARN:-false}" != "true" ]; then
  echo "::warning::stitchsim check: in the warn band (similarity below --warn-below)"
  exit 0
fi
exit "$rc"
