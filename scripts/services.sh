#!/usr/bin/env bash
# Start/stop the local services the kbbot tests need: Redis and a single-node
# Weaviate (built from source with `go install` and cached).
#
#   scripts/services.sh start    start (or reuse) Redis + Weaviate, print env lines
#   scripts/services.sh stop     stop both, remove their temporary data dirs
#   scripts/services.sh status   show whether each service answers
#   scripts/services.sh env      print the env lines (add --export for `export X=..`)
#   scripts/services.sh cluster start|kill N|stop|status|env
#                                three Weaviate nodes on loopback (replication tests)
#   scripts/services.sh redis-ha start|kill primary|stop|status|env
#                                Redis primary + replica + three Sentinels (failover tests)
#
#   eval "$(scripts/services.sh env --export)"      # or: set -a; . <state>/services.env
#
# Environment knobs (all optional):
#   KBBOT_REDIS_PORT (6390)          KBBOT_WEAVIATE_PORT (8090)
#   KBBOT_WEAVIATE_GRPC_PORT (50061) KBBOT_WEAVIATE_GOSSIP_PORT (7956, data port = +1)
#   KBBOT_WEAVIATE_RAFT_PORT (8310, internal RPC port = +1)
#   KBBOT_STATE_DIR (${XDG_CACHE_HOME:-$HOME/.cache}/kbbot/run)
#   KBBOT_WEAVIATE_START_TIMEOUT (120 seconds)
#   KBBOT_WEAVIATE_DATA_DIR (a fresh temp dir, removed on stop; a dir given here is kept)
#   REDIS_URL / WEAVIATE_URL (+ WEAVIATE_GRPC_PORT): use an existing service, start nothing.
#   Cluster: KBBOT_CLUSTER_WEAVIATE_PORT (8093), _GRPC_PORT (50064), _GOSSIP_PORT (7962), _RAFT_PORT
#   (8316): node N uses +N-1 (HTTP, gRPC) and +2(N-1) (gossip/data, Raft/RPC pairs).
#   Redis HA: KBBOT_HA_REDIS_PORT (6393: primary; +1 replica; +2..+4 Sentinels), KBBOT_HA_REDIS_MASTER
#   (kbbot), KBBOT_HA_DOWN_AFTER_MS (1000), KBBOT_HA_FAILOVER_TIMEOUT_MS (10000).
#   Any other Weaviate setting in the environment is passed through when the
#   server is (re)started, e.g. ENABLE_TOKENIZER_GSE_CH=true for the Chinese
#   'gse_ch' tokenizer ('gse' uses gse's Japanese dictionary; +~3 s startup).
#
# Messages go to stderr; only the env lines go to stdout.
set -euo pipefail

WEAVIATE_VERSION=v1.38.11
WEAVIATE_PKG=github.com/weaviate/weaviate/cmd/weaviate-server

CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/kbbot"
STATE_DIR="${KBBOT_STATE_DIR:-$CACHE_ROOT/run}"
WEAVIATE_CACHE_DIR="$CACHE_ROOT/weaviate-$WEAVIATE_VERSION"
WEAVIATE_BUILD_LOG="$CACHE_ROOT/weaviate-$WEAVIATE_VERSION.build.log"
WEAVIATE_BUILD_LOCK="$CACHE_ROOT/weaviate-$WEAVIATE_VERSION.build.lock"

REDIS_PORT="${KBBOT_REDIS_PORT:-6390}"
WV_PORT="${KBBOT_WEAVIATE_PORT:-8090}"
WV_GRPC_PORT="${KBBOT_WEAVIATE_GRPC_PORT:-50061}"
# memberlist gossip (TCP+UDP) and the internal cluster data API (gossip + 1).
WV_GOSSIP_PORT="${KBBOT_WEAVIATE_GOSSIP_PORT:-7956}"
WV_DATA_PORT=$((WV_GOSSIP_PORT + 1))
# With CLUSTER_IN_LOCALHOST=true Weaviate derives the internal RPC port as
# RAFT_PORT + 1, so the two must stay adjacent.
WV_RAFT_PORT="${KBBOT_WEAVIATE_RAFT_PORT:-8310}"
WV_RAFT_RPC_PORT=$((WV_RAFT_PORT + 1))
WV_START_TIMEOUT="${KBBOT_WEAVIATE_START_TIMEOUT:-120}"

LOCAL_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
LOCAL_WEAVIATE_URL="http://127.0.0.1:$WV_PORT"

REDIS_PIDFILE="$STATE_DIR/redis.pid"
REDIS_LOG="$STATE_DIR/redis.log"
REDIS_DIRFILE="$STATE_DIR/redis.datadir"
WV_PIDFILE="$STATE_DIR/weaviate.pid"
WV_LOG="$STATE_DIR/weaviate.log"
WV_DIRFILE="$STATE_DIR/weaviate.datadir"
ENV_FILE="$STATE_DIR/services.env"

# ---------------------------------------------------------------- helpers

log() { printf 'services.sh: %s\n' "$*" >&2; }
die() { printf 'services.sh: ERROR: %s\n' "$*" >&2; exit 1; }

tail_log() { # file [lines]
    local f=$1 n=${2:-40}
    if [[ -s $f ]]; then
        printf -- '----- last %s lines of %s -----\n' "$n" "$f" >&2
        tail -n "$n" "$f" >&2 || true
        printf -- '-----\n' >&2
    else
        log "(log $f is empty or missing)"
    fi
}

