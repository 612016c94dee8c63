#!/usr/bin/env bash
# Real RabbitMQ brokers with the stream plugin on loopback, for tests and demos.
#
#   scripts/rabbitmq.sh provision|start|wait|stop|status VERSION|all
#   scripts/rabbitmq.sh cli VERSION COMMAND [ARGS...]    e.g. cli 4.3 rabbitmqctl list_queues
#   scripts/rabbitmq.sh provision|start|wait|stop|status cluster   a 3-node 4.3 cluster on loopback
#   scripts/rabbitmq.sh stop-node|start-node cluster N             one member (N = 1..3), for tests
#   scripts/rabbitmq.sh cli cluster[N] COMMAND [ARGS...]            on node N (default 1)
#
# STREAMLEDGER_RABBITMQ_INSTANCE=NAME (lower-case letters and digits) runs a private node of an
# already provisioned VERSION instead of the shared one: node <node>x<NAME>, every port shifted by
# STREAMLEDGER_RABBITMQ_PORT_OFFSET (default 1000), no TLS listener, its own config and data
# (inside the chroot under /etc/rabbitmq-instances/NAME and /var/lib/rabbitmq/instances/NAME).
# The chaos harness restarts such a node without disturbing anyone using the shared broker.
#
# VERSION: 4.3 (Debian sid package in a debootstrap chroot; the default broker, with a TLS
# stream listener), 4.0 (Debian trixie package in a chroot), 3.10 (Debian bookworm's own
# package on the host). All three can run at once: each has its own ports, node name and epmd.
# Everything lives under $STREAMLEDGER_HOME/rabbitmq (default /var/tmp/streamledger), never in
# the repo. Every command is idempotent; `provision` is a no-op once its stamp file exists.
# Needs root (debootstrap, chroot, mount, apt-get). The Debian mirror is read at run time from
# /etc/apt/sources.list.d/*.sources.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TEMPLATES=$HERE/rabbitmq
SL_HOME=${STREAMLEDGER_HOME:-/var/tmp/streamledger}
BASE=$SL_HOME/rabbitmq
VERSIONS=(4.3 4.0 3.10)
APT_LOCK_WAIT=(-o DPkg::Lock::Timeout=600)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
log() { echo "rabbitmq[$V]: $*"; }
die() { echo "rabbitmq[${V:-?}]: error: $*" >&2; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Per-version settings. KIND=chroot runs the Debian package of SUITE from a minbase rootfs;
# KIND=host runs the host's own package with all state under $D.
select_version() {
  V=$1
  TLS_PORT= AMQPS_PORT=
  case $V in
    4.3) KIND=chroot SUITE=sid NODE=rabbit43 STREAM_PORT=5552 AMQP_PORT=5672 MGMT_PORT=15672 \
           DIST_PORT=25672 EPMD_PORT=4369 TLS_PORT=5551 AMQPS_PORT=5671 ;;
    4.0) KIND=chroot SUITE=trixie NODE=rabbit40 STREAM_PORT=5562 AMQP_PORT=5682 MGMT_PORT=15682 \
           DIST_PORT=25682 EPMD_PORT=4379 ;;
    3.10) KIND=host SUITE=bookworm NODE=rabbit310 STREAM_PORT=5572 AMQP_PORT=5692 MGMT_PORT=15692 \
           DIST_PORT=25692 EPMD_PORT=4389 ;;
    *) die "unknown version '$1' (expected one of: ${VERSIONS[*]} or all)" ;;
  esac
  D=$BASE/$V
  R=$D/rootfs                        # chroot brokers only
  STAMP=$D/provisioned.stamp
  RUN_DIR=$D/run
  LOG_DIR=$D/logs
  INSTANCE=${STREAMLEDGER_RABBITMQ_INSTANCE:-}
  if [ -n "$INSTANCE" ]; then select_instance; fi
  PIDFILE=$RUN_DIR/broker.pid
  STDOUT_LOG=$LOG_DIR/stdout.log
  if [ "$KIND" = chroot ]; then
    ETC_IN=/etc/rabbitmq              # as the broker sees it
    ETC_HOST=$R/etc/rabbitmq          # as this script sees it
    DATA_IN=/var/lib/rabbitmq
  else
    ETC_IN=$D/etc
    ETC_HOST=$D/etc
    DATA_IN=$D/var
  fi
  if [ -n "$INSTANCE" ]; then
    if [ "$KIND" = chroot ]; then
      ETC_IN=/etc/rabbitmq-instances/$INSTANCE
      ETC_HOST=$R$ETC_IN
      DATA_IN=/var/lib/rabbitmq/instances/$INSTANCE
    else
      ETC_IN=$D/instances/$INSTANCE/etc
      ETC_HOST=$ETC_IN
      DATA_IN=$D/instances/$INSTANCE/var
    fi
  fi
  mkdir -p "$RUN_DIR" "$LOG_DIR"
}

