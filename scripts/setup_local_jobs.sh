#!/usr/bin/env bash
# Prepares this host to run local-cluster jobs isolated from the portal (docs/local-jobs.md):
#   - bubblewrap, the sandbox every local job runs in (Debian package "bubblewrap");
#   - socat, which Connect uses to reach a port of a job that has no network (docs/console.md); optional;
#   - when run as root: the unprivileged user local jobs run as ($HCS_LOCAL_JOB_USER, default hcs-job).
# Idempotent; `make run` and the test suite call it. Without root it only checks and says what is missing.
set -euo pipefail

# apt-get that waits for another install (the test run may start two at once) instead of failing on its lock
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }


JOB_USER="${HCS_LOCAL_JOB_USER:-hcs-job}"

log() { echo "setup_local_jobs: $*" >&2; }

if ! command -v bwrap >/dev/null; then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
        log "installing bubblewrap from Debian"
        export DEBIAN_FRONTEND=noninteractive
        apt_get install -y -q --no-install-recommends bubblewrap >/tmp/hcs-apt-bubblewrap.log 2>&1 \
            || { apt_get update -q >>/tmp/hcs-apt-bubblewrap.log 2>&1 \
                && apt_get install -y -q --no-install-recommends bubblewrap >>/tmp/hcs-apt-bubblewrap.log 2>&1; } \
            || { log "error: apt-get install bubblewrap failed (see /tmp/hcs-apt-bubblewrap.log)"; exit 1; }
    else
        log "error: bubblewrap is not installed; as root: apt-get install bubblewrap"
        exit 1
    fi
fi

if ! command -v socat >/dev/null; then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
        log "installing socat from Debian (Connect to local jobs' ports)"
        DEBIAN_FRONTEND=noninteractive apt_get install -y -q --no-install-recommends socat >/tmp/hcs-apt-socat.log 2>&1 \
            || log "warning: apt-get install socat failed (see /tmp/hcs-apt-socat.log): Connect to local jobs will not work"
    else
        log "warning: socat is not installed: Connect to local jobs' ports will not work (apt-get install socat)"
    fi
fi

if [[ $EUID -eq 0 ]] && ! id "$JOB_USER" >/dev/null 2>&1; then
    log "creating the unprivileged user $JOB_USER that local jobs run as"
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$JOB_USER"
fi
exit 0
