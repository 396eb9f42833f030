#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this host for development and tests (see docs/slurm.md).
#
#   scripts/dev_slurm.sh start    install if needed, start munge, slurmdbd (accounting in the local MariaDB),
#                                 slurmctld, 4 slurmd, slurmrestd;
#                                 wait until the nodes are idle and the REST API answers; print env
#   scripts/dev_slurm.sh env      print the env lines (fresh JWT) for a running cluster
#   scripts/dev_slurm.sh status   show what runs
#   scripts/dev_slurm.sh stop     stop every daemon this script started
#
# Needs root (it installs packages, creates users and device nodes, and slurmd runs jobs as
# another user). State lives in $HCS_SLURM_DIR (default /var/lib/hcs-slurm).
set -euo pipefail

# apt-get that waits for another install (the test run may start two at once) instead of failing on its lock
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }

# The daemons outlive whoever started them: run from a directory that always exists (a test checkout may
# be deleted while they run, and slurmrestd then fails every job submission with "getcwd failed").
cd /
# Nor may they keep a descriptor this script inherited: a caller's lock file (flock LOCK dev_slurm.sh start)
# would stay locked for as long as the daemons run.
for fd_path in /proc/$$/fd/*; do
    fd="${fd_path##*/}"
    if [[ $fd -gt 2 && $fd -ne 255 ]]; then eval "exec $fd>&-" 2>/dev/null || true; fi
done
unset fd_path fd

STATE_DIR="${HCS_SLURM_DIR:-/var/lib/hcs-slurm}"
REST_PORT="${HCS_SLURM_REST_PORT:-6820}"
CTLD_PORT="${HCS_SLURM_CTLD_PORT:-16817}"
SLURMD_BASE_PORT="${HCS_SLURM_SLURMD_PORT:-16900}"
DBD_PORT="${HCS_SLURM_DBD_PORT:-16819}"
# Slurm accounting (per-project accounts, docs/slurm.md) keeps its tables in this MariaDB / MySQL database.
DB_HOST="${HCS_SLURM_DB_HOST:-127.0.0.1}"
DB_PORT="${HCS_SLURM_DB_PORT:-3306}"
DB_USER="${HCS_SLURM_DB_USER:-root}"
DB_PASS="${HCS_SLURM_DB_PASS:-}"
DB_NAME="${HCS_SLURM_DB_NAME:-hcs_slurm_acct}"
CLUSTER_NAME="hcs-dev"
# The account the job user's jobs are charged to when the portal names none (shared clusters).
SHARED_ACCOUNT="hcs-shared"
# 1: slurmdbd and accounting; 0 (set by start when the database server cannot be reached): none, as a cluster
# without slurmdbd runs (per-project accounts then fall back, docs/slurm.md).
ACCOUNTING=1
JOB_USER="${HCS_SLURM_USER:-hcs}"
# How slurmd tracks and limits a job's processes (read only when the daemons start).
PROCTRACK=proctrack/cgroup
TASK_PLUGIN=task/cgroup
REST_USER="slurmrest"
PARTITION="hcs"
NODES=(hcs-node-1 hcs-node-2 hcs-node-3 hcs-node-4)
TOKEN_LIFESPAN_S="${HCS_SLURM_TOKEN_LIFESPAN:-86400}"
WAIT_S="${HCS_SLURM_WAIT_S:-90}"
CONFIG_CHANGED=0

ETC="$STATE_DIR/etc"
RUN="$STATE_DIR/run"
LOG="$STATE_DIR/log"
OUTPUT_DIR="$STATE_DIR/output"
export SLURM_CONF="$ETC/slurm.conf"

log() { echo "dev_slurm: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

pid_alive() { # pid_alive PIDFILE -> 0 when the recorded process runs (readable by any user)
    # The name check keeps a pid file left over from before a reboot from matching another program.
    [[ -s "$1" ]] && grep -qaE 'slurm|munge' "/proc/$(cat "$1")/cmdline" 2>/dev/null
}

installed() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null \
        && command -v slurmrestd >/dev/null && command -v munged >/dev/null && command -v curl >/dev/null \
        && command -v slurmdbd >/dev/null && command -v sacctmgr >/dev/null && command -v mysql >/dev/null \
        && compgen -G "/usr/lib/*/slurm-wlm/auth_jwt.so" >/dev/null
}

