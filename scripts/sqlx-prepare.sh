#!/usr/bin/env bash
# Regenerates the compile-time query data in .sqlx/ against a throwaway PostgreSQL with the
# migrations applied, so that builds (SQLX_OFFLINE=true) need no database.
set -euo pipefail
cd "$(dirname "$0")/.."

image=$(bash scripts/pg-image.sh | tail -n 1)
container=$(docker run -d --rm -p 127.0.0.1::5432 -e POSTGRES_PASSWORD=postgres "$image" -c fsync=off)
trap 'docker rm -f "$container" >/dev/null' EXIT
port=$(docker port "$container" 5432/tcp | sed -n 's/^127\.0\.0\.1://p' | head -n 1)

for _ in $(seq 100); do
  docker exec "$container" pg_isready -U postgres -h 127.0.0.1 >/dev/null 2>&1 && break
  sleep 0.1
done
for migration in migrations/*.sql; do
  docker exec -i "$container" psql -q -v ON_ERROR_STOP=1 -U postgres <"$migration"
done

# The query macros write their data when SQLX_OFFLINE_DIR is set; touching the sources makes
# them expand again. A crate reads the .sqlx/ in its own folder first, then the workspace's: the
# mechanism keeps its own (crates/idempotency/.sqlx), so that it builds where it is packaged alone
# (`cargo package -p idempotency`), and the workspace's holds every other query.
database_url="postgres://postgres:postgres@127.0.0.1:$port/postgres"
mechanism=crates/idempotency/.sqlx
rm -rf .sqlx "$mechanism"
mkdir .sqlx "$mechanism"
touch crates/idempotency/src/lib.rs
SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$PWD/$mechanism" DATABASE_URL="$database_url" \
  cargo check -p idempotency --all-targets --all-features --quiet
touch src/lib.rs crates/*/src/lib.rs
SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$PWD/.sqlx" DATABASE_URL="$database_url" \
  cargo check --workspace --all-targets --all-features --quiet
for query in "$mechanism"/*.json; do
  rm -f ".sqlx/$(basename "$query")"
done
echo "wrote $(ls .sqlx | wc -l) query files to .sqlx/, $(ls "$mechanism" | wc -l) to $mechanism/" >&2