# Alive = exists and is not a zombie (our own children stay zombies until reaped).
pid_alive() {
    [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null || return 1
    local stat=""
    read -r stat <"/proc/$1/stat" 2>/dev/null || return 0
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

read_pid() { # pidfile -> pid on stdout (empty if missing/garbage)
    local p=""
    [[ -f $1 ]] && read -r p <"$1" 2>/dev/null || true
    [[ $p =~ ^[0-9]+$ ]] && printf '%s' "$p" || true
}

# Is pid alive and is it running the given program (guards against pid reuse)?
pid_is() { # pid name
    pid_alive "$1" || return 1
    local exe
    exe=$(readlink "/proc/$1/exe" 2>/dev/null || true)
    [[ -z $exe || $exe == *"$2"* ]] && return 0
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q -- "$2"
}

port_open() { # host port : something accepts TCP connections
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
}

# HTTP status code of a GET (000 when unreachable). curl, else wget, else /dev/tcp.
http_status() { # url
    local url=$1 code
    if command -v curl >/dev/null 2>&1; then
        code=$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$url" 2>/dev/null) || true
        printf '%s' "${code:-000}"
        return
    fi
    if command -v wget >/dev/null 2>&1; then
        code=$(wget -q -T 3 -t 1 -S -O /dev/null "$url" 2>&1 | awk '/^  HTTP\//{c=$2} END{print c}') || true
        printf '%s' "${code:-000}"
        return
    fi
    local rest=${url#http://} hostport path host port line
    hostport=${rest%%/*}; path=/${rest#*/}; [[ $rest == */* ]] || path=/
    host=${hostport%:*}; port=${hostport##*:}; [[ $hostport == *:* ]] || port=80
    line=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
        printf "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" "$2" "$0" >&3; head -n1 <&3' \
        "$host" "$port" "$path" 2>/dev/null) || true
    code=$(awk '{print $2}' <<<"$line")
    printf '%s' "${code:-000}"
}

redis_ping() { # url
    local url=$1 out
    if command -v redis-cli >/dev/null 2>&1; then
        out=$(timeout 3 redis-cli -u "$url" ping 2>/dev/null) || return 1
        [[ $out == PONG ]]
        return
    fi
    # Fallback without redis-cli (no auth/TLS support): raw RESP PING.
    local rest=${url#*://} hostport host port
    rest=${rest##*@}; hostport=${rest%%/*}
    host=${hostport%:*}; port=${hostport##*:}; [[ $hostport == *:* ]] || port=6379
    out=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
        printf "PING\r\n" >&3; head -n1 <&3' "$host" "$port" 2>/dev/null) || return 1
    [[ $out == +PONG* ]]
}

weaviate_ready() { [[ $(http_status "$1/v1/.well-known/ready") == 200 ]]; }

# Current env values (external ones win).
redis_url() { printf '%s' "${REDIS_URL:-$LOCAL_REDIS_URL}"; }
weaviate_url() { local u=${WEAVIATE_URL:-$LOCAL_WEAVIATE_URL}; printf '%s' "${u%/}"; }
weaviate_grpc_port() {
    if [[ -n ${WEAVIATE_URL:-} && $(weaviate_url) != "$LOCAL_WEAVIATE_URL" ]]; then
        printf '%s' "${WEAVIATE_GRPC_PORT:-$WV_GRPC_PORT}"
    else
        printf '%s' "$WV_GRPC_PORT"
    fi
}
# An externally provided URL that points at our own managed instance (e.g. left
# over from `eval $(services.sh env)`) is treated as managed, not external.
redis_external() { [[ -n ${REDIS_URL:-} && ${REDIS_URL%/} != "$LOCAL_REDIS_URL" && ${REDIS_URL%/} != "${LOCAL_REDIS_URL%/0}" ]]; }
weaviate_external() { [[ -n ${WEAVIATE_URL:-} && $(weaviate_url) != "$LOCAL_WEAVIATE_URL" ]]; }

print_env() { # [--export]
    local prefix=""
    [[ ${1:-} == --export ]] && prefix="export "
    printf '%sREDIS_URL=%q\n' "$prefix" "$(redis_url)"
    printf '%sWEAVIATE_URL=%q\n' "$prefix" "$(weaviate_url)"
    printf '%sWEAVIATE_GRPC_PORT=%q\n' "$prefix" "$(weaviate_grpc_port)"
}

# Serialise start/stop of the managed services across concurrent invocations.
lock_state() {
    mkdir -p "$STATE_DIR"
    exec 8>"$STATE_DIR/services.lock"
    if ! flock -n 8; then
        log "another services.sh is starting/stopping services; waiting for $STATE_DIR/services.lock ..."
        flock -w 900 8 || die "timed out waiting for $STATE_DIR/services.lock"
    fi
}

# Wait for a command to succeed, printing a dot every 30 s. Returns its status
# once it succeeds; never times out by itself (callers bound it if needed).
wait_with_dots() { # cmd...
    local start=$SECONDS next=$((SECONDS + 30)) dotted=0
    until "$@"; do
        if ((SECONDS >= next)); then
            printf '.' >&2; dotted=1; next=$((SECONDS + 30))
        fi
        sleep 2
    done
    ((dotted)) && printf ' (%ss)\n' "$((SECONDS - start))" >&2
    return 0
}

# ---------------------------------------------------------------- redis

ensure_redis_installed() { # [command package]
    local cmd=${1:-redis-server} pkg=${2:-redis-server}
    command -v "$cmd" >/dev/null 2>&1 && return 0
    log "$cmd not found; installing $pkg with apt-get (needs root) ..."
    ((EUID == 0)) || die "$cmd is missing and we are not root; install it: apt-get install $pkg"
    command -v apt-get >/dev/null 2>&1 || die "$cmd is missing and apt-get is unavailable; install $pkg manually"
    # Don't let the package's init script start a system-wide Redis on 6379 (or a Sentinel on 26379).
    local added_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && added_policy=1
    fi
    local rc=0 apt_log="$STATE_DIR/apt-$pkg.log"
    mkdir -p "$STATE_DIR"
    {
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$pkg"
    } >"$apt_log" 2>&1 </dev/null 8>&- || rc=$?
    ((added_policy)) && rm -f /usr/sbin/policy-rc.d
    if ((rc != 0)); then
        tail_log "$apt_log" 30
        die "apt-get install $pkg failed (exit $rc); log: $apt_log"
    fi
    command -v "$cmd" >/dev/null 2>&1 || die "$cmd still not on PATH after installing $pkg"
}

start_redis() {
    if redis_external; then
        redis_ping "$REDIS_URL" || die "REDIS_URL=$REDIS_URL is set but does not answer PING"
        log "redis: using external REDIS_URL=$REDIS_URL (answers PING)"
        return 0
    fi
    local pid
    pid=$(read_pid "$REDIS_PIDFILE")
    if pid_is "$pid" redis-server; then
        if redis_ping "$LOCAL_REDIS_URL"; then
            log "redis: already running (pid $pid) on 127.0.0.1:$REDIS_PORT"
            return 0
        fi
        die "redis pid $pid is alive but 127.0.0.1:$REDIS_PORT does not answer PING; run: $0 stop"
    fi
    cleanup_redis_files
    if port_open 127.0.0.1 "$REDIS_PORT"; then
        die "port $REDIS_PORT is in use by a process this script did not start; stop it or set KBBOT_REDIS_PORT"
    fi
    ensure_redis_installed
    command -v redis-cli >/dev/null 2>&1 || log "redis: redis-cli not found; using a raw-socket PING check"

    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/kbbot-redis.XXXXXX")
    printf '%s\n' "$dir" >"$REDIS_DIRFILE"
    : >"$REDIS_LOG"
    log "redis: starting on 127.0.0.1:$REDIS_PORT (no persistence, log $REDIS_LOG)"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --protected-mode yes \
        --daemonize yes --pidfile "$REDIS_PIDFILE" --logfile "$REDIS_LOG" \
        --dir "$dir" --save '' --appendonly no >&2 8>&- 9>&- ||
        { tail_log "$REDIS_LOG"; die "redis-server failed to start"; }
    local i
    for ((i = 0; i < 100; i++)); do
        redis_ping "$LOCAL_REDIS_URL" && break
        sleep 0.1
    done
    redis_ping "$LOCAL_REDIS_URL" || { tail_log "$REDIS_LOG"; die "redis did not answer PING within 10 s"; }
    log "redis: ready (pid $(read_pid "$REDIS_PIDFILE"))"
}

cleanup_redis_files() {
    local dir=""
    [[ -f $REDIS_DIRFILE ]] && read -r dir <"$REDIS_DIRFILE" || true
    [[ -n $dir && $dir == */kbbot-redis.* && -d $dir ]] && rm -rf -- "$dir"
    rm -f -- "$REDIS_DIRFILE" "$REDIS_PIDFILE"
}

stop_redis() {
    local pid
    pid=$(read_pid "$REDIS_PIDFILE")
    if pid_is "$pid" redis-server; then
        log "redis: stopping pid $pid"
        stop_pid "$pid" 15
    else
        log "redis: not running (no live pid in $REDIS_PIDFILE)"
    fi
    cleanup_redis_files
}

# ---------------------------------------------------------------- weaviate

find_go() {
    if command -v go >/dev/null 2>&1; then return 0; fi
    if [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; return 0; fi
    die "Go is required to build weaviate-server $WEAVIATE_VERSION (go.mod needs go >= 1.26; a Go >= 1.21 toolchain downloads it automatically). Install Go (https://go.dev/dl/) or put a weaviate-server binary on PATH."
}

other_build_running() {
    pgrep -f "go install $WEAVIATE_PKG@$WEAVIATE_VERSION" >/dev/null 2>&1
}

build_weaviate() { # -> binary path on stdout
    local bin="$WEAVIATE_CACHE_DIR/weaviate-server"
    mkdir -p "$WEAVIATE_CACHE_DIR"
    exec 9>"$WEAVIATE_BUILD_LOCK"
    if ! flock -n 9; then
        log "weaviate: another build holds $WEAVIATE_BUILD_LOCK; waiting for it (see $WEAVIATE_BUILD_LOG)"
        wait_with_dots flock -n 9
    fi
    # A build started outside this script (no lock) may be writing the binary.
    if other_build_running; then
        log "weaviate: a 'go install $WEAVIATE_PKG@$WEAVIATE_VERSION' is already running; waiting for it to finish"
        wait_with_dots eval '! other_build_running'
    fi
    if [[ -x $bin ]]; then
        exec 9>&-
        printf '%s' "$bin"
        return 0
    fi

    find_go
    log "weaviate: building weaviate-server $WEAVIATE_VERSION with 'go install' into $WEAVIATE_CACHE_DIR"
    log "weaviate: a cold build takes several minutes (~4-5 min on 2 CPUs, longer on slow links); log: $WEAVIATE_BUILD_LOG"
    local tmpbin start=$SECONDS rc=0
    tmpbin=$(mktemp -d "$WEAVIATE_CACHE_DIR/.build.XXXXXX")
    {
        printf '# %s: go install %s@%s (%s)\n' "$(date -Is)" "$WEAVIATE_PKG" "$WEAVIATE_VERSION" "$(go version)"
    } >"$WEAVIATE_BUILD_LOG"
    # Build into a private dir and move into place so nobody sees a half-written binary.
    (exec 8>&- && cd / && GOBIN="$tmpbin" GOFLAGS=-trimpath GOWORK=off \
        exec go install "$WEAVIATE_PKG@$WEAVIATE_VERSION") >>"$WEAVIATE_BUILD_LOG" 2>&1 &
    local bpid=$!
    wait_with_dots eval '! pid_alive '"$bpid"
    wait "$bpid" || rc=$?
    printf '# exit %s after %ss\n' "$rc" "$((SECONDS - start))" >>"$WEAVIATE_BUILD_LOG"
    if ((rc != 0)) || [[ ! -x $tmpbin/weaviate-server ]]; then
        rm -rf -- "$tmpbin"
        tail_log "$WEAVIATE_BUILD_LOG" 40
        die "building weaviate-server $WEAVIATE_VERSION failed (exit $rc); full log: $WEAVIATE_BUILD_LOG"
    fi
    mv -f "$tmpbin/weaviate-server" "$bin"
    rm -rf -- "$tmpbin"
    log "weaviate: build finished in $((SECONDS - start))s -> $bin"
    exec 9>&-
    printf '%s' "$bin"
}

weaviate_binary() { # -> path on stdout
    local bin
    if bin=$(command -v weaviate-server 2>/dev/null); then
        printf '%s' "$bin"; return 0
    fi
    bin="$WEAVIATE_CACHE_DIR/weaviate-server"
    if [[ -x $bin ]] && ! other_build_running; then
        printf '%s' "$bin"; return 0
    fi
    build_weaviate
}

# The gse tokenizer (ENABLE_TOKENIZER_GSE) loads its dictionaries at runtime from
# "<dir of gse's source file>/data/dict/...". With -trimpath that path is the
# relative "github.com/go-ego/gse@<ver>/data/...", resolved against the server's
# working directory. (Without it, the gse tokenizer fails silently: bm25 on a
# gse property returns nothing and the server logs a nil-pointer panic.) So we
# keep a copy of gse's data/dict under $GSE_ROOT and start the server there.
GSE_ROOT="$CACHE_ROOT/gse-data"

ensure_gse_dicts() { # binary
    local bin=$1 mod ver rel src="" tmp
    mod=$(grep -aoE -m1 'github\.com/go-ego/gse@v[0-9A-Za-z.+-]+/' "$bin" | sed -n 1p) || true
    if [[ -z $mod ]]; then
        log "weaviate: WARNING: could not find the gse module version in $bin; gse tokenization may not work"
        return 0
    fi
    mod=${mod%/}; ver=${mod#*@}
    rel="$mod/data/dict"
    [[ -s $GSE_ROOT/$rel/jp/dict.txt && -s $GSE_ROOT/$rel/zh/s_1.txt ]] && return 0

    local modcache=""
    if command -v go >/dev/null 2>&1 || [[ -x /usr/local/go/bin/go ]]; then
        modcache=$(PATH="$PATH:/usr/local/go/bin" go env GOMODCACHE 2>/dev/null) || true
    fi
    for src in "$modcache/$rel" "${GOPATH:-$HOME/go}/pkg/mod/$rel"; do
        [[ -s $src/jp/dict.txt ]] && break
        src=""
    done
    if [[ -z $src ]] && [[ -n $modcache ]]; then
        log "weaviate: fetching gse $ver dictionaries with 'go mod download'"
        local dir
        dir=$(cd / && PATH="$PATH:/usr/local/go/bin" GOFLAGS=-mod=mod go mod download -json "github.com/go-ego/gse@$ver" 2>/dev/null |
            sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p') || true
        [[ -n $dir && -s $dir/data/dict/jp/dict.txt ]] && src="$dir/data/dict"
    fi
    if [[ -z $src ]]; then
        log "weaviate: WARNING: gse $ver dictionaries not found (need Go and its module cache); 'gse' tokenization will NOT work"
        return 0
    fi
    log "weaviate: copying gse $ver dictionaries to $GSE_ROOT"
    mkdir -p "$GSE_ROOT/$mod/data"
    tmp=$(mktemp -d "$GSE_ROOT/$mod/data/.dict.XXXXXX")
    cp -R "$src/." "$tmp/" && chmod -R u+w "$tmp"
    rm -rf -- "${GSE_ROOT:?}/$rel"
    mv "$tmp" "$GSE_ROOT/$rel"
}

cleanup_weaviate_files() {
    local dir=""
    [[ -f $WV_DIRFILE ]] && read -r dir <"$WV_DIRFILE" || true
    [[ -n $dir && $dir == */kbbot-weaviate.* && -d $dir ]] && rm -rf -- "$dir"
    rm -f -- "$WV_DIRFILE" "$WV_PIDFILE"
}

wait_weaviate_ready() { # pid [url grpc_port log]
    local pid=$1 url=${2:-$LOCAL_WEAVIATE_URL} grpc=${3:-$WV_GRPC_PORT} log=${4:-$WV_LOG}
    local deadline=$((SECONDS + WV_START_TIMEOUT))
    until weaviate_ready "$url"; do
        if ! pid_alive "$pid"; then
            tail_log "$log" 60
            die "weaviate-server (pid $pid) exited during startup; log: $log"
        fi
        if ((SECONDS >= deadline)); then
            tail_log "$log" 60
            die "weaviate not ready at $url/v1/.well-known/ready after ${WV_START_TIMEOUT}s (pid $pid still running; '$0 stop' to kill it)"
        fi
        sleep 0.5
    done
    # weaviate-client v4 talks gRPC: make sure that port is up too.
    deadline=$((SECONDS + 30))
    until port_open 127.0.0.1 "$grpc"; do
        if ((SECONDS >= deadline)) || ! pid_alive "$pid"; then
            tail_log "$log" 60
            die "weaviate is ready over HTTP but gRPC port $grpc is not accepting connections"
        fi
        sleep 0.5
    done
}

# Runs one weaviate-server in the foreground (callers put it in the background). Gossip and data
# ports are adjacent, as are Raft and internal RPC: with CLUSTER_IN_LOCALHOST=true Weaviate derives
# a peer's data and RPC ports as its gossip and Raft ports + 1.
spawn_weaviate() { # bin data log hostname http grpc gossip raft raft_join bootstrap_expect cluster_join
    local bin=$1 data=$2 log=$3 host=$4 http=$5 grpc=$6 gossip=$7 raft=$8 raft_join=$9 expect=${10} join=${11}
    cd "$GSE_ROOT" # gse resolves its dictionaries relative to the cwd, see ensure_gse_dicts
    # USE_BLOCKMAX_WAND=false: 1.35.2's BlockMax WAND dropped unflushed objects from BM25 results
    # for up to a minute after a write (weaviate/weaviate#11780); kept off, the BM25 our figures use.
    # QUERY_BATCHED_CONTAINS_ENABLED=true (1.38.11+, opt-in): a ContainsAny filter resolved in one
    # batch, not one sub-filter per value: the permission filter (`readers` holding any of an
    # audience's principals) costs x1.02 of retrieval without it at 699 values, x2.6 per value.
    export AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED="${AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED:-true}" \
        PERSISTENCE_DATA_PATH="$data" \
        DEFAULT_VECTORIZER_MODULE=none \
        ENABLE_MODULES="" \
        ENABLE_TOKENIZER_GSE=true \
        CLUSTER_HOSTNAME="$host" \
        CLUSTER_IN_LOCALHOST=true \
        CLUSTER_BIND_ADDR=127.0.0.1 \
        CLUSTER_GOSSIP_BIND_PORT="$gossip" \
        CLUSTER_DATA_BIND_PORT="$((gossip + 1))" \
        RAFT_PORT="$raft" \
        RAFT_INTERNAL_RPC_PORT="$((raft + 1))" \
        RAFT_JOIN="$raft_join" \
        RAFT_BOOTSTRAP_EXPECT="$expect" \
        RAFT_TIMEOUTS_MULTIPLIER=1 \
        GRPC_PORT="$grpc" \
        QUERY_DEFAULTS_LIMIT=25 \
        DISABLE_TELEMETRY=true \
        GO_PROFILING_DISABLE=true \
        PROMETHEUS_MONITORING_ENABLED=false \
        USE_BLOCKMAX_WAND="${USE_BLOCKMAX_WAND:-false}" \
        QUERY_BATCHED_CONTAINS_ENABLED="${QUERY_BATCHED_CONTAINS_ENABLED:-true}" \
        LOG_LEVEL=warning
    unset CLUSTER_ADVERTISE_ADDR CLUSTER_ADVERTISE_PORT
    if [[ -n $join ]]; then export CLUSTER_JOIN="$join"; else unset CLUSTER_JOIN; fi
    exec 8>&- 9>&- # don't let the server inherit our lock fds
    exec setsid "$bin" --host 127.0.0.1 --port "$http" --scheme http </dev/null >>"$log" 2>&1
}

start_weaviate() {
    if weaviate_external; then
        weaviate_ready "$(weaviate_url)" || die "WEAVIATE_URL=$WEAVIATE_URL is set but $(weaviate_url)/v1/.well-known/ready is not 200"
        log "weaviate: using external WEAVIATE_URL=$(weaviate_url) (ready; gRPC port $(weaviate_grpc_port))"
        return 0
    fi
    local pid
    pid=$(read_pid "$WV_PIDFILE")
    if pid_is "$pid" weaviate-server; then
        if ! weaviate_ready "$LOCAL_WEAVIATE_URL"; then
            log "weaviate: pid $pid is running but not ready yet; waiting"
            wait_weaviate_ready "$pid"
        fi
        log "weaviate: already running (pid $pid) at $LOCAL_WEAVIATE_URL"
        return 0
    fi
    cleanup_weaviate_files

    local p
    for p in "$WV_PORT" "$WV_GRPC_PORT" "$WV_GOSSIP_PORT" "$WV_DATA_PORT" "$WV_RAFT_PORT" "$WV_RAFT_RPC_PORT"; do
        port_open 127.0.0.1 "$p" &&
            die "port $p is already in use (weaviate needs $WV_PORT http, $WV_GRPC_PORT grpc, $WV_GOSSIP_PORT/$WV_DATA_PORT cluster, $WV_RAFT_PORT/$WV_RAFT_RPC_PORT raft); stop the other process or set KBBOT_WEAVIATE_*_PORT"
    done

    local bin
    bin=$(weaviate_binary)
    [[ -x $bin ]] || die "no usable weaviate-server binary (got '$bin')"
    ensure_gse_dicts "$bin"
    mkdir -p "$GSE_ROOT"

    local data
    if [[ -n ${KBBOT_WEAVIATE_DATA_DIR:-} ]]; then
        # A data dir of the caller's survives `stop` (restart tests); temporary ones do not.
        data=$KBBOT_WEAVIATE_DATA_DIR
        mkdir -p "$data"
    else
        data=$(mktemp -d "${TMPDIR:-/tmp}/kbbot-weaviate.XXXXXX")
    fi
    printf '%s\n' "$data" >"$WV_DIRFILE"
    : >"$WV_LOG"
    log "weaviate: starting $bin on $LOCAL_WEAVIATE_URL (grpc $WV_GRPC_PORT, data $data, log $WV_LOG)"
    spawn_weaviate "$bin" "$data" "$WV_LOG" node1 "$WV_PORT" "$WV_GRPC_PORT" "$WV_GOSSIP_PORT" "$WV_RAFT_PORT" \
        "node1:$WV_RAFT_PORT" 1 "" &
    pid=$!
    printf '%s\n' "$pid" >"$WV_PIDFILE"
    wait_weaviate_ready "$pid"
    log "weaviate: ready (pid $pid) at $LOCAL_WEAVIATE_URL, gRPC 127.0.0.1:$WV_GRPC_PORT"
}

stop_pid() { # pid timeout_seconds
    local pid=$1 t=${2:-30} i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < t * 10; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    log "pid $pid did not exit after ${t}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    log "WARNING: pid $pid is still alive"
}

stop_weaviate() {
    local pid
    pid=$(read_pid "$WV_PIDFILE")
    if pid_is "$pid" weaviate-server; then
        log "weaviate: stopping pid $pid"
        stop_pid "$pid" 30
    else
        log "weaviate: not running (no live pid in $WV_PIDFILE)"
    fi
    cleanup_weaviate_files
}

# ---------------------------------------------------------------- weaviate cluster
# Three nodes on loopback for the replication tests (`cluster start|stop|kill N|status|env`).
# Node N (1-3) listens on <base>+N-1 for HTTP and gRPC, and on <base>+2(N-1) (and +1) for gossip/data
# and Raft/RPC. Data lives under $STATE_DIR/cluster/nodeN until `cluster stop`, so a killed node
# started again rejoins with what it had and catches up.
CL_NODES=3
CL_HTTP_PORT="${KBBOT_CLUSTER_WEAVIATE_PORT:-8093}"
CL_GRPC_PORT="${KBBOT_CLUSTER_WEAVIATE_GRPC_PORT:-50064}"
CL_GOSSIP_PORT="${KBBOT_CLUSTER_WEAVIATE_GOSSIP_PORT:-7962}"
CL_RAFT_PORT="${KBBOT_CLUSTER_WEAVIATE_RAFT_PORT:-8316}"
CL_DIR="$STATE_DIR/cluster"

cl_http() { printf '%s' "$((CL_HTTP_PORT + $1 - 1))"; }
cl_grpc() { printf '%s' "$((CL_GRPC_PORT + $1 - 1))"; }
cl_gossip() { printf '%s' "$((CL_GOSSIP_PORT + 2 * ($1 - 1)))"; }
cl_raft() { printf '%s' "$((CL_RAFT_PORT + 2 * ($1 - 1)))"; }
cl_url() { printf 'http://127.0.0.1:%s' "$(cl_http "$1")"; }

cl_raft_join() {
    local n out=""
    for ((n = 1; n <= CL_NODES; n++)); do out+="${out:+,}node$n:$(cl_raft "$n")"; done
    printf '%s' "$out"
}

cluster_node_check() { # n
    [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= CL_NODES)) || die "no cluster node '$1' (expected 1 to $CL_NODES)"
}

cluster_start() {
    mkdir -p "$CL_DIR"
    local bin n pid started=() ports p
    bin=$(weaviate_binary)
    ensure_gse_dicts "$bin"
    mkdir -p "$GSE_ROOT"
    for ((n = 1; n <= CL_NODES; n++)); do
        pid=$(read_pid "$CL_DIR/node$n.pid")
        pid_is "$pid" weaviate-server && continue
        ports=("$(cl_http "$n")" "$(cl_grpc "$n")" "$(cl_gossip "$n")" "$(($(cl_gossip "$n") + 1))" "$(cl_raft "$n")" "$(($(cl_raft "$n") + 1))")
        for p in "${ports[@]}"; do
            port_open 127.0.0.1 "$p" && die "cluster node$n: port $p is already in use; set KBBOT_CLUSTER_WEAVIATE_*_PORT"
        done
        mkdir -p "$CL_DIR/node$n/data"
        log "cluster: starting node$n on $(cl_url "$n") (grpc $(cl_grpc "$n"), gossip $(cl_gossip "$n"), raft $(cl_raft "$n"))"
        # A node joins the gossip ring through the members already up (a failed join is fatal to
        # Weaviate, so only live ones); the first node of a new cluster joins nobody.
        local join="" m
        for ((m = 1; m <= CL_NODES; m++)); do
            ((m != n)) && port_open 127.0.0.1 "$(cl_gossip "$m")" && join+="${join:+,}127.0.0.1:$(cl_gossip "$m")"
        done
        spawn_weaviate "$bin" "$CL_DIR/node$n/data" "$CL_DIR/node$n.log" "node$n" "$(cl_http "$n")" "$(cl_grpc "$n")" \
            "$(cl_gossip "$n")" "$(cl_raft "$n")" "$(cl_raft_join)" "$CL_NODES" "$join" &
        pid=$!
        printf '%s\n' "$pid" >"$CL_DIR/node$n.pid"
        started+=("$n")
        # The next node joins through this one: wait for its gossip port (after the gse dictionaries).
        local deadline=$((SECONDS + WV_START_TIMEOUT))
        until port_open 127.0.0.1 "$(cl_gossip "$n")"; do
            pid_alive "$pid" || { tail_log "$CL_DIR/node$n.log" 40; die "cluster: node$n exited during startup"; }
            ((SECONDS < deadline)) || die "cluster: node$n opened no gossip port within ${WV_START_TIMEOUT}s"
            sleep 0.5
        done
    done
    for n in "${started[@]}"; do
        wait_weaviate_ready "$(read_pid "$CL_DIR/node$n.pid")" "$(cl_url "$n")" "$(cl_grpc "$n")" "$CL_DIR/node$n.log"
        log "cluster: node$n ready (pid $(read_pid "$CL_DIR/node$n.pid"))"
    done
    cluster_env
}

cluster_kill() { # n: SIGKILL, data kept (a crash, not a shutdown)
    cluster_node_check "$1"
    local pid
    pid=$(read_pid "$CL_DIR/node$1.pid")
    if pid_is "$pid" weaviate-server; then
        log "cluster: killing node$1 (pid $pid)"
        kill -KILL "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 50; i++)); do pid_alive "$pid" || break; sleep 0.1; done
    else
        log "cluster: node$1 is not running"
    fi
    rm -f -- "$CL_DIR/node$1.pid"
}

cluster_stop() {
    local n pid
    for ((n = 1; n <= CL_NODES; n++)); do
        pid=$(read_pid "$CL_DIR/node$n.pid")
        if pid_is "$pid" weaviate-server; then
            log "cluster: stopping node$n (pid $pid)"
            stop_pid "$pid" 30
        fi
    done
    rm -rf -- "$CL_DIR"
}

cluster_status() {
    local n rc=0
    for ((n = 1; n <= CL_NODES; n++)); do
        if weaviate_ready "$(cl_url "$n")"; then log "cluster node$n: UP   $(cl_url "$n")"; else log "cluster node$n: DOWN $(cl_url "$n")"; rc=1; fi
    done
    return "$rc"
}

cluster_env() {
    printf 'WEAVIATE_URL=%s\nWEAVIATE_GRPC_PORT=%s\n' "$(cl_url 1)" "$(cl_grpc 1)"
}

cmd_cluster() {
    case "${1:-}" in
        start) lock_state; cluster_start ;;
        stop) lock_state; cluster_stop ;;
        kill) cluster_kill "${2:-}" ;;
        status) cluster_status ;;
        env) cluster_env ;;
        *) die "usage: $0 cluster start|stop|kill N|status|env" ;;
    esac
}