find_daemon() { # find_daemon PROGRAM [ARG] -> pid of PROGRAM running this cluster's config (and ARG)
    local dir pid args
    for dir in /proc/[0-9]*; do
        pid="${dir#/proc/}"
        args="$( { tr '\0' ' ' <"$dir/cmdline"; } 2>/dev/null)" || continue
        [[ "$args" == "$1 "* || "$args" == *"/$1 "* ]] || continue
        [[ "$args" == *" $SLURM_CONF "* || "$args" == *"SLURM_CONF=$SLURM_CONF "* || "$1" == slurmrestd ]] || continue
        [[ -z "${2:-}" || "$args" == *" $2 "* ]] || continue
        echo "$pid"
        return 0
    done
    return 1
}

adopt() { # adopt PIDFILE PROGRAM [ARG] -> 0 when the daemon runs (recording its pid if it was untracked)
    local pid
    pid_alive "$1" && return 0
    pid="$(find_daemon "$2" "${3:-}")" || return 1
    echo "$pid" >"$1"
}

install_packages() {
    installed && return
    command -v apt-get >/dev/null || die "Slurm is not installed and apt-get is not available"
    log "installing slurm-wlm, munge, slurmrestd and slurmdbd from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt_get update -q >"$LOG/apt.log" 2>&1 || die "apt-get update failed (see $LOG/apt.log)"
    apt_get install -y -q --no-install-recommends slurm-wlm slurmd slurmctld slurm-client munge \
        slurmrestd slurm-wlm-jwt-plugin slurmdbd mariadb-client curl >>"$LOG/apt.log" 2>&1 \
        || die "apt-get install failed (see $LOG/apt.log)"
    installed || die "Slurm packages installed but a program or the JWT plugin is missing"
}

ensure_users() {
    if ! id "$JOB_USER" >/dev/null 2>&1; then
        useradd --system --create-home --home-dir "$STATE_DIR/home/$JOB_USER" --shell /bin/bash "$JOB_USER"
    fi
    if ! id "$REST_USER" >/dev/null 2>&1; then
        useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$REST_USER"
    fi
}

GPU_PREFIX=/dev/hcs-fake-nvidia

ensure_fake_gpus() {
    # Slurm wants each gres File to exist; AutoDetect=off keeps it from asking NVML. Character
    # devices with the NVIDIA driver's major (195) look like the real thing; there is no driver
    # here, so opening one fails harmlessly.
    local i j
    for i in $(seq 0 11); do
        [[ -c $GPU_PREFIX$i ]] && continue
        if ! mknod -m 666 "$GPU_PREFIX$i" c 195 "$i" 2>/dev/null; then
            # Containers without CAP_MKNOD: links to /dev/null are character devices as far as
            # Slurm can tell, so it still sets CUDA_VISIBLE_DEVICES (plain files would not do).
            log "mknod not permitted; fake GPU devices are links to /dev/null"
            GPU_PREFIX="$STATE_DIR/fake-gpu/nvidia"
            mkdir -p "$STATE_DIR/fake-gpu"
            for j in $(seq 0 11); do ln -sfn /dev/null "$GPU_PREFIX$j"; done
            return
        fi
    done
}

