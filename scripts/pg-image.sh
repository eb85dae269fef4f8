#!/usr/bin/env bash
# Make sure a PostgreSQL 15 docker image is available locally and print its
# reference (name:tag) as the last line of stdout. Progress goes to stderr.
#
# Order of preference:
#   1. $IDEMPAY_PG_IMAGE, if set (pulled if missing; built if it names the
#      default built image).
#   2. postgres:15 already present locally.
#   3. idempay-postgres:15 already present locally.
#   4. docker pull postgres:15.
#   5. Build idempay-postgres:15 from Debian packages with debootstrap, using
#      the Debian mirror and suite this machine's apt is configured with.
#      IDEMPAY_DEBIAN_MIRROR / IDEMPAY_DEBIAN_SUITE override the detection.
set -euo pipefail

readonly UPSTREAM_IMAGE=postgres:15
readonly BUILT_IMAGE=idempay-postgres:15
readonly LOCK_FILE=/tmp/idempay-pg-image.lock

log() { printf 'pg-image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# Print the chosen reference as the final stdout line and stop.
use_image() {
  log "using $1"
  printf '%s\n' "$1"
  exit 0
}

# Building needs root (debootstrap, chroot, reading the whole rootfs).
SUDO=()
need_root() {
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    die "building $BUILT_IMAGE needs root (or sudo)"
  fi
}
as_root() { "${SUDO[@]}" "$@"; }

BUILD_DIR=""
# shellcheck disable=SC2317  # invoked from the EXIT trap
cleanup() {
  [ -n "$BUILD_DIR" ] && [ -d "$BUILD_DIR" ] || return 0
  # An interrupted debootstrap can leave /proc or /sys mounted in the rootfs;
  # unmount them first so rm cannot reach into the host's pseudo filesystems.
  awk -v dir="$BUILD_DIR/" 'index($2, dir) == 1 { print $2 }' /proc/mounts |
    sort -r | while read -r mnt; do as_root umount -l "$mnt" || true; done
  as_root rm -rf --one-file-system "$BUILD_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# Serialise pulls and builds across concurrent invocations; whoever waits
# re-checks afterwards and finds the image the first one produced.
take_lock() {
  exec 9>>"$LOCK_FILE"
  if ! flock -n 9; then
    log "another invocation holds $LOCK_FILE; waiting for it"
    flock -w 1800 9 || die "timed out waiting for $LOCK_FILE"
  fi
}

ensure_debootstrap() {
  DEBOOTSTRAP=$(command -v debootstrap || true)
  [ -n "$DEBOOTSTRAP" ] || [ ! -x /usr/sbin/debootstrap ] || DEBOOTSTRAP=/usr/sbin/debootstrap
  [ -z "$DEBOOTSTRAP" ] || return 0
  command -v apt-get >/dev/null 2>&1 || die "debootstrap is missing and apt-get is unavailable"
  log "installing debootstrap"
  local apt=(as_root env DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0)
  # Refresh package lists only when installing from the current ones fails.
  if ! "${apt[@]}" install debootstrap >/dev/null 2>&1; then
    "${apt[@]}" update >/dev/null
    "${apt[@]}" install debootstrap >/dev/null
  fi
  DEBOOTSTRAP=/usr/sbin/debootstrap
}

# Mirror of the main archive from deb822 files: a paragraph whose Types has
# "deb", Suites has the plain codename and Components has "main". This skips
# -security/-updates entries and third-party repositories.
mirror_from_deb822() {
  local codename=$1; shift
  [ "$#" -gt 0 ] || return 0
  awk -v want="$codename" '
    function has(list, word,   n, a, i) {
      n = split(list, a, /[ \t]+/)
      for (i = 1; i <= n; i++) if (a[i] == word) return 1
      return 0
    }
    BEGIN { RS = ""; FS = "\n" }
    {
      split("", f); key = ""
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^[ \t]*#/) continue
        if ($i ~ /^[ \t]/) { if (key != "") f[key] = f[key] " " $i; continue }
        if (match($i, /^[A-Za-z0-9-]+:/)) {
          key = tolower(substr($i, 1, RLENGTH - 1))
          f[key] = substr($i, RLENGTH + 1)
        }
      }
      if (tolower(f["enabled"]) ~ /^[ \t]*no/) next
      if (!has(f["types"], "deb") || !has(f["suites"], want) || !has(f["components"], "main")) next
      n = split(f["uris"], u, /[ \t]+/)
      for (i = 1; i <= n; i++) if (u[i] ~ /^(https?|ftp|file):\/\//) { print u[i]; exit }
    }' "$@"
}

# Same, for one-line "deb [options] URI suite component..." entries.
mirror_from_one_line() {
  local codename=$1; shift
  [ "$#" -gt 0 ] || return 0
  awk -v want="$codename" '
    /^[ \t]*deb[ \t]/ {
      line = $0
      sub(/#.*/, "", line)
      gsub(/\[[^]]*\]/, "", line)
      $0 = line
      if ($3 != want || $2 !~ /^(https?|ftp|file):\/\//) next
      for (i = 4; i <= NF; i++) if ($i == "main") { print $2; exit }
    }' "$@"
}

# Sets MIRROR and SUITE.
detect_debian_source() {
  SUITE=${IDEMPAY_DEBIAN_SUITE:-}
  if [ -z "$SUITE" ] && [ -r /etc/os-release ]; then
    SUITE=$(awk -F= '$1 == "VERSION_CODENAME" { gsub(/"/, "", $2); print $2 }' /etc/os-release)
  fi
  [ -n "$SUITE" ] || die "cannot tell the Debian codename (no VERSION_CODENAME in /etc/os-release); set IDEMPAY_DEBIAN_SUITE"

  MIRROR=${IDEMPAY_DEBIAN_MIRROR:-}
  if [ -z "$MIRROR" ]; then
    local deb822=() one_line=()
    shopt -s nullglob
    deb822=(/etc/apt/sources.list.d/*.sources)
    one_line=(/etc/apt/sources.list.d/*.list)
    shopt -u nullglob
    [ ! -r /etc/apt/sources.list ] || one_line=(/etc/apt/sources.list "${one_line[@]}")
    MIRROR=$(mirror_from_deb822 "$SUITE" "${deb822[@]}")
    [ -n "$MIRROR" ] || MIRROR=$(mirror_from_one_line "$SUITE" "${one_line[@]}")
  fi
  [ -n "$MIRROR" ] || die "no apt source for suite '$SUITE' with component main; set IDEMPAY_DEBIAN_MIRROR"
}

# Entrypoint installed into the image. It follows the official postgres
# image's contract closely enough for testcontainers and plain clients.
write_entrypoint() {
  cat >"$1" <<'ENTRYPOINT'
#!/bin/bash
# Honours POSTGRES_USER, POSTGRES_PASSWORD(_FILE), POSTGRES_DB,
# POSTGRES_HOST_AUTH_METHOD, POSTGRES_INITDB_ARGS, PGDATA and
# /docker-entrypoint-initdb.d/*.sql, *.sql.gz, *.sh like the official image.
set -euo pipefail

log() { printf 'docker-entrypoint: %s\n' "$*" >&2; }

# Bare options ("-c fsync=off") are arguments for the server.
if [ "$#" -eq 0 ] || [ "${1:0:1}" = - ]; then
  set -- postgres "$@"
fi
# Anything else (psql, bash, postgres --version, ...) runs untouched.
if [ "$1" != postgres ]; then
  exec "$@"
fi
for arg in "$@"; do
  case "$arg" in -'?'|--help|-V|--version|--describe-config) exec "$@" ;; esac
done
shift

# A caller running the server with fsync=off (testcontainers does by default)
# has no use for durability, so initialisation skips its disk syncs too.
nosync=()
for arg in "$@"; do
  case "$arg" in *fsync=off | *fsync=false | *fsync=no | *fsync=0) nosync=(-c fsync=off) ;; esac
done

export PGDATA="${PGDATA:-/var/lib/postgresql/data}"
export POSTGRES_USER="${POSTGRES_USER:-postgres}"
export POSTGRES_DB="${POSTGRES_DB:-$POSTGRES_USER}"

# Start as root to fix up directories, then run everything as "postgres".
as_pg=()
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  # A freshly mounted volume is usually owned by root.
  find "$PGDATA" \! -user postgres -exec chown postgres:postgres {} +
  chown postgres:postgres /var/run/postgresql
  chmod 700 "$PGDATA"
  chmod 2775 /var/run/postgresql
  as_pg=(setpriv --reuid=postgres --regid=postgres --init-groups)
fi

init_cluster() {
  local password="${POSTGRES_PASSWORD:-}" method pwfile="" args=()
  if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    password="$(<"$POSTGRES_PASSWORD_FILE")"
  fi
  method="${POSTGRES_HOST_AUTH_METHOD:-}"
  if [ -z "$method" ]; then
    if [ -n "$password" ]; then
      method=scram-sha-256
    else
      method=trust
      log "warning: no POSTGRES_PASSWORD; network connections are not authenticated"
    fi
  fi
  if [ -n "$password" ]; then
    # initdb runs as postgres, so the password file must be readable by it.
    pwfile="$(mktemp)"
    printf '%s\n' "$password" >"$pwfile"
    [ "${#as_pg[@]}" -eq 0 ] || chown postgres "$pwfile"
    args+=("--pwfile=$pwfile")
  fi
  read -ra extra <<<"${POSTGRES_INITDB_ARGS:-}"
  # Name the zone of /etc/localtime; otherwise initdb spends about a second
  # scanning /usr/share/zoneinfo to find it.
  local tz="${TZ:-}"
  if [ -z "$tz" ] && [ -L /etc/localtime ]; then
    tz="$(readlink /etc/localtime)"
    tz="${tz#*/zoneinfo/}"
  fi
  TZ="$tz" "${as_pg[@]}" initdb --username="$POSTGRES_USER" --auth-local=trust \
    --auth-host="$method" --encoding=UTF8 --locale=C.UTF-8 \
    ${nosync[@]:+--no-sync} "${args[@]}" "${extra[@]}"
  rm -f "$pwfile"

  printf '\nhost all all all %s\n' "$method" >>"$PGDATA/pg_hba.conf"
  printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

  if [ "$POSTGRES_DB" != postgres ]; then
    # Single-user mode needs no temporary server, so nothing but the real
    # server below ever logs "ready to accept connections".
    local out
    if ! out="$(printf 'CREATE DATABASE "%s";\n' "${POSTGRES_DB//\"/\"\"}" |
        "${as_pg[@]}" postgres --single -D "$PGDATA" "${nosync[@]}" postgres 2>&1)" ||
       grep -qE '(ERROR|FATAL|PANIC):' <<<"$out"; then
      log "creating database $POSTGRES_DB failed:"
      printf '%s\n' "$out" >&2
      exit 1
    fi
  fi
}

run_init_scripts() {
  local files=() f tmplog
  shopt -s nullglob
  files=(/docker-entrypoint-initdb.d/*)
  shopt -u nullglob
  [ "${#files[@]}" -gt 0 ] || return 0

  # Temporary server on the Unix socket only. Its log, including its own
  # "ready" line, goes to a file that is shown only if something fails.
  tmplog="$(mktemp)"
  [ "${#as_pg[@]}" -eq 0 ] || chown postgres "$tmplog"
  fail() {
    log "$1"
    grep -v 'ready to accept connections' "$tmplog" >&2 || true
    exit 1
  }
  "${as_pg[@]}" pg_ctl -D "$PGDATA" -o "-c listen_addresses='' ${nosync[*]}" -w -t 60 \
    -l "$tmplog" start >/dev/null || fail "temporary server did not start"

  local psql=("${as_pg[@]}" psql -v ON_ERROR_STOP=1 --no-psqlrc
    --username="$POSTGRES_USER" --dbname="$POSTGRES_DB")
  for f in "${files[@]}"; do
    case "$f" in
      *.sh)
        log "running $f"
        PGUSER="$POSTGRES_USER" PGDATABASE="$POSTGRES_DB" \
          "${as_pg[@]}" bash "$f" || fail "$f failed" ;;
      *.sql)
        log "running $f"
        "${psql[@]}" <"$f" || fail "$f failed" ;;
      *.sql.gz)
        log "running $f"
        gzip -dc "$f" | "${psql[@]}" || fail "$f failed" ;;
      *) log "ignoring $f" ;;
    esac
  done

  "${as_pg[@]}" pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null ||
    fail "temporary server did not stop"
  rm -f "$tmplog"
}

# Echo the server's "ready" line to stdout once postmaster.pid says "ready"
# (written right after the server logs it), because some clients, e.g. the
# testcontainers Postgres module, wait for the line on stdout as well as on
# stderr. The start-time check skips a stale pid file left by a killed
# container, whose postmaster was PID 1 as well. This process becomes a child
# of the postmaster, which treats any exit status other than 0 or 1 as a
# crashed backend, so always exit 0.
announce_ready() {
  set +e
  local pm=$1 since=$2 pid started status _
  while kill -0 "$pm" 2>/dev/null; do
    if { read -r pid && read -r _ && read -r started && read -r _ &&
         read -r _ && read -r _ && read -r _ && read -r status; } 2>/dev/null \
         <"$PGDATA/postmaster.pid" &&
       [ "$pid" = "$pm" ] && [ "$status" = ready ] &&
       [ "$started" -ge "$since" ] 2>/dev/null; then
      echo "database system is ready to accept connections"
      break
    fi
    sleep 0.05
  done
  exit 0
}

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  init_cluster
  run_init_scripts
fi

announce_ready "$$" "$EPOCHSECONDS" &
exec "${as_pg[@]}" postgres -D "$PGDATA" "$@"
ENTRYPOINT
}

build_image() {
  need_root
  ensure_debootstrap
  detect_debian_source

  BUILD_DIR=$(mktemp -d /tmp/idempay-pg-build.XXXXXX)
  local root="$BUILD_DIR/rootfs"
  log "building $BUILT_IMAGE: debootstrap $SUITE from $MIRROR (about a minute)"
  if ! as_root "$DEBOOTSTRAP" --variant=minbase --include=postgresql-15 \
      "$SUITE" "$root" "$MIRROR" >"$BUILD_DIR/debootstrap.log" 2>&1; then
    tail -n 25 "$BUILD_DIR/debootstrap.log" >&2
    die "debootstrap failed; the end of its log is shown above"
  fi

  write_entrypoint "$BUILD_DIR/docker-entrypoint.sh"
  as_root install -m 0755 "$BUILD_DIR/docker-entrypoint.sh" \
    "$root/usr/local/bin/docker-entrypoint.sh"
  as_root chroot "$root" /bin/sh -euc '
    mkdir -p /var/lib/postgresql/data /var/run/postgresql /docker-entrypoint-initdb.d
    chown postgres:postgres /var/lib/postgresql/data /var/run/postgresql
    chmod 700 /var/lib/postgresql/data
    chmod 2775 /var/run/postgresql
    # Copied from the host by debootstrap; docker provides its own at runtime.
    rm -f /etc/resolv.conf
    : >/etc/resolv.conf
    : >/etc/hostname
  '

  log "trimming the root filesystem"
  # The package creates a default cluster; the entrypoint makes its own.
  as_root rm -rf "$root/var/lib/postgresql/15" "$root/etc/postgresql/15"
  # Package caches, indexes and documentation are dead weight at runtime.
  as_root find "$root/var/cache/apt" "$root/var/lib/apt/lists" -type f -delete
  as_root find "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" \
    "$root/usr/share/locale" "$root/usr/share/lintian" -mindepth 1 -delete 2>/dev/null || true
  as_root find "$root/var/log" -type f -delete
  # JIT (LLVM and Z3, ~130 MB) buys nothing for short test queries; the
  # server quietly runs without JIT when its provider library is absent.
  as_root rm -rf "$root/usr/lib/postgresql/15/lib/bitcode" \
    "$root"/usr/lib/postgresql/15/lib/llvmjit*.so
  as_root find "$root/usr/lib" \( -name 'libLLVM-*.so*' -o -name 'libz3.so*' \) -delete

  log "importing into docker as $BUILT_IMAGE"
  as_root tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV PGDATA=/var/lib/postgresql/data' \
    --change 'ENV PG_MAJOR=15' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
    --change 'CMD ["postgres"]' \
    --change 'EXPOSE 5432' \
    - "$BUILT_IMAGE" >&2

  local version
  version=$(docker run --rm --entrypoint postgres "$BUILT_IMAGE" --version) ||
    die "the built image does not run"
  log "built $BUILT_IMAGE: $version"
}

command -v docker >/dev/null 2>&1 || die "docker is not installed"
docker version >/dev/null 2>&1 || die "cannot reach the docker daemon"

# Explicit choice.
if [ -n "${IDEMPAY_PG_IMAGE:-}" ]; then
  image=$IDEMPAY_PG_IMAGE
  have_image "$image" && use_image "$image"
  take_lock
  have_image "$image" && use_image "$image"
  if [ "$image" = "$BUILT_IMAGE" ]; then
    build_image
    use_image "$image"
  fi
  log "pulling $image"
  timeout 60 docker pull "$image" >&2 ||
    die "IDEMPAY_PG_IMAGE=$image is not present locally and could not be pulled"
  use_image "$image"
fi

have_image "$UPSTREAM_IMAGE" && use_image "$UPSTREAM_IMAGE"
have_image "$BUILT_IMAGE" && use_image "$BUILT_IMAGE"
take_lock
have_image "$UPSTREAM_IMAGE" && use_image "$UPSTREAM_IMAGE"
have_image "$BUILT_IMAGE" && use_image "$BUILT_IMAGE"

log "pulling $UPSTREAM_IMAGE"
if timeout 30 docker pull "$UPSTREAM_IMAGE" >&2; then
  use_image "$UPSTREAM_IMAGE"
fi
log "could not pull $UPSTREAM_IMAGE; building $BUILT_IMAGE instead"
build_image
use_image "$BUILT_IMAGE"
