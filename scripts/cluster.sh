#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, for tests/cluster/ and for trying the chart by
# hand: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (nodes without
# kubelets), built from the Go module proxy at pinned versions into a cache directory outside
# the repository. Nothing is downloaded but Go modules; nothing built is committed.
#
#   scripts/cluster.sh build    build whatever of the pinned binaries is missing
#   scripts/cluster.sh bin      build if needed, print the directory holding the binaries
#   scripts/cluster.sh up       build if needed, start the cluster, wait for /readyz, and print
#                               KUBECONFIG=<path> as the last line (its user may do anything)
#   scripts/cluster.sh down     stop exactly the processes `up` started, remove its state
#   scripts/cluster.sh status   say what runs
#
# COHABIT_CLUSTER_CACHE (default ~/.cache/cohabit/cluster) holds the binaries, one folder per
# pinned version set; COHABIT_CLUSTER_DIR (default /tmp/cohabit-cluster-$UID) holds a running
# cluster's PKI, kubeconfig, logs and pids; COHABIT_CLUSTER_PORT (default 26443, below the
# range the kernel hands out for outgoing connections, which could take a port between the
# check and the bind) is the API server's port, with etcd and the controllers' ports just
# above it (`up` exits 75 when one is taken, before or while starting). COHABIT_CLUSTER_SCHEDULER_QPS and _BURST set the kube-scheduler's client rate
# limit (default 50 and 100, its own defaults).
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION=v1.37.2   # k8s.io/kubernetes; its staging modules are v0.<minor>.<patch>
ETCD_VERSION=v3.7.3   # go.etcd.io/etcd/server/v3; kubernetes v1.37 is built against etcd 3.7
KWOK_VERSION=v0.8.0   # sigs.k8s.io/kwok
HELM_VERSION=v4.3.2   # helm.sh/helm/v4

cache_root="${COHABIT_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cohabit/cluster}"
version_set="k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
bin_dir="$cache_root/$version_set/bin"
src_dir="$cache_root/$version_set/src"
state_dir="${COHABIT_CLUSTER_DIR:-/tmp/cohabit-cluster-$(id -u)}"
api_port="${COHABIT_CLUSTER_PORT:-26443}"
etcd_client_port=$((api_port + 1))
etcd_peer_port=$((api_port + 2))
kcm_port=$((api_port + 3))
scheduler_port=$((api_port + 4))
kwok_port=$((api_port + 5))
# The kube-scheduler's client rate limit (its defaults); a benchmark lifts it, so that the
# scheduler's own work sets the pace rather than its client's limit.
scheduler_qps="${COHABIT_CLUSTER_SCHEDULER_QPS:-50}"
scheduler_burst="${COHABIT_CLUSTER_SCHEDULER_BURST:-100}"

log() { echo "cluster: $*" >&2; }
die() {
    echo "cluster: error: $*" >&2
    exit 1
}

# ---------------------------------------------------------------------------------------------
# Build

need_go() {
    command -v go >/dev/null 2>&1 || die "Go is not installed; the cluster is built with Go (1.26 or newer) from the Go module proxy"
    export GOFLAGS="${GOFLAGS:-} -mod=mod"
    export CGO_ENABLED=0 GOTOOLCHAIN=local
}

# A wrapper module that builds k8s.io/kubernetes's commands. That module's own go.mod points
# each staging module (k8s.io/api, k8s.io/client-go, ...) at ./staging/src with a `replace`
# that does not apply to a dependency, and requires them at v0.0.0, which the proxy does not
# serve; so the wrapper replaces each one named there with its release, v0.<minor>.<patch>.
k8s_wrapper() {
    local dir="$src_dir/kubernetes" staging_version="v0.${K8S_VERSION#v1.}" gomod
    if [[ -f "$dir/.ready" ]]; then
        echo "$dir"
        return
    fi
    mkdir -p "$dir"
    gomod="$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [[ -f "$gomod" ]] || die "the module proxy did not give k8s.io/kubernetes@$K8S_VERSION's go.mod"
    {
        echo "module cohabit.local/cluster-build"
        echo
        echo "go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")"
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        echo "replace ("
        sed -n "s|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*$|\t\1 => \1 $staging_version|p" "$gomod"
        echo ")"
    } >"$dir/go.mod"
    (cd "$dir" && go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION") >&2
    touch "$dir/.ready"
    echo "$dir"
}