# ---------------------------------------------------------------- redis with sentinels
# A primary, one replica and three Sentinels (`redis-ha start|stop|kill primary|status|env`) on
# <base> (the first primary), <base>+1 (its replica) and <base>+2..4 (Sentinels), for the failover
# tests. After a failover the roles swap; `redis-ha kill primary` asks the Sentinels which one it is.
HA_PORT="${KBBOT_HA_REDIS_PORT:-6393}"
HA_MASTER="${KBBOT_HA_REDIS_MASTER:-kbbot}"
HA_DIR="$STATE_DIR/redis-ha"
# How long a silent primary counts as down, and the failover's own bound (milliseconds).
HA_DOWN_AFTER_MS="${KBBOT_HA_DOWN_AFTER_MS:-1000}"
HA_FAILOVER_TIMEOUT_MS="${KBBOT_HA_FAILOVER_TIMEOUT_MS:-10000}"

ha_redis_up() { # name port [replicaof-port]
    local name=$1 port=$2 dir="$HA_DIR/$1"
    mkdir -p "$dir"
    pid_is "$(read_pid "$dir/pid")" redis-server && return 0
    local args=(--bind 127.0.0.1 --port "$port" --protected-mode yes --daemonize yes --pidfile "$dir/pid"
        --logfile "$dir/log" --dir "$dir" --save '' --appendonly yes --appendfsync everysec
        --repl-diskless-sync yes --repl-diskless-sync-delay 0)
    [[ -n ${3:-} ]] && args+=(--replicaof 127.0.0.1 "$3")
    redis-server "${args[@]}" >&2 8>&- 9>&- || { tail_log "$dir/log"; die "redis-ha: $name failed to start"; }
    local i
    for ((i = 0; i < 100; i++)); do redis_ping "redis://127.0.0.1:$port/0" && return 0; sleep 0.1; done
    tail_log "$dir/log"; die "redis-ha: $name did not answer PING on $port"
}