write_config() {
    local host node i
    host="$(hostname -s)"
    mkdir -p "$ETC" "$RUN" "$LOG" "$STATE_DIR/ctld" "$STATE_DIR/spool"
    install -d -o "$JOB_USER" -m 0755 "$OUTPUT_DIR"

    if [[ ! -s "$ETC/jwt_hs256.key" ]]; then
        dd if=/dev/urandom of="$ETC/jwt_hs256.key" bs=32 count=1 status=none
    fi
    chmod 0600 "$ETC/jwt_hs256.key"

    {
        cat <<EOF
# Written by scripts/dev_slurm.sh; regenerated on every start.
ClusterName=hcs-dev
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$ETC/jwt_hs256.key
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Each job step in a cgroup (cgroup.conf): its processes tracked there, held to the memory the job asked for
# (--mem); a step over it is killed and the job ends OUT_OF_MEMORY. Cgroup v1 or v2, whichever the host has.
ProctrackType=$PROCTRACK
TaskPlugin=$TASK_PLUGIN
JobAcctGatherType=jobacct_gather/none
$(accounting_conf)
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
# Schedule a submitted batch job at once instead of batching submits for up to 3 s (the default).
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
# The virtual nodes claim more CPUs and memory than this host has; trust slurm.conf.
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay visible to listings and status queries for 5 minutes (Slurm's default; sacct keeps them after).
MinJobAge=300
KillWait=5
# A dead slurmd is noticed within ~10 s (the fault tests kill one); pings every SlurmdTimeout/3.
SlurmdTimeout=10
InactiveLimit=0
EOF
        i=0
        for node in "${NODES[@]}"; do
            local gres="gpu:a100:8"
            [[ $i -ge 2 ]] && gres="gpu:v100:4"
            echo "NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 Port=$((SLURMD_BASE_PORT + i)) CPUs=16 RealMemory=65536 Gres=$gres State=UNKNOWN"
            i=$((i + 1))
        done
        echo "PartitionName=$PARTITION Nodes=$(
            IFS=,
            echo "${NODES[*]}"
        ) Default=YES MaxTime=INFINITE State=UP"
    } >"$ETC/slurm.conf.new"

    cat >"$ETC/gres.conf.new" <<EOF
AutoDetect=off
NodeName=${NODES[0]},${NODES[1]} Name=gpu Type=a100 File=${GPU_PREFIX}[0-7]
NodeName=${NODES[2]},${NODES[3]} Name=gpu Type=v100 File=${GPU_PREFIX}[8-11]
EOF

    cat >"$ETC/slurmdbd.conf.new" <<EOF
# Written by scripts/dev_slurm.sh; regenerated on every start.
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$ETC/jwt_hs256.key
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=$DB_HOST
StoragePort=$DB_PORT
StorageUser=$DB_USER
StorageLoc=$DB_NAME
EOF
    if [[ -n "$DB_PASS" ]]; then echo "StoragePass=$DB_PASS" >>"$ETC/slurmdbd.conf.new"; fi

    cat >"$ETC/cgroup.conf.new" <<EOF
# Written by scripts/dev_slurm.sh. CgroupPlugin is left to autodetect (cgroup/v1 on a v1 or hybrid host, v2 on a
# unified one). A job's memory is its --mem, without swap. Cores are not constrained: the virtual nodes claim
# 16 CPUs each, more than this host has, and a cpuset of CPUs the host lacks cannot be set. Devices are not
# either: the fake GPUs may be links to /dev/null, which every job needs.
CgroupAutomount=yes
ConstrainCores=no
ConstrainDevices=no
ConstrainRAMSpace=yes
ConstrainSwapSpace=yes
AllowedSwapSpace=0
EOF
    local file
    for file in slurm.conf gres.conf cgroup.conf slurmdbd.conf; do
        chmod 0644 "$ETC/$file.new"
        [[ $file == slurmdbd.conf ]] && chmod 0600 "$ETC/$file.new" # slurmdbd refuses a readable one
        if cmp -s "$ETC/$file.new" "$ETC/$file"; then
            rm "$ETC/$file.new"
        else
            mv "$ETC/$file.new" "$ETC/$file"
            CONFIG_CHANGED=1
        fi
    done
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    munge_ok && return
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    runuser -u munge -- /usr/sbin/munged 9>&- || die "munged did not start (is another munged holding /run/munge?)"
    touch "$RUN/munged.ours"
    for _ in $(seq 50); do
        munge_ok && return
        sleep 0.1
    done
    die "munged did not come up"
}

accounting_conf() {
    if [[ $ACCOUNTING -eq 0 ]]; then
        echo "# No accounting database could be reached when this was written (see dev_slurm.sh start's log)."
        echo "AccountingStorageType=accounting_storage/none"
        return
    fi
    cat <<EOF
# Accounting through slurmdbd (per-project accounts with GrpTRES); jobs need an association (the job user has
# the shared account by default), and association limits hold.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu
AccountingStorageEnforce=associations,limits
EOF
}

