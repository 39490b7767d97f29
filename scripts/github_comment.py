"""Post (or update) the check's Markdown as a pull-request comment: standard library only,
so it runs wherever the action's Python does.

    python github_comment.py SUMMARY.md

Needs GITHUB_TOKEN, GITHUB_REPOSITORY and the pull request's number (from the event file at
GITHUB_EVENT_PATH, or STITCHSIM_ACTION_PR); GITHUB_API_URL defaults to https://api.github.com.
A comment of an earlier run (it opens with the summary's marker) is edited instead of adding
another, so a pull request keeps one stitchsim comment.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

MARKER = "<!-- stitchsim-check -->"


def pr_number() -> int | None:
    given = os.environ.get("STITCHSIM_ACTION_PR")
    if given:
        return int(given)
    event = os.environ.get("GITHUB_EVENT_PATH")
    if not event or not Path(event).is_file():
        return None
    data = json.loads(Path(event).read_text(encoding="utf-8"))
    number = (data.get("pull_request") or {}).get("number") or data.get("number")
    return int(number) if number else None


def call(method: str, url: str, token: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        url, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
                 "Content-Type": "application/json", "User-Agent": "stitchsim-action"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return json.loads(text) if text else None


def main(summary: str) -> int:
    token, repo = os.environ.get("GITHUB_TOKEN"), os.environ.get("GITHUB_REPOSITORY")
    number = pr_number()
    if not token or not repo or number is None:
        print("stitchsim: no pull request to comment on (GITHUB_TOKEN, GITHUB_REPOSITORY and "
              "a pull_request event are needed)", file=sys.stderr)
        return 0
    api = os.environ.get("GITHUB_API_URL", "https://api.github.com").rstrip("/")
    body = {"body": Path(summary).read_text(encoding="utf-8")}
    comments = f"{api}/repos/{repo}/issues/{number}/comments"
    mine = [c for c in call("GET", f"{comments}?per_page=100", token) or []
            if str(c.get("body", "")).startswith(MARKER)]
    if mine:
        call("PATCH", f"{api}/repos/{repo}/issues/comments/{mine[-1]['id']}", token, body)
    else:
        call("POST", comments, token, body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