ha_sentinel_up() { # i
    local i=$1 port=$((HA_PORT + 1 + $1)) dir="$HA_DIR/sentinel$1"
    mkdir -p "$dir"
    pid_is "$(read_pid "$dir/pid")" redis && return 0
    if [[ ! -f $dir/sentinel.conf ]]; then # Sentinel rewrites its own file: written once
        cat >"$dir/sentinel.conf" <<CONF
bind 127.0.0.1
port $port
daemonize yes
pidfile $dir/pid
logfile $dir/log
dir $dir
sentinel monitor $HA_MASTER 127.0.0.1 $HA_PORT 2
sentinel down-after-milliseconds $HA_MASTER $HA_DOWN_AFTER_MS
sentinel failover-timeout $HA_MASTER $HA_FAILOVER_TIMEOUT_MS
sentinel parallel-syncs $HA_MASTER 1
CONF
    fi
    redis-sentinel "$dir/sentinel.conf" >&2 8>&- 9>&- || { tail_log "$dir/log"; die "redis-ha: sentinel$i failed to start"; }
    local j
    for ((j = 0; j < 100; j++)); do redis_ping "redis://127.0.0.1:$port/0" && return 0; sleep 0.1; done
    tail_log "$dir/log"; die "redis-ha: sentinel$i did not answer PING on $port"
}