db() { # db SQL -> run SQL on the accounting database server
    MYSQL_PWD="$DB_PASS" mysql -h "$DB_HOST" -P "$DB_PORT" -u "$DB_USER" -N -B -e "$1"
}

start_slurmdbd() {
    adopt "$RUN/slurmdbd.pid" slurmdbd && return
    db "CREATE DATABASE IF NOT EXISTS \`$DB_NAME\`" 2>"$LOG/db.log" \
        || die "cannot reach MariaDB as $DB_USER@$DB_HOST:$DB_PORT to create $DB_NAME: $(cat "$LOG/db.log")"
    slurmdbd 9>&- 2>>"$LOG/slurmdbd.log" || true
    for _ in $(seq 100); do
        sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1 && return
        sleep 0.2
    done
    die "slurmdbd did not answer: $(tail -n 5 "$LOG/slurmdbd.log")"
}

ensure_accounting() {
    # The cluster, the shared account and the job user's association to it; each added once.
    sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER_NAME" \
        || sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
    sacctmgr -n -P show account "$SHARED_ACCOUNT" format=account | grep -qx "$SHARED_ACCOUNT" \
        || sacctmgr -i add account "$SHARED_ACCOUNT" cluster="$CLUSTER_NAME" \
            description="jobs that name no project account" organization=hcs >/dev/null
    # Operator: the portal (as the job user, through slurmrestd) adds project accounts and their limits.
    sacctmgr -n -P show user "$JOB_USER" format=user | grep -qx "$JOB_USER" \
        || sacctmgr -i add user "$JOB_USER" account="$SHARED_ACCOUNT" defaultaccount="$SHARED_ACCOUNT" \
            cluster="$CLUSTER_NAME" adminlevel=Operator >/dev/null
}

plugins_mismatch() { # 0 when the running cluster tracks and binds its jobs with other plugins than configured
    local config
    config="$(scontrol show config 2>/dev/null)" || return 1
    [[ -n "$config" ]] || return 1
    ! grep -qE "^ProctrackType +=  *$PROCTRACK\$" <<<"$config" || ! grep -qE "^TaskPlugin +=  *$TASK_PLUGIN\$" <<<"$config"
}

accounting_mismatch() { # 0 when the running slurmctld does not use the accounting this config names
    local running wanted=accounting_storage/slurmdbd
    [[ $ACCOUNTING -eq 1 ]] || wanted=accounting_storage/none
    running="$(scontrol show config 2>/dev/null | sed -n 's/^AccountingStorageType *= *//p')"
    [[ -n "$running" && "$running" != "$wanted" ]]
}

start_slurmctld() {
    adopt "$RUN/slurmctld.pid" slurmctld && return
    slurmctld -f "$SLURM_CONF" 9>&-
}

start_slurmd() {
    local node
    for node in "${NODES[@]}"; do
        adopt "$RUN/slurmd-$node.pid" slurmd "$node" && continue
        mkdir -p "$STATE_DIR/spool/$node"
        slurmd -f "$SLURM_CONF" -N "$node" 9>&-
    done
}

rest_ok() {
    # Any HTTP answer means slurmrestd listens; 401 is expected without a token.
    curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$REST_PORT/slurm/v0.0.38/ping" 2>/dev/null \
        | grep -qE '^[1-5][0-9][0-9]$'
}

start_slurmrestd() {
    adopt "$RUN/slurmrestd.pid" slurmrestd "127.0.0.1:$REST_PORT" && return
    # slurmrestd refuses to run as root or SlurmUser; SLURM_JWT=daemon makes it pass each
    # request's user token on to slurmctld and slurmdbd. dbv0.0.38: accounts and associations.
    local plugins=openapi/v0.0.38,openapi/v0.0.37
    if [[ $ACCOUNTING -eq 1 ]]; then plugins+=,openapi/dbv0.0.38; fi # fatal without slurmdbd
    setsid runuser -u "$REST_USER" -- env SLURM_CONF="$SLURM_CONF" SLURM_JWT=daemon \
        slurmrestd -a rest_auth/jwt -s "$plugins" "127.0.0.1:$REST_PORT" \
        </dev/null >>"$LOG/slurmrestd.log" 2>&1 9>&- &
    echo $! >"$RUN/slurmrestd.pid"
}

