#!/usr/bin/env bash
# plan.yml "Comment the plan on the pull request": one comment per pull request, found by its marker
# (the first line) among github-actions[bot]'s comments and edited in place, or created once.
# Env: GH_TOKEN, REPO (owner/name), PR (number), MARKER, PLAN (the markdown file, default plan.md).
set -euo pipefail
: "${REPO:?}" "${PR:?}" "${MARKER:?}"
plan="${PLAN:-plan.md}"

body="$(printf '%s\n\n%s\n' "$MARKER" "$(cat "$plan")")"
ids="$(gh api --paginate "repos/$REPO/issues/$PR/comments" \
    --jq ".[] | select(.user.login == \"github-actions[bot]\" and (.body | startswith(\"$MARKER\"))) | .id")"
comment_id="${ids%%$'\n'*}"
if [[ -n "$comment_id" ]]; then
    gh api --method PATCH "repos/$REPO/issues/comments/$comment_id" -f body="$body" >/dev/null
else
    gh api --method POST "repos/$REPO/issues/$PR/comments" -f body="$body" >/dev/null
fi