ha_primary_port() { # what the Sentinels say now
    local i out
    for ((i = 1; i <= 3; i++)); do
        out=$(timeout 3 redis-cli -p "$((HA_PORT + 1 + i))" sentinel get-master-addr-by-name "$HA_MASTER" 2>/dev/null | sed -n 2p) || true
        [[ -n $out ]] && { printf '%s' "$out"; return 0; }
    done
    return 1
}

ha_start() {
    ensure_redis_installed
    ensure_redis_installed redis-sentinel redis-sentinel
    mkdir -p "$HA_DIR"
    local primary_port=$HA_PORT
    # Started again after a failover: the current primary is whatever the Sentinels elected.
    [[ -f $HA_DIR/sentinel1/sentinel.conf ]] && primary_port=$(ha_primary_port || echo "$HA_PORT")
    if ((primary_port == HA_PORT)); then
        ha_redis_up node1 "$HA_PORT"
        ha_redis_up node2 "$((HA_PORT + 1))" "$HA_PORT"
    else
        ha_redis_up node2 "$((HA_PORT + 1))"
        ha_redis_up node1 "$HA_PORT" "$primary_port"
    fi
    local i
    for ((i = 1; i <= 3; i++)); do ha_sentinel_up "$i"; done
    log "redis-ha: primary 127.0.0.1:$primary_port, sentinels on $((HA_PORT + 2))-$((HA_PORT + 4)), master name $HA_MASTER"
    ha_env
}