wait_until_ready() {
    local started=$SECONDS deadline=$((SECONDS + WAIT_S)) idle
    while ((SECONDS < deadline)); do
        idle="$(sinfo -h -N -p "$PARTITION" -t idle,mixed,allocated -o '%N' 2>/dev/null | sort -u | wc -l)"
        if [[ "$idle" -ge "${#NODES[@]}" ]] && rest_ok; then
            return
        fi
        # Daemonised slurmctld writes its pid file a moment after it forks; judge only after that.
        if ((SECONDS > started + 5)); then
            adopt "$RUN/slurmctld.pid" slurmctld || die "slurmctld exited: $(tail -n 5 "$LOG/slurmctld.log")"
            pid_alive "$RUN/slurmrestd.pid" || die "slurmrestd exited: $(tail -n 5 "$LOG/slurmrestd.log")"
        fi
        sleep 0.5
    done
    sinfo -N -p "$PARTITION" >&2 || true
    die "cluster not ready after ${WAIT_S}s (logs in $LOG)"
}

print_env() {
    local token
    token="$(scontrol token username="$JOB_USER" lifespan="$TOKEN_LIFESPAN_S" | sed -n 's/^SLURM_JWT=//p')"
    [[ -n "$token" ]] || die "scontrol token returned no token"
    cat <<EOF
SLURM_REST_URL=http://127.0.0.1:$REST_PORT
SLURM_JWT=$token
SLURM_USER=$JOB_USER
SLURM_API_VERSION=v0.0.38
SLURM_PARTITION=$PARTITION
SLURM_OUTPUT_DIR=$OUTPUT_DIR
SLURM_CONF=$SLURM_CONF
SLURM_CLUSTER=$CLUSTER_NAME
SLURM_SHARED_ACCOUNT=$SHARED_ACCOUNT
EOF
}

stop_pidfile() { # stop_pidfile NAME PIDFILE
    local pid
    pid_alive "$2" || return 0
    pid="$(cat "$2")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || {
            rm -f "$2"
            return 0
        }
        sleep 0.1
    done
    log "$1 ignored SIGTERM; killing it"
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$2"
}

lock_state() {
    # Two test sessions starting the cluster at once must not race on apt, config and daemons.
    # Daemons are started with fd 9 closed so that they do not keep holding the lock.
    mkdir -p "$LOG"
    exec 9>"$STATE_DIR/.start.lock"
    flock -w 900 9 || die "another dev_slurm.sh holds $STATE_DIR/.start.lock"
}

cmd_start() {
    [[ $EUID -eq 0 ]] || die "run as root or with passwordless sudo (packages, users, device nodes, slurmd)"
    lock_state
    install_packages
    ensure_users
    ensure_fake_gpus
    if ! db "SELECT 1" >/dev/null 2>"$LOG/db.log"; then
        # Slurm itself still runs for everyone; only per-project accounts need the database.
        log "warning: no MariaDB / MySQL as $DB_USER@$DB_HOST:$DB_PORT ($(head -c 300 "$LOG/db.log")): running without accounting"
        ACCOUNTING=0
    fi
    write_config
    start_munge
    if [[ $ACCOUNTING -eq 1 ]]; then
        start_slurmdbd
        ensure_accounting
    fi
    if adopt "$RUN/slurmctld.pid" slurmctld && plugins_mismatch; then
        # Plugin types are read only at startup. Jobs that run now were started under the old plugins; a dev
        # cluster loses them rather than keep two ways of tracking processes.
        log "the cluster runs other process tracking / task plugins than configured; restarting its daemons"
        cancel_all_jobs
        stop_daemons
    elif adopt "$RUN/slurmctld.pid" slurmctld && accounting_mismatch; then
        # The accounting plugin is read only at startup; jobs survive the restart (StateSaveLocation).
        log "slurmctld runs with other accounting than configured; restarting it and slurmrestd"
        stop_pidfile slurmctld "$RUN/slurmctld.pid"
        if adopt "$RUN/slurmrestd.pid" slurmrestd "127.0.0.1:$REST_PORT"; then
            stop_pidfile slurmrestd "$RUN/slurmrestd.pid"
        fi
    elif [[ $CONFIG_CHANGED -eq 1 ]] && adopt "$RUN/slurmctld.pid" slurmctld; then
        log "configuration changed; reconfiguring the running cluster"
        scontrol reconfigure
    fi
    start_slurmctld
    start_slurmd
    start_slurmrestd
    wait_until_ready
    log "cluster ready: ${#NODES[@]} nodes in partition $PARTITION, REST API on 127.0.0.1:$REST_PORT"
    print_env
}