# A wrapper for etcd for the same reason: etcd's server module replaces its sibling modules
# with relative paths, which a dependency ignores; their releases at the same tag stand in.
etcd_wrapper() {
    local dir="$src_dir/etcd"
    if [[ -f "$dir/.ready" ]]; then
        echo "$dir"
        return
    fi
    mkdir -p "$dir"
    printf 'module cohabit.local/etcd-build\n\ngo 1.26.0\n' >"$dir/go.mod"
    (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION") >&2
    touch "$dir/.ready"
    echo "$dir"
}

k8s_ldflags() {
    local minor="${K8S_VERSION#v1.}" key value flags="-s -w"
    minor="${minor%%.*}"
    for pair in "gitVersion=$K8S_VERSION" gitMajor=1 "gitMinor=$minor" gitTreeState=clean \
        "buildDate=1970-01-01T00:00:00Z"; do
        key="${pair%%=*}"
        value="${pair#*=}"
        flags+=" -X k8s.io/client-go/pkg/version.$key=$value"
        flags+=" -X k8s.io/component-base/version.$key=$value"
    done
    echo "$flags"
}

build_one() { # NAME DIR PACKAGE [LDFLAGS]: go build PACKAGE in DIR into $bin_dir/NAME
    local name="$1" dir="$2" package="$3" ldflags="${4:--s -w}" started=$SECONDS
    log "building $name ($package)"
    (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$bin_dir/$name.partial" "$package")
    mv "$bin_dir/$name.partial" "$bin_dir/$name"
    log "built $name in $((SECONDS - started)) s"
}

install_one() { # NAME PACKAGE@VERSION: a module with no replace directives, built as it is
    local name="$1" started=$SECONDS
    log "building $name ($2)"
    GOBIN="$bin_dir" go install -trimpath -ldflags "-s -w" "$2"
    log "built $name in $((SECONDS - started)) s"
}

missing() {
    local name
    for name in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm; do
        [[ -x "$bin_dir/$name" ]] || echo "$name"
    done
}

build() {
    local name missing
    [[ -n "$(missing)" ]] || return 0
    need_go
    mkdir -p "$bin_dir"
    # One build at a time per version set (two test runs starting together): the second
    # waits, then finds the binaries there.
    exec 9>"$cache_root/$version_set.lock"
    flock 9
    mapfile -t missing < <(missing)
    if ((${#missing[@]})); then build_missing "${missing[@]}"; fi
    exec 9>&- # the cluster's processes must not inherit the lock
}

build_missing() {
    local name missing=("$@")
    log "building ${missing[*]} into $bin_dir (the first build takes about half an hour on two cores)"
    local k8s_dir="" etcd_dir=""
    for name in "${missing[@]}"; do
        case "$name" in
        kube-* | kubectl)
            [[ -n "$k8s_dir" ]] || k8s_dir="$(k8s_wrapper)"
            build_one "$name" "$k8s_dir" "k8s.io/kubernetes/cmd/$name" "$(k8s_ldflags)"
            ;;
        etcd)
            [[ -n "$etcd_dir" ]] || etcd_dir="$(etcd_wrapper)"
            build_one etcd "$etcd_dir" "go.etcd.io/etcd/server/v3"
            ;;
        kwok) install_one kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" ;;
        helm) install_one helm "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" ;;
        esac
    done
}

# ---------------------------------------------------------------------------------------------
# Run

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

pid_of() { # the recorded pid of a component, while that process still runs our binary
    local file="$state_dir/pids/$1" pid
    [[ -f "$file" ]] || return 1
    pid="$(cat "$file")"
    [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$bin_dir/$1")" ]] || return 1
    echo "$pid"
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pki() { # a CA, the API server's serving certificate, one client certificate per component
    local dir="$state_dir/pki"
    mkdir -p "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=cohabit-test-ca" \
        -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
    openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
    openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
    sign "$dir" apiserver "/CN=kube-apiserver" "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,\
DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,\
DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
    sign "$dir" admin "/O=system:masters/CN=cohabit-admin" "extendedKeyUsage=clientAuth"
    sign "$dir" controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
    sign "$dir" scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
    # kwok writes node and pod status for every node it plays, which no one node's kubelet
    # identity may do (the Node authorizer): it acts as a cluster administrator.
    sign "$dir" kwok "/O=system:masters/CN=kwok-controller" "extendedKeyUsage=clientAuth"
}

sign() { # DIR NAME SUBJECT EXTENSIONS
    local dir="$1" name="$2"
    openssl req -newkey rsa:2048 -nodes -subj "$3" -keyout "$dir/$name.key" \
        -out "$dir/$name.csr" 2>/dev/null
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
        -CAcreateserial -days 3650 -extfile <(printf '%s\n' "$4") -out "$dir/$name.crt" 2>/dev/null
    rm -f "$dir/$name.csr"
}

kubeconfig() { # NAME: a kubeconfig for that client certificate
    local pki="$state_dir/pki"
    cat >"$state_dir/$1.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: cohabit-test
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: $1
  user:
    client-certificate: $pki/$1.crt
    client-key: $pki/$1.key
contexts:
- name: $1
  context: {cluster: cohabit-test, user: $1}
current-context: $1
KUBECONFIG
}

start() { # NAME ARGS...: start one component in a session of its own, log and pid in the state
    local name="$1" pid binary
    shift
    setsid "$bin_dir/$name" "$@" >"$state_dir/logs/$name.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$state_dir/pids/$name"
    # Until the forked shell has exec'd setsid and setsid the binary, the pid runs bash or
    # setsid, and pid_of would take the component for gone: wait for the exec (or the exit).
    binary="$(readlink -f "$bin_dir/$name")"
    for _ in $(seq 600); do
        [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" != "$binary" ]] || return 0
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.05
    done
}

exit_of() { # PID: how a process this shell started ended, once it has
    local code=0
    if kill -0 "$1" 2>/dev/null; then
        echo "runs something other than its binary"
        return
    fi
    wait "$1" 2>/dev/null || code=$?
    if ((code > 128)); then
        echo "was killed by signal $((code - 128))"
    else
        echo "exited with status $code"
    fi
}

wait_for() { # WHAT SECONDS COMPONENT COMMAND...: until COMMAND succeeds, else fail with the log
    local what="$1" seconds="$2" name="$3"
    shift 3
    local deadline=$((SECONDS + seconds))
    # Its answer counts only while it runs: another cluster's component on the same port
    # may answer for one that failed to bind.
    until "$@" >/dev/null 2>&1 && pid_of "$name" >/dev/null; do
        if ((SECONDS > deadline)) || ! pid_of "$name" >/dev/null; then
            tail -n 30 "$state_dir/logs/$name.log" >&2 || true
            local log_dir how="did not come up within $seconds s" pid
            pid="$(cat "$state_dir/pids/$name")"
            pid_of "$name" >/dev/null || how="$(exit_of "$pid") while starting"
            log_dir="$(mktemp -d /tmp/cohabit-cluster-failed.XXXXXX)"
            cp -r "$state_dir/logs/." "$log_dir/"
            down >/dev/null
            # Any component's port taken (an earlier one may have answered through another
            # cluster's process, then died): another base port may do.
            if grep -qs "address already in use" "$log_dir"/*.log; then
                echo "cluster: error: $what found its port taken meanwhile (logs kept in $log_dir)" >&2
                exit 75 # EX_TEMPFAIL: another base port may do
            fi
            die "$what $how (logs kept in $log_dir)"
        fi
        sleep 0.5
    done
}

healthy() { # PORT PATH: the component answers 200 on https://127.0.0.1:PORT/PATH
    curl -fsk --max-time 5 --cert "$state_dir/pki/admin.crt" --key "$state_dir/pki/admin.key" \
        "https://127.0.0.1:$1/$2"
}

up() {
    build
    if [[ -f "$state_dir/admin.kubeconfig" ]] && all_running; then
        log "already running in $state_dir"
        echo "KUBECONFIG=$state_dir/admin.kubeconfig"
        return
    fi
    down >/dev/null
    local port
    for port in "$api_port" "$etcd_client_port" "$etcd_peer_port" "$kcm_port" \
        "$scheduler_port" "$kwok_port"; do
        if listening "$port"; then
            echo "cluster: error: port $port is taken (set COHABIT_CLUSTER_PORT to another base port)" >&2
            exit 75 # EX_TEMPFAIL: another base port may do
        fi
    done
    mkdir -p "$state_dir/logs" "$state_dir/pids" "$state_dir/etcd"
    pki
    local name
    for name in admin controller-manager scheduler kwok; do kubeconfig "$name"; done
    local pki="$state_dir/pki" started=$SECONDS

    start etcd --name cohabit-test --data-dir "$state_dir/etcd" --unsafe-no-fsync \
        --listen-client-urls "http://127.0.0.1:$etcd_client_port" \
        --advertise-client-urls "http://127.0.0.1:$etcd_client_port" \
        --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
        --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
        --initial-cluster "cohabit-test=http://127.0.0.1:$etcd_peer_port" --log-level warn
    wait_for "etcd" 60 etcd curl -fs "http://127.0.0.1:$etcd_client_port/health"

    # RBAC on, the default admission plugins (PodSecurity, ResourceQuota, ServiceAccount,
    # TaintNodesByCondition, ...) plus OwnerReferencesPermissionEnforcement, which OpenShift
    # turns on: blockOwnerDeletion then needs update on the owner's finalizers.
    start kube-apiserver --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
        --secure-port "$api_port" --etcd-servers "http://127.0.0.1:$etcd_client_port" \
        --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
        --client-ca-file "$pki/ca.crt" \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
        --service-cluster-ip-range 10.96.0.0/16 --authorization-mode Node,RBAC \
        --enable-admission-plugins OwnerReferencesPermissionEnforcement \
        --allow-privileged=true --endpoint-reconciler-type none --profiling=false
    wait_for "kube-apiserver" 180 kube-apiserver healthy "$api_port" readyz

    start kube-controller-manager --kubeconfig "$state_dir/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$state_dir/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$state_dir/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
        --use-service-account-credentials --service-account-private-key-file "$pki/sa.key" \
        --root-ca-file "$pki/ca.crt" --cluster-name cohabit-test --profiling=false
    start kube-scheduler --kubeconfig "$state_dir/scheduler.kubeconfig" \
        --authentication-kubeconfig "$state_dir/scheduler.kubeconfig" \
        --authorization-kubeconfig "$state_dir/scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$scheduler_port" --leader-elect=false \
        --profiling=false --kube-api-qps "$scheduler_qps" --kube-api-burst "$scheduler_burst"
    start kwok --kubeconfig "$state_dir/kwok.kubeconfig" --config scripts/kwok-stages.yaml \
        --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
        --node-lease-duration-seconds 40 --server-address "127.0.0.1:$kwok_port" \
        --cidr 10.244.0.0/16 --node-ip 10.0.0.1
    wait_for "kube-controller-manager" 120 kube-controller-manager healthy "$kcm_port" healthz
    wait_for "kube-scheduler" 120 kube-scheduler healthy "$scheduler_port" healthz
    wait_for "kwok" 60 kwok curl -fs "http://127.0.0.1:$kwok_port/healthz"
    # The service-account controller makes each namespace's `default` ServiceAccount, which
    # the ServiceAccount admission plugin needs before a pod is admitted there.
    wait_for "the default ServiceAccount" 60 kube-controller-manager \
        "$bin_dir/kubectl" --kubeconfig "$state_dir/admin.kubeconfig" get serviceaccount default
    log "up in $((SECONDS - started)) s; state, logs and pids in $state_dir"
    echo "KUBECONFIG=$state_dir/admin.kubeconfig"
}

all_running() {
    local name
    for name in "${COMPONENTS[@]}"; do pid_of "$name" >/dev/null || return 1; done
}

down() {
    local name pid stopped=()
    for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
        if pid="$(pid_of "$name")"; then
            kill "$pid" 2>/dev/null || true
            stopped+=("$pid")
        fi
    done
    for pid in "${stopped[@]}"; do
        for _ in $(seq 100); do
            [[ -d "/proc/$pid" ]] || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    done
    if [[ -d "$state_dir/pids" ]]; then rm -rf "$state_dir"; fi
    log "down (${#stopped[@]} processes stopped)"
}

status() {
    local name pid code=0
    for name in "${COMPONENTS[@]}"; do
        if pid="$(pid_of "$name")"; then
            echo "$name: running (pid $pid)"
        else
            echo "$name: not running"
            code=3
        fi
    done
    if ((code == 0)); then echo "KUBECONFIG=$state_dir/admin.kubeconfig"; fi
    return $code
}

case "${1:-}" in
build) build ;;
bin)
    build
    echo "$bin_dir"
    ;;
up) up ;;
down) down ;;
status) status ;;
*)
    echo "usage: scripts/cluster.sh build|bin|up|down|status" >&2
    exit 2
    ;;
esac