# A private node of VERSION (see the header): same installation, everything else its own.
select_instance() {
  [[ $INSTANCE =~ ^[a-z0-9]{1,24}$ ]] || die "STREAMLEDGER_RABBITMQ_INSTANCE must be 1-24 lower-case letters/digits"
  local off=${STREAMLEDGER_RABBITMQ_PORT_OFFSET:-1000}
  [[ $off =~ ^[0-9]+$ ]] && [ "$off" -gt 0 ] || die "STREAMLEDGER_RABBITMQ_PORT_OFFSET must be a positive integer"
  NODE=${NODE}x$INSTANCE
  STREAM_PORT=$((STREAM_PORT + off)) AMQP_PORT=$((AMQP_PORT + off)) MGMT_PORT=$((MGMT_PORT + off))
  DIST_PORT=$((DIST_PORT + off)) EPMD_PORT=$((EPMD_PORT + off)) TLS_PORT=
  RUN_DIR=$D/instances/$INSTANCE/run
  LOG_DIR=$D/instances/$INSTANCE/logs
}

# Whether a node other than this one runs from the same chroot (its /proc must stay mounted).
other_node_alive() {
  local f
  for f in "$D/run/broker.pid" "$D"/instances/*/run/broker.pid; do
    [ "$f" != "$PIDFILE" ] && pidfile_alive "$f" && return 0
  done
  return 1
}

# The host's main Debian mirror (not the security one): deb822 *.sources first, then the
# one-line sources.list format as a fallback for older hosts.
mirror_url() {
  local m
  m=$(awk '/^URIs:/{for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
    m=$(awk '$1=="deb"{for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {if ($i !~ /security/) print $i; break}}' \
          /etc/apt/sources.list | head -1)
  fi
  [ -n "$m" ] || die "no Debian mirror found in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list"
  printf '%s' "$m"
}

# apt-get install on the host, refreshing the package lists once if the first try fails.
host_apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get "${APT_LOCK_WAIT[@]}" install -y -q --no-install-recommends "$@"; then
    apt-get "${APT_LOCK_WAIT[@]}" update -q
    apt-get "${APT_LOCK_WAIT[@]}" install -y -q --no-install-recommends "$@"
  fi
}

broker_ids() { # uid:gid of the rabbitmq user as the broker sees it
  if [ "$KIND" = chroot ]; then
    awk -F: '$1=="rabbitmq"{print $3":"$4}' "$R/etc/passwd"
  else
    echo "$(id -u rabbitmq):$(id -g rabbitmq)"
  fi
}

# Run a command as the broker's rabbitmq user with a clean environment (HOME holds the cookie).
as_broker() {
  local env=(/usr/bin/env -i HOME=/var/lib/rabbitmq LANG=C.UTF-8
             PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  if [ "$KIND" = chroot ]; then
    chroot --userspec="$(broker_ids)" "$R" "${env[@]}" RABBITMQ_CONF_ENV_FILE="$ETC_IN/rabbitmq-env.conf" "$@"
  else
    setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups \
      "${env[@]}" RABBITMQ_CONF_ENV_FILE="$ETC_HOST/rabbitmq-env.conf" "$@"
  fi
}

mount_proc() { # Erlang reads /proc (meminfo, cpu, fds); without it the node dies during boot
  mountpoint -q "$R/proc" || mount -t proc proc "$R/proc"
}

provision_chroot() {
  command -v debootstrap >/dev/null || { log "installing debootstrap"; host_apt_install debootstrap; }
  local mirror t
  mirror=$(mirror_url)
  if [ ! -x "$R/usr/bin/apt-get" ] || [ ! -f "$D/debootstrap.stamp" ]; then
    # A half-made rootfs from an interrupted run: never let rm walk into a mounted /proc.
    if mountpoint -q "$R/proc"; then umount "$R/proc" || umount -l "$R/proc"; fi
    rm -rf --one-file-system "$R"
    t=$(now)
    debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
      "$SUITE" "$R" "$mirror" > "$D/logs/debootstrap.log" 2>&1 \
      || { tail -20 "$D/logs/debootstrap.log" >&2; die "debootstrap $SUITE failed (log: $D/logs/debootstrap.log)"; }
    touch "$D/debootstrap.stamp"
    log "debootstrap $SUITE: $(since "$t")s"
  fi
  # Maintainer scripts must not try to start services inside the chroot.
  printf '#!/bin/sh\nexit 101\n' > "$R/usr/sbin/policy-rc.d"
  chmod +x "$R/usr/sbin/policy-rc.d"
  # minbase has no /etc/hosts; the node name rabbit..@localhost must resolve.
  grep -qs '^127.0.0.1[[:space:]].*localhost' "$R/etc/hosts" || echo '127.0.0.1 localhost' >> "$R/etc/hosts"
  mount_proc
  t=$(now)
  # sid's Release file on a snapshot mirror can be past Valid-Until; the content is still what we want.
  chroot "$R" /usr/bin/env -i DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    sh -c 'apt-get -q -o Acquire::Check-Valid-Until=false update &&
           apt-get install -y -q --no-install-recommends rabbitmq-server && apt-get clean' \
    > "$D/logs/apt.log" 2>&1 || { tail -20 "$D/logs/apt.log" >&2; die "apt-get install rabbitmq-server failed in the $SUITE chroot"; }
  log "apt-get install rabbitmq-server ($SUITE): $(since "$t")s"
  # ~90 MB of package lists are not needed to run the broker.
  rm -rf "$R"/var/lib/apt/lists/*
  if ! pid_alive; then umount "$R/proc" 2>/dev/null || true; fi
}

provision_host() {
  local t
  t=$(now)
  if ! dpkg-query -W -f='${Status}' rabbitmq-server 2>/dev/null | grep -q 'install ok installed'; then
    host_apt_install rabbitmq-server > "$D/logs/apt.log" 2>&1 \
      || { tail -20 "$D/logs/apt.log" >&2; die "apt-get install rabbitmq-server failed on the host"; }
    log "apt-get install rabbitmq-server (host): $(since "$t")s"
  fi
  # The package may have started an epmd on the default port; our broker uses its own.
  mkdir -p "$D/etc" "$D/var/mnesia" "$D/var/log"
  chown -R rabbitmq:rabbitmq "$D/etc" "$D/var"
}

provision() {
  if [ -f "$STAMP" ]; then log "already provisioned ($(cat "$STAMP"))"; return 0; fi
  local t
  t=$(now)
  if [ "$KIND" = chroot ]; then provision_chroot; else provision_host; fi
  local ver
  ver=$(server_version)
  [ -n "$ver" ] || die "rabbitmq-server is not installed after provisioning"
  echo "$ver" > "$STAMP"
  log "provisioned RabbitMQ $ver in $(since "$t")s; disk: $(du -shx "$D" 2>/dev/null | cut -f1)"
}

server_version() { # from the versioned library directory the package installs
  local root=/
  [ "$KIND" = chroot ] && root=$R
  local dir
  dir=$(ls -d "$root"/usr/lib/rabbitmq/lib/rabbitmq_server-* 2>/dev/null | sort -V | tail -1)
  [ -n "$dir" ] && basename "$dir" | sed 's/^rabbitmq_server-//'
}

render() { # template -> stdout with this broker's values
  local ver
  ver=$(server_version)
  sed -e "s#@VERSION@#$ver#g" -e "s#@NODE@#$NODE#g" -e "s#@ETC@#$ETC_IN#g" -e "s#@DATA@#$DATA_IN#g" \
      -e "s#@PLUGINS_DIR@#/usr/lib/rabbitmq/plugins:/usr/lib/rabbitmq/lib/rabbitmq_server-$ver/plugins#g" \
      -e "s#@DIST_PORT@#$DIST_PORT#g" -e "s#@EPMD_PORT@#$EPMD_PORT#g" -e "s#@AMQP_PORT@#$AMQP_PORT#g" \
      -e "s#@STREAM_PORT@#$STREAM_PORT#g" -e "s#@MGMT_PORT@#$MGMT_PORT#g" -e "s#@TLS_PORT@#$TLS_PORT#g" \
      -e "s#@AMQPS_PORT@#$AMQPS_PORT#g" "$1"
}

# Regenerated on every start, so a template change reaches an already provisioned broker.
write_config() {
  local ids plugins=rabbitmq_management,rabbitmq_stream
  ids=$(broker_ids)
  mkdir -p "$ETC_HOST"
  render "$TEMPLATES/rabbitmq-env.conf.in" > "$ETC_HOST/rabbitmq-env.conf"
  render "$TEMPLATES/rabbitmq.conf.in" > "$ETC_HOST/rabbitmq.conf"
  if [ -n "$TLS_PORT" ]; then
    "$HERE/tls.sh" "$SL_HOME/tls" >/dev/null
    render "$TEMPLATES/tls.conf.in" >> "$ETC_HOST/rabbitmq.conf"
    mkdir -p "$ETC_HOST/tls"
    install -m 0644 "$SL_HOME/tls/ca.pem" "$SL_HOME/tls/server.pem" "$ETC_HOST/tls/"
    install -m 0600 "$SL_HOME/tls/server.key" "$ETC_HOST/tls/"
    chown -R "$ids" "$ETC_HOST/tls"
    plugins=$plugins,rabbitmq_auth_mechanism_ssl
  fi
  echo "[${plugins}]." > "$ETC_HOST/enabled_plugins"
  if [ -n "$INSTANCE" ]; then
    local data_host=$DATA_IN
    [ "$KIND" = chroot ] && data_host=$R$DATA_IN
    mkdir -p "$data_host/mnesia" "$data_host/log"
    chown -R "$ids" "$data_host"
  fi
  chown "$ids" "$ETC_HOST/rabbitmq-env.conf" "$ETC_HOST/rabbitmq.conf" "$ETC_HOST/enabled_plugins"
}

# A pid file holds "PID STARTTIME". Pids are recycled (pid_max is 32768 on small machines and a test
# suite starts tens of thousands of processes), so a bare pid can name some other process long after
# the broker died: "already running" then, and a wait for a port nobody opens (CI stop 40).
proc_start() { # PID -> its start time in clock ticks since boot (field 22 of /proc/PID/stat)
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  # shellcheck disable=SC2086
  set -- $s
  echo "${20}"
}
write_pidfile() { echo "$1 $(proc_start "$1" || true)" > "$2"; }
pidfile_pid() { awk 'NR==1{print $1}' "$1" 2>/dev/null; }
pidfile_alive() { # FILE -> true while the process it recorded still runs
  local pid="" start=""
  [ -f "$1" ] || return 1
  read -r pid start < "$1" || [ -n "$pid" ] || return 1
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  if [ -n "$start" ]; then
    [ "$(proc_start "$pid")" = "$start" ]
  else # the old format: a RabbitMQ process or nothing
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q rabbitmq
  fi
}
pid_alive() { pidfile_alive "$PIDFILE"; }

start() {
  [ -f "$STAMP" ] || die "not provisioned; run: $0 provision $V"
  if pid_alive; then log "already running (pid $(pidfile_pid "$PIDFILE"))"; return 0; fi
  if port_open "$STREAM_PORT"; then
    if as_broker rabbitmqctl -q ping >/dev/null 2>&1; then log "already running (started elsewhere)"; return 0; fi
    die "port $STREAM_PORT is in use by something else"
  fi
  write_config
  [ "$KIND" = chroot ] && mount_proc
  # setsid: the broker gets its own session and outlives the caller (pytest, make).
  if [ "$KIND" = chroot ]; then
    setsid chroot --userspec="$(broker_ids)" "$R" /usr/bin/env -i HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
      PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin RABBITMQ_CONF_ENV_FILE="$ETC_IN/rabbitmq-env.conf" \
      /usr/lib/rabbitmq/bin/rabbitmq-server > "$STDOUT_LOG" 2>&1 < /dev/null {lockfd}>&- &
  else
    setsid setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups \
      /usr/bin/env -i HOME=/var/lib/rabbitmq LANG=C.UTF-8 PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      RABBITMQ_CONF_ENV_FILE="$ETC_HOST/rabbitmq-env.conf" \
      /usr/lib/rabbitmq/bin/rabbitmq-server > "$STDOUT_LOG" 2>&1 < /dev/null {lockfd}>&- &
  fi
  write_pidfile $! "$PIDFILE"
  date +%s.%N > "$RUN_DIR/started_at"
  rm -f "$RUN_DIR/boot_seconds"
  log "started pid $(pidfile_pid "$PIDFILE") (stdout: $STDOUT_LOG)"
}

# Idempotent setup done once the node is up: the user SASL EXTERNAL maps the client cert to.
post_start() {
  [ -n "$TLS_PORT" ] || return 0
  local user=streamledger-client
  has_user() { as_broker rabbitmqctl -q list_users --no-table-headers 2>/dev/null | awk '{print $1}' | grep -qx "$user"; }
  if ! has_user; then
    # A random password, cleared at once: this user only ever logs in with its certificate.
    # add_user may lose a race with a concurrent `wait`; that is fine if the user now exists.
    as_broker rabbitmqctl -q add_user "$user" "$(head -c 24 /dev/urandom | base64 | tr -d '/+=')" >/dev/null 2>&1 \
      || has_user || die "could not create user $user"
    as_broker rabbitmqctl -q clear_password "$user" >/dev/null
  fi
  as_broker rabbitmqctl -q set_permissions -p / "$user" '.*' '.*' '.*' >/dev/null
  # AMQP 1.0 over TLS (amqps): in the config template; a node started from an older template gets the
  # listener at run time, with the same ssl_options, instead of a restart under other users' feet.
  if [ -n "$AMQPS_PORT" ] && ! port_open "$AMQPS_PORT"; then
    as_broker rabbitmqctl -q eval "{ok, S} = application:get_env(rabbit, ssl_options),
      rabbit_networking:start_ssl_listener({\"127.0.0.1\", $AMQPS_PORT}, S, 1, 1)." >/dev/null \
      || die "could not start the AMQPS listener on $AMQPS_PORT"
  fi
}

boot_tails() { # what a hung boot left in its logs, for the error a CI run prints
  local node_log=$DATA_IN/log/$NODE@localhost.log
  [ "$KIND" = chroot ] && node_log=$R$node_log
  echo "--- tail of $STDOUT_LOG"; tail -8 "$STDOUT_LOG" 2>/dev/null || true
  echo "--- tail of $node_log"; tail -12 "$node_log" 2>/dev/null | cut -c1-300 || true
}

wait_ready() {
  local timeout=${1:-180} t
  t=$(now)
  until port_open "$STREAM_PORT"; do
    pid_alive || { tail -20 "$STDOUT_LOG" >&2 || true; die "broker is not running (see $STDOUT_LOG)"; }
    if [ "$(awk -v a="$t" -v b="$(now)" -v m="$timeout" 'BEGIN{print (b-a > m)}')" = 1 ]; then
      boot_tails >&2
      die "stream port $STREAM_PORT not open after ${timeout}s; pid $(pidfile_pid "$PIDFILE") runs (see $STDOUT_LOG)"
    fi
    sleep 0.3
  done
  as_broker rabbitmqctl -q await_startup --timeout "$timeout" >/dev/null
  [ -n "$TLS_PORT" ] && ! port_open "$TLS_PORT" && die "TLS stream port $TLS_PORT is not open"
  post_start
  # Boot time = start -> ready, recorded by the first wait after a start.
  if [ -f "$RUN_DIR/started_at" ] && [ ! -f "$RUN_DIR/boot_seconds" ]; then
    since "$(cat "$RUN_DIR/started_at")" > "$RUN_DIR/boot_seconds"
  fi
  local boot=""
  [ -f "$RUN_DIR/boot_seconds" ] && boot=" (boot took $(cat "$RUN_DIR/boot_seconds")s)"
  log "ready: RabbitMQ $(cat "$STAMP") stream 127.0.0.1:$STREAM_PORT${TLS_PORT:+ tls :$TLS_PORT}$boot"
}

stop() {
  local t pid
  t=$(now)
  if pid_alive; then
    pid=$(pidfile_pid "$PIDFILE")
    as_broker rabbitmqctl -q shutdown >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && die "broker pid $pid did not stop"
  elif [ -f "$STAMP" ] && port_open "$STREAM_PORT"; then
    as_broker rabbitmqctl -q shutdown >/dev/null 2>&1 || true
  fi
  rm -f "$PIDFILE" "$RUN_DIR/started_at" "$RUN_DIR/boot_seconds"
  # epmd daemonizes and outlives the node; each broker has its own on its own port.
  if [ -f "$STAMP" ]; then as_broker epmd -port "$EPMD_PORT" -kill >/dev/null 2>&1 || true; fi
  if [ "$KIND" = chroot ] && mountpoint -q "$R/proc" && ! other_node_alive; then
    umount "$R/proc" || umount -l "$R/proc"
  fi
  log "stopped in $(since "$t")s"
}

status() {
  local state="stopped"
  pid_alive && state="running pid $(pidfile_pid "$PIDFILE")"
  local prov="not provisioned"
  [ -f "$STAMP" ] && prov="RabbitMQ $(cat "$STAMP")"
  log "$prov, $state, node $NODE@localhost, stream $STREAM_PORT${TLS_PORT:+ tls $TLS_PORT}, amqp $AMQP_PORT, mgmt $MGMT_PORT, dist $DIST_PORT, epmd $EPMD_PORT"
}

# Serialise provision/start/stop of one broker across concurrent callers (pytest workers, make).
# The broker started under the lock must not inherit its fd (start closes it for the child).
locked() {
  mkdir -p "$BASE"
  exec {lockfd}> "$BASE/.lock-$V"
  flock "$lockfd"
  "$@"
  exec {lockfd}>&-
}

usage() {
  echo "usage: $0 provision|start|wait|stop|status VERSION|all" >&2
  echo "       $0 cli VERSION COMMAND [ARGS...]      (VERSION: ${VERSIONS[*]})" >&2
  exit 2
}

# ---- the 3-node 4.3 cluster (target "cluster") ------------------------------------------------
# A copy of the 4.3 rootfs (its own /proc mount, so stopping 4.3 never touches it), three nodes
# rabbitc1..3@localhost formed by classic peer discovery, one shared epmd (4399), and per node:
# stream 5600+N, AMQP 5610+N, management 15610+N, distribution 25610+N. Data under
# rootfs/var/lib/rabbitmq/rabbitcN; per-node configs in rootfs/etc/rabbitmq/rabbitcN/.
CLUSTER_NODES=(1 2 3)

select_cluster_node() { # N -> the per-node variables the shared functions use
  V=cluster KIND=chroot SUITE=sid TLS_PORT= AMQPS_PORT=
  NODE=rabbitc$1 STREAM_PORT=$((5600 + $1)) AMQP_PORT=$((5610 + $1)) MGMT_PORT=$((15610 + $1))
  DIST_PORT=$((25610 + $1)) EPMD_PORT=4399
  D=$BASE/cluster R=$D/rootfs STAMP=$D/provisioned.stamp
  PIDFILE=$D/run/$NODE.pid STDOUT_LOG=$D/logs/$NODE.log
  ETC_IN=/etc/rabbitmq/$NODE ETC_HOST=$R/etc/rabbitmq/$NODE DATA_IN=/var/lib/rabbitmq/$NODE
  mkdir -p "$D/run" "$D/logs"
}

node_as_broker() { # like as_broker, with this node's env file
  chroot --userspec="$(broker_ids)" "$R" /usr/bin/env -i HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
    PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin RABBITMQ_CONF_ENV_FILE="$ETC_IN/rabbitmq-env.conf" "$@"
}

cluster_provision() {
  select_cluster_node 1
  if [ -f "$STAMP" ]; then log "already provisioned ($(cat "$STAMP"))"; return 0; fi
  local src=$BASE/4.3 t
  [ -f "$src/provisioned.stamp" ] || "$0" provision 4.3
  t=$(now)
  rm -rf --one-file-system "$R.tmp"
  mkdir -p "$R.tmp"
  # the 4.3 rootfs without its node's state and without /proc (which may be mounted there)
  tar -C "$src/rootfs" --one-file-system --exclude=./proc --exclude=./var/lib/rabbitmq/mnesia \
      --exclude=./var/lib/rabbitmq/log --exclude=./var/lib/rabbitmq/instances -cf - . | tar -C "$R.tmp" -xf -
  mkdir -p "$R.tmp/proc"
  mv "$R.tmp" "$R"
  cp "$src/provisioned.stamp" "$STAMP"
  log "provisioned from the 4.3 rootfs in $(since "$t")s"
}

cluster_write_config() {
  local ids
  ids=$(broker_ids)
  mkdir -p "$ETC_HOST" "$R$DATA_IN"
  render "$TEMPLATES/rabbitmq-env.conf.in" > "$ETC_HOST/rabbitmq-env.conf"
  render "$TEMPLATES/cluster.conf.in" > "$ETC_HOST/rabbitmq.conf"
  echo "[rabbitmq_management,rabbitmq_stream]." > "$ETC_HOST/enabled_plugins"
  chown -R "$ids" "$ETC_HOST" "$R$DATA_IN"
}

cluster_start_node() {
  select_cluster_node "$1"
  [ -f "$STAMP" ] || die "not provisioned; run: $0 provision cluster"
  if pid_alive; then log "$NODE already running (pid $(pidfile_pid "$PIDFILE"))"; return 0; fi
  port_open "$STREAM_PORT" && die "port $STREAM_PORT is in use by something else"
  cluster_write_config
  mount_proc
  setsid chroot --userspec="$(broker_ids)" "$R" /usr/bin/env -i HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
    PATH=/usr/lib/rabbitmq/bin:/usr/sbin:/usr/bin:/sbin:/bin RABBITMQ_CONF_ENV_FILE="$ETC_IN/rabbitmq-env.conf" \
    /usr/lib/rabbitmq/bin/rabbitmq-server > "$STDOUT_LOG" 2>&1 < /dev/null {lockfd}>&- &
  write_pidfile $! "$PIDFILE"
  log "started $NODE pid $(pidfile_pid "$PIDFILE") (stream $STREAM_PORT, amqp $AMQP_PORT, mgmt $MGMT_PORT)"
}

cluster_wait_node() {
  select_cluster_node "$1"
  local t timeout=${2:-240}
  t=$(now)
  until port_open "$STREAM_PORT"; do
    pid_alive || { tail -20 "$STDOUT_LOG" >&2 || true; die "$NODE is not running (see $STDOUT_LOG)"; }
    [ "$(awk -v a="$t" -v b="$(now)" -v m="$timeout" 'BEGIN{print (b-a > m)}')" = 1 ] \
      && die "$NODE: stream port $STREAM_PORT not open after ${timeout}s (see $STDOUT_LOG)"
    sleep 0.5
  done
  node_as_broker rabbitmqctl -q await_startup --timeout "$timeout" >/dev/null
}

cluster_stop_node() {
  select_cluster_node "$1"
  local pid
  if pid_alive; then
    pid=$(pidfile_pid "$PIDFILE")
    node_as_broker rabbitmqctl -q shutdown >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && die "$NODE pid $pid did not stop"
  fi
  rm -f "$PIDFILE"
  log "stopped $NODE"
}

cluster_main() {
  local action=$1 n
  shift
  case $action in
    provision) V=cluster; locked cluster_provision ;;
    start) for n in "${CLUSTER_NODES[@]}"; do V=cluster; locked cluster_start_node "$n"; done ;;
    wait)
      for n in "${CLUSTER_NODES[@]}"; do cluster_wait_node "$n" "${1:-240}"; done
      select_cluster_node 1
      local running
      running=$(node_as_broker rabbitmqctl -q eval 'length(rabbit_nodes:list_running()).' 2>/dev/null || echo 0)
      [ "$running" = 3 ] || die "cluster has $running running member(s), expected 3"
      log "ready: 3 nodes, stream 5601-5603, amqp 5611-5613, mgmt 15611-15613" ;;
    stop)
      for n in 3 2 1; do V=cluster; locked cluster_stop_node "$n"; done
      select_cluster_node 1
      [ -f "$STAMP" ] && node_as_broker epmd -port "$EPMD_PORT" -kill >/dev/null 2>&1 || true
      if mountpoint -q "$R/proc"; then umount "$R/proc" || umount -l "$R/proc"; fi ;;
    stop-node) [ $# -ge 1 ] || usage; V=cluster; locked cluster_stop_node "$1" ;;
    start-node) [ $# -ge 1 ] || usage; V=cluster; locked cluster_start_node "$1"; cluster_wait_node "$1" ;;
    status)
      for n in "${CLUSTER_NODES[@]}"; do
        select_cluster_node "$n"
        local state=stopped
        pid_alive && state="running pid $(pidfile_pid "$PIDFILE")"
        log "$NODE@localhost: $state, stream $STREAM_PORT, amqp $AMQP_PORT, mgmt $MGMT_PORT, dist $DIST_PORT"
      done ;;
    *) usage ;;
  esac
}

[ $# -ge 2 ] || usage
action=$1 target=$2
shift 2
if [ "$action" = cli ] && [[ $target == cluster* ]]; then
  n=${target#cluster}
  select_cluster_node "${n:-1}"
  [ $# -ge 1 ] || usage
  node_as_broker "$@"
  exit $?
fi
if [ "$target" = cluster ]; then
  [ "$(id -u)" = 0 ] || [ "$action" = status ] || die "needs root (chroot, mount, apt-get)"
  cluster_main "$action" "$@"
  exit 0
fi
if [ "$action" = cli ]; then
  select_version "$target"
  [ -f "$STAMP" ] || die "not provisioned; run: $0 provision $V"
  [ $# -ge 1 ] || usage
  as_broker "$@"
  exit $?
fi
if [ "$target" = all ]; then targets=("${VERSIONS[@]}"); else targets=("$target"); fi
[ "$(id -u)" = 0 ] || [ "$action" = status ] || die "needs root (chroot, mount, apt-get)"
for v in "${targets[@]}"; do
  select_version "$v"
  case $action in
    provision) locked provision ;;
    start) locked start ;;
    wait) wait_ready "${1:-180}" ;;
    stop) locked stop ;;
    status) status ;;
    *) usage ;;
  esac
done