ha_kill_primary() {
    local port name pid
    port=$(ha_primary_port) || die "redis-ha: no Sentinel answers"
    name=node1; ((port == HA_PORT + 1)) && name=node2
    pid=$(read_pid "$HA_DIR/$name/pid")
    pid_is "$pid" redis-server || die "redis-ha: the primary ($name on $port) is not running"
    log "redis-ha: killing the primary $name (pid $pid, port $port)"
    kill -KILL "$pid"
    local i
    for ((i = 0; i < 50; i++)); do pid_alive "$pid" || break; sleep 0.1; done
    rm -f -- "$HA_DIR/$name/pid"
    printf '%s\n' "$port"
}

ha_stop() {
    local d pid
    for d in "$HA_DIR"/sentinel1 "$HA_DIR"/sentinel2 "$HA_DIR"/sentinel3 "$HA_DIR"/node1 "$HA_DIR"/node2; do
        pid=$(read_pid "$d/pid")
        pid_is "$pid" redis && stop_pid "$pid" 10
    done
    rm -rf -- "$HA_DIR"
}

ha_env() {
    printf 'REDIS_SENTINELS=127.0.0.1:%s,127.0.0.1:%s,127.0.0.1:%s\nREDIS_MASTER_NAME=%s\n' \
        "$((HA_PORT + 2))" "$((HA_PORT + 3))" "$((HA_PORT + 4))" "$HA_MASTER"
}

