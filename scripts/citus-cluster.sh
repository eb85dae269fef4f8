#!/usr/bin/env bash
# A Citus cluster on this machine: a coordinator and two workers (IDEMPAY_CITUS_WORKERS), each a
# container of the image scripts/citus-image.sh finds or builds, the workers registered with the
# coordinator.
#
#   scripts/citus-cluster.sh up     starts the cluster (or finds it running); prints the
#                                   coordinator's database URL as the last line of stdout
#   scripts/citus-cluster.sh url    prints the URL of the running cluster
#   scripts/citus-cluster.sh ports  prints each node's role and port, one a line, coordinator
#                                   first: `coordinator 41234`, then `worker 39876` per worker
#   scripts/citus-cluster.sh down   removes its containers
#
# The nodes share the host's network and listen on free ports of 127.0.0.1, as the bench's
# PostgreSQL does: a published port would put Docker's userland proxy between the coordinator and
# its workers, on every statement it routes. Every node has the same password; the coordinator
# and the workers reach each other with it from a password file (PGPASSFILE), as libpq in each
# server reads it. HOME is the postgres user's: the server inherits the entrypoint's (root's),
# where libpq would look for client certificates it may not read, and fail the connection.
# IDEMPAY_CITUS_CLUSTER names the cluster (several can run side by side); IDEMPAY_CITUS_PG_OPTS
# adds server settings to every node; IDEMPAY_CITUS_TMPFS (a size, e.g. 6g) keeps each node's data
# directory in memory, as the test suite does: its dozens of databases copied on every node were
# writes enough to stall a disk shared with everything else.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly CLUSTER=${IDEMPAY_CITUS_CLUSTER:-idempay-citus}
readonly WORKERS=${IDEMPAY_CITUS_WORKERS:-2}
readonly PASSWORD=postgres
readonly PASSFILE=/var/lib/postgresql/.pgpass
readonly LABEL=org.idempay.citus-cluster
# Test and bench settings: commits need not reach this machine's disk, a node takes the
# connections of several instances' pools, and every database with the extension has a
# maintenance daemon of its own (a background worker: 2PC recovery, distributed deadlock
# detection), as many as the test suite's databases at a time (the default allows 8 in all).
readonly PG_OPTS=${IDEMPAY_CITUS_PG_OPTS:-"-c fsync=off -c synchronous_commit=off -c max_connections=300 -c max_worker_processes=64"}