cancel_all_jobs() {
    pid_alive "$RUN/slurmctld.pid" || return 0
    scancel --partition="$PARTITION" 2>/dev/null || true
    for _ in $(seq 30); do
        [[ -z "$(squeue -h -p "$PARTITION" -o '%i' 2>/dev/null)" ]] && return 0
        sleep 0.5
    done
    log "some jobs were still ending when the daemons stopped"
}

cmd_stop() {
    [[ $EUID -eq 0 ]] || die "run as root or with passwordless sudo"
    lock_state
    cancel_all_jobs
    stop_daemons
    stop_pidfile slurmdbd "$RUN/slurmdbd.pid"
    # munged is shared with anything else on this host; stop it only when this script started it.
    if [[ -e "$RUN/munged.ours" ]]; then
        stop_pidfile munged /run/munge/munged.pid
        rm -f "$RUN/munged.ours"
    fi
    log "stopped (state kept in $STATE_DIR)"
}

stop_daemons() { # slurmrestd, the slurmd and slurmctld of this cluster (not slurmdbd)
    local node
    stop_pidfile slurmrestd "$RUN/slurmrestd.pid"
    for node in "${NODES[@]}"; do
        stop_pidfile "slurmd $node" "$RUN/slurmd-$node.pid"
    done
    stop_pidfile slurmctld "$RUN/slurmctld.pid"
    # Daemons of this cluster that lost their pid file (e.g. to a crash of this script).
    local pid
    for _ in 1 2 3 4 5 6; do
        for name in slurmrestd slurmd slurmctld; do
            if [[ $name == slurmrestd ]]; then
                pid="$(find_daemon slurmrestd "127.0.0.1:$REST_PORT")" || continue
            else
                pid="$(find_daemon "$name")" || continue
            fi
            echo "$pid" >"$RUN/stray.pid"
            stop_pidfile "stray $name" "$RUN/stray.pid"
        done
    done
}

cmd_status() {
    local node rc=0
    for name in slurmdbd slurmctld slurmrestd; do
        if pid_alive "$RUN/$name.pid"; then echo "$name: running"; else
            echo "$name: stopped"
            rc=1
        fi
    done
    for node in "${NODES[@]}"; do
        if pid_alive "$RUN/slurmd-$node.pid"; then echo "slurmd $node: running"; else
            echo "slurmd $node: stopped"
            rc=1
        fi
    done
    if munge_ok; then echo "munged: running"; else echo "munged: stopped"; fi
    [[ $rc -eq 0 ]] && sinfo -N -p "$PARTITION" -o '%N %t %G' 2>/dev/null
    return $rc
}

# Everything but status needs root; use passwordless sudo when it is there.
if [[ $EUID -ne 0 && "${1:-}" =~ ^(start|stop|env)$ ]] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n --preserve-env=HCS_SLURM_DIR,HCS_SLURM_REST_PORT,HCS_SLURM_CTLD_PORT,HCS_SLURM_SLURMD_PORT,HCS_SLURM_DBD_PORT,HCS_SLURM_DB_HOST,HCS_SLURM_DB_PORT,HCS_SLURM_DB_USER,HCS_SLURM_DB_PASS,HCS_SLURM_DB_NAME,HCS_SLURM_USER,HCS_SLURM_TOKEN_LIFESPAN,HCS_SLURM_WAIT_S \
        "$0" "$@"
fi

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env)
        [[ $EUID -eq 0 ]] || die "run as root or with passwordless sudo (scontrol token)"
        pid_alive "$RUN/slurmctld.pid" || die "the dev cluster is not running; use: $0 start"
        print_env
        ;;
    *)
        echo "usage: $0 {start|stop|status|env}" >&2
        exit 2
        ;;
esac