cmd_redis_ha() {
    case "${1:-}" in
        start) lock_state; ha_start ;;
        stop) lock_state; ha_stop ;;
        kill) [[ ${2:-} == primary ]] || die "usage: $0 redis-ha kill primary"; ha_kill_primary ;;
        status) ha_primary_port >&2 && echo >&2 ;;
        env) ha_env ;;
        *) die "usage: $0 redis-ha start|stop|kill primary|status|env" ;;
    esac
}

# ---------------------------------------------------------------- commands

cmd_start() {
    mkdir -p "$STATE_DIR"
    # Resolve/build the binary before taking the state lock (the build can take
    # many minutes and has its own lock).
    if ! weaviate_external && ! pid_is "$(read_pid "$WV_PIDFILE")" weaviate-server; then
        weaviate_binary >/dev/null
    fi
    lock_state
    start_redis
    start_weaviate
    print_env >"$ENV_FILE.tmp" && mv -f "$ENV_FILE.tmp" "$ENV_FILE"
    log "env written to $ENV_FILE"
    print_env
}

cmd_stop() {
    lock_state
    stop_weaviate
    stop_redis
    rm -f -- "$ENV_FILE"
}

cmd_status() {
    local rc=0 u
    u=$(redis_url)
    if redis_ping "$u"; then
        log "redis:    UP   $u$(redis_external && echo ' (external)' || true)"
    else
        log "redis:    DOWN $u"; rc=1
    fi
    u=$(weaviate_url)
    if weaviate_ready "$u"; then
        log "weaviate: UP   $u (gRPC port $(weaviate_grpc_port))$(weaviate_external && echo ' (external)' || true)"
    else
        log "weaviate: DOWN $u"; rc=1
    fi
    return "$rc"
}

usage() {
    sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//' >&2
}

main() {
    case "${1:-}" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        restart) cmd_stop; cmd_start ;;
        status) cmd_status ;;
        env) print_env "${2:-}" ;;
        cluster) shift; cmd_cluster "$@" ;;
        redis-ha) shift; cmd_redis_ha "$@" ;;
        -h | --help | help) usage ;;
        *) usage; exit 2 ;;
    esac
}

main "$@"