log() { printf 'citus-cluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The containers of the cluster, coordinator first.
nodes() {
  local node
  for node in coordinator $(seq -f 'worker-%g' 1 "$WORKERS"); do printf '%s-%s\n' "$CLUSTER" "$node"; done
}

port_of() { docker inspect -f "{{index .Config.Labels \"$LABEL.port\"}}" "$1" 2>/dev/null; }

url() {
  local port
  port=$(port_of "$CLUSTER-coordinator") || die "no cluster $CLUSTER is running (scripts/citus-cluster.sh up)"
  printf 'postgres://postgres:%s@127.0.0.1:%s/postgres\n' "$PASSWORD" "$port"
}

# psql against the node listening on PORT, as the cluster's superuser; errors are fatal. The
# host's psql where there is one, else the coordinator container's (the nodes share the host's
# network, so it reaches every node as the host would).
node_sql() {
  local port=$1; shift
  local client=(psql)
  command -v psql >/dev/null || client=(docker exec -e PGPASSWORD="$PASSWORD" "$CLUSTER-coordinator" psql)
  PGPASSWORD=$PASSWORD "${client[@]}" -qAtX -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"
}

start_node() { # NAME PORT IMAGE
  local name=$1 port=$2 image=$3
  # shellcheck disable=SC2086  # the options are words on purpose
  local memory=()
  [ -z "${IDEMPAY_CITUS_TMPFS:-}" ] || memory=(--tmpfs "/var/lib/postgresql/data:rw,size=$IDEMPAY_CITUS_TMPFS")
  docker run -d --name "$name" --label "$LABEL=$CLUSTER" --label "$LABEL.port=$port" \
    --network host --shm-size=1g "${memory[@]}" \
    -e POSTGRES_PASSWORD="$PASSWORD" -e PGPASSFILE="$PASSFILE" -e HOME=/var/lib/postgresql \
    "$image" postgres -c shared_preload_libraries=citus -c listen_addresses=127.0.0.1 \
    -c port="$port" $PG_OPTS >/dev/null
}

wait_ready() { # NAME PORT
  local name=$1 port=$2 i
  for i in $(seq 1 300); do
    node_sql "$port" -c 'SELECT 1' >/dev/null 2>&1 && return 0
    [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] ||
      { docker logs "$name" >&2 || true; die "$name exited"; }
    sleep 0.2
  done
  docker logs "$name" >&2 || true
  die "$name did not accept connections"
}

# Whether every node of the cluster is a running container.
running() {
  local name
  for name in $(nodes); do
    [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] || return 1
  done
}

up() {
  if running; then
    log "$CLUSTER is running"
    url
    return 0
  fi
  # Part of a cluster (a node stopped or removed, one that did not come up whole) is not reused.
  if [ -n "$(docker ps -aq --filter "label=$LABEL=$CLUSTER")" ]; then
    log "$CLUSTER is incomplete; removing what is left of it"
    down
  fi
  local image name port coordinator_port
  image=$(bash scripts/citus-image.sh | tail -n 1)
  # A cluster that did not come up whole is removed, not left half-registered.
  trap '[ "$?" = 0 ] || down >/dev/null 2>&1' EXIT
  declare -A ports=()
  for name in $(nodes); do
    port=$(free_port)
    ports[$name]=$port
    start_node "$name" "$port" "$image"
  done
  for name in $(nodes); do
    wait_ready "$name" "${ports[$name]}"
    # The server's own libpq (a coordinator routing to a worker, a worker syncing metadata back)
    # reads the password from here. A node moving a shard also connects to itself, by the name
    # `citus.local_hostname` gives, localhost.
    docker exec -u postgres "$name" sh -c \
      "printf '127.0.0.1:*:*:postgres:$PASSWORD\nlocalhost:*:*:postgres:$PASSWORD\n' >$PASSFILE && chmod 600 $PASSFILE"
    node_sql "${ports[$name]}" -c 'CREATE EXTENSION IF NOT EXISTS citus'
  done
  coordinator_port=${ports[$CLUSTER-coordinator]}
  node_sql "$coordinator_port" -c "SELECT citus_set_coordinator_host('127.0.0.1', $coordinator_port)" >/dev/null
  for name in $(nodes | tail -n +2); do
    node_sql "$coordinator_port" -c "SELECT citus_add_node('127.0.0.1', ${ports[$name]})" >/dev/null
  done
  local registered
  registered=$(node_sql "$coordinator_port" -c "SELECT count(*) FROM citus_get_active_worker_nodes()")
  [ "$registered" = "$WORKERS" ] || die "the coordinator lists $registered active workers, not $WORKERS"
  log "$CLUSTER: a coordinator on 127.0.0.1:$coordinator_port and $WORKERS workers ($image)"
  url
}

ports() {
  local name port
  for name in $(nodes); do
    port=$(port_of "$name") || die "no node $name is running (scripts/citus-cluster.sh up)"
    case $name in
      *-coordinator) printf 'coordinator %s\n' "$port" ;;
      *) printf 'worker %s\n' "$port" ;;
    esac
  done
}

down() {
  local ids
  ids=$(docker ps -aq --filter "label=$LABEL=$CLUSTER")
  [ -z "$ids" ] || docker rm -f $ids >/dev/null
  log "$CLUSTER removed"
}

case "${1:-}" in
  up) up ;;
  url) url ;;
  ports) ports ;;
  down) down ;;
  *) die "usage: scripts/citus-cluster.sh up|url|ports|down" ;;
esac
