#!/usr/bin/env bash
# Lints the migrations with squawk (PyPI `squawk-cli`, installed here at a pinned version where it
# is missing): every statement must be safe while the previous release still runs against the new
# schema (migrations/README.md). .squawk.toml names the rules left out and the baseline of
# migrations landed before the lint. A migration whose first line is `-- no-transaction` runs
# outside a transaction (sqlx's marker) and is linted as one. Fails on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."

version=2.70.0
# Pinned, in a venv of its own under target/ (a system Python may refuse `pip install`), made once
# and kept.
venv=target/squawk-venv
squawk=$venv/bin/squawk
if ! "$squawk" --version 2>/dev/null | grep -qx "squawk $version"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "squawk-cli==$version"
fi

in_transaction=()
outside=()
for migration in migrations/*.sql; do
  if head -n 1 "$migration" | grep -qx -- '-- no-transaction'; then
    outside+=("$migration")
  else
    in_transaction+=("$migration")
  fi
done
"$squawk" --config .squawk.toml "${in_transaction[@]}"
if ((${#outside[@]})); then
  "$squawk" --config .squawk.toml --no-assume-in-transaction "${outside[@]}"
fi
