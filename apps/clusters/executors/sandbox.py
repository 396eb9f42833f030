"""The sandbox a local job runs in, so that a job never reaches the portal's secrets.

A job runs under bubblewrap (Debian's ``bubblewrap`` package) in new PID, IPC, UTS, mount and
(by default) network namespaces. It sees the system's programs (``/usr``, ``/etc`` ... read-only),
a fresh ``/proc`` that shows only its own processes, a fresh ``/tmp``, the device nodes of the cards
it was given, and its own working directory; nothing else of the host's file tree: not the
portal's code, ``var/`` (secret key, credentials key, SQLite database, Redis socket) or anyone's home.
With no network of its own it cannot reach the database, Redis or the web server on loopback.

Who the job is depends on who the portal is:

- portal as root: bubblewrap (privileged) builds the sandbox, then ``setpriv`` drops to a dedicated
  unprivileged user (``HCS_LOCAL_JOB_USER``, default ``hcs-job``, created by
  ``scripts/setup_local_jobs.sh``) with no capabilities and no supplementary groups;
- portal as a normal user: bubblewrap builds the sandbox in an unprivileged user namespace; the job
  keeps the portal's uid but sees none of its files or processes.

Inside the sandbox a job cannot make user namespaces of its own (a seccomp filter refuses them), so it never
gains the capabilities a namespace of its own would give it. Its ``/tmp`` and ``/var/tmp`` are size-limited
tmpfs; its CPU, memory and process limits are cgroups (:mod:`.limits`), which the executor puts it in.

The portal-side wrapper and bubblewrap run with a fixed, trusted environment; the job's own
environment is applied as the last step, after privileges are dropped, so variables such as
``LD_PRELOAD`` can only ever affect the job itself. It never appears on a command line (where
anyone on the host could read it with ``ps``): bubblewrap copies it from an unlinked file, through
an inherited descriptor, into the sandbox's private ``/run``, and a shell exports it right before
the command starts.
"""

from __future__ import annotations

import errno
import functools
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .base import ExecutorError

# Trusted environment of the wrapper and bubblewrap (never the job's, never the portal's).
TRUSTED_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Prefix of a console's command: every signal back to its default action. A process inherits the signals its
# parent ignores, and a portal started in the background (`nohup`, `&` in a script) ignores SIGINT and SIGQUIT:
# without this a console's Ctrl-C stopped nothing. (A job's wrapper traps SIGINT itself, which gives its command
# the default action again.)
DEFAULT_SIGNALS = ("env", "--default-signal")
JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Host trees a job sees read-only: programs, libraries and system configuration.
_SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")

NETWORK_NONE = "none"
NETWORK_HOST = "host"
NETWORK_MODES = (NETWORK_NONE, NETWORK_HOST)

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Where the job's environment lies inside the sandbox, and the shell that exports it and runs the command.
_ENV_PATH = "/run/hcs-job.env"
_EXPORT_AND_RUN = f'set -a; . {_ENV_PATH}; set +a; exec "$@"'
# The Web Console's shell: the job's environment, its working directory, a terminal type, and the session
# leader's controlling terminal set to the PTY it was given (so job control and Ctrl-C work).
_INTERACTIVE_SHELL = (
    f'set -a; . {_ENV_PATH}; set +a; export TERM=xterm-256color; cd "${{HCS_JOB_DIR:-$HOME}}" 2>/dev/null; '
    "if command -v bash >/dev/null 2>&1; then exec setsid --ctty bash -i; fi; exec setsid --ctty sh -i"
)
# A visitor's shell: a plain environment of its own (never the job's), started in / (the job's directory is
# the job's alone).
_VISITOR_SHELL = (
    f"export PATH={JOB_PATH} HOME=/ TERM=xterm-256color LANG=C.UTF-8; cd /; "
    "if command -v bash >/dev/null 2>&1; then exec setsid --ctty bash -i; fi; exec setsid --ctty sh -i"
)

# Device nodes a job needs for its cards, per vendor: nodes per card index, and shared control nodes.
_DEVICE_NODES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "nvidia": (
        ("nvidia{index}",),
        ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps"),
    ),
    "huawei": (("davinci{index}",), ("davinci_manager", "devmm_svm", "hisi_hdc")),
    "cambricon": (("cambricon_dev{index}",), ("cambricon_ctl",)),
    # ROCm (AMD, Hygon DCU): one compute interface for all cards, one render node per card.
    "amd": (("dri/renderD{render}",), ("kfd",)),
    "hygon": (("dri/renderD{render}",), ("kfd",)),
    "intel": (("dri/renderD{render}",), ()),
}


# clone(2) and unshare(2) flag that makes a new user namespace.
CLONE_NEWUSER = 0x10000000


def _no_user_namespaces():
    """The seccomp filter (a ``pyseccomp.SyscallFilter``) that refuses new user namespaces to a job.

    unshare(2) and clone(2) with CLONE_NEWUSER fail with EPERM; clone3(2), whose flags a filter cannot read, fails
    with ENOSYS, so the C library falls back to clone(2) (as in Flatpak's and Docker's filters). The host's other
    ABIs (i386 and x32 on x86-64, 32-bit ARM on arm64) are held by the same rules; everything else is allowed.
    """
    try:
        import pyseccomp  # loads libseccomp: only where local jobs run
    except ImportError as exc:
        raise ExecutorError(f"local jobs need pyseccomp (pip install -r requirements.txt): {exc}", retryable=False)
    except OSError as exc:
        raise ExecutorError(
            f"local jobs need libseccomp to refuse nested user namespaces (apt-get install libseccomp2): {exc}",
            retryable=False,
        )
    bpf = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    other_abis = {
        pyseccomp.Arch.X86_64: (pyseccomp.Arch.X86, pyseccomp.Arch.X32),
        pyseccomp.Arch.AARCH64: (pyseccomp.Arch.ARM,),
    }
    for arch in other_abis.get(pyseccomp.system_arch(), ()):
        bpf.add_arch(arch)
    new_user = pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    bpf.add_rule(pyseccomp.ERRNO(errno.EPERM), "unshare", new_user)
    bpf.add_rule(pyseccomp.ERRNO(errno.EPERM), "clone", new_user)
    bpf.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    return bpf


@functools.cache
def no_user_namespaces_filter() -> bytes:
    """The filter of :func:`_no_user_namespaces` as a seccomp program (classic BPF), as bubblewrap's ``--seccomp``
    loads it into a job."""
    with tempfile.TemporaryFile() as program:
        _no_user_namespaces().export_bpf(program)
        program.seek(0)
        return program.read()


def exec_without_user_namespaces(argv: Sequence[str]) -> None:
    """Load the filter of :func:`_no_user_namespaces` into this process (and so into all it starts), then exec
    ``argv``: how the Web Console's shell gets the same filter as the job it joins."""
    _no_user_namespaces().load()
    os.execvp(argv[0], list(argv))


# The Web Console's first step, in the portal's python: the filter, then nsenter into the job's sandbox.
_WITHOUT_USER_NAMESPACES = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from apps.clusters.executors.sandbox import exec_without_user_namespaces; "
    "exec_without_user_namespaces(sys.argv[2:])"
)
_CODE_ROOT = str(Path(__file__).resolve().parents[3])


def _check_secret_file_paths(files: Sequence[str], mounted: Sequence[str]) -> None:
    """Refuse (for good) a secret file that would stand where something else of the job is mounted: its working
    directory (wherever the local executor's directory is on this host), its checkpoints, or a directory above
    them. Submission refuses the paths every job has (/tmp, /run ...); these depend on the host."""
    for path in files:
        prefix = path.rstrip("/") + "/"
        if clash := next((m for m in mounted if m == path or m.startswith(prefix)), None):
            raise ExecutorError(
                f"the secret file {path} cannot be placed: the job's {clash} is there on this cluster; expected a "
                "path such as /run/secrets/<name>",
                retryable=False,
            )


def device_nodes(vendor: str, indexes: Iterable[int]) -> list[str]:
    """Paths under /dev (relative) of the given cards of a vendor and the vendor's control nodes."""
    per_card, shared = _DEVICE_NODES.get(vendor, ((), ()))
    paths = [p.format(index=i, render=128 + i) for i in indexes for p in per_card]
    return paths + list(shared)


def check_env_names(env: Mapping[str, str]) -> None:
    """Refuse variable names a shell cannot export (``A=B``, empty, leading digits)."""
    bad = [name for name in env if not _ENV_NAME_RE.match(name)]
    if bad:
        raise ExecutorError(
            f"invalid environment variable name(s) {', '.join(map(repr, bad))}: expected letters, digits and "
            "underscores, not starting with a digit",
            retryable=False,
        )


@dataclass(frozen=True)
class Sandbox:
    """How local jobs are isolated from the portal (see the module docstring)."""

    job_user: str = "hcs-job"
    # Who a visitor's Web Console runs as: an unprivileged account other than the job's, which therefore cannot
    # read the job's environment, its secret files or its working directory.
    visitor_user: str = "nobody"
    network: str = NETWORK_NONE
    # Paths of the portal (code, var/) hidden from jobs even when they lie inside a tree jobs see.
    hidden: tuple[str, ...] = ()
    dev_dir: str = "/dev"  # where the host's device nodes are (tests point it at fake nodes)
    bwrap: str = field(default_factory=lambda: shutil.which("bwrap") or "")
    tmp_gib: float = 1.0  # the size of the job's /tmp and of its /var/tmp (each a tmpfs)

    def __post_init__(self):
        if not self.tmp_gib > 0:
            raise ValueError(f"expected a /tmp size above 0 GiB, got {self.tmp_gib}")

    @property
    def privileged(self) -> bool:
        """True when the portal runs as root, so jobs run as the dedicated job user."""
        return os.geteuid() == 0

    def job_account(self) -> pwd.struct_passwd | None:
        """The job user's passwd entry when the portal is root; None when jobs keep the portal's uid."""
        if not self.privileged:
            return None
        try:
            return pwd.getpwnam(self.job_user)
        except KeyError:
            raise ExecutorError(
                f"local jobs run as user {self.job_user!r}, which does not exist on this host: "
                "run scripts/setup_local_jobs.sh (or set HCS_LOCAL_JOB_USER to an unprivileged user)",
                retryable=False,
            )

    def check(self) -> pwd.struct_passwd | None:
        """Raise a non-retryable ExecutorError saying what to install when jobs cannot be isolated here."""
        if self.network not in NETWORK_MODES:
            raise ExecutorError(
                f"unknown local job network {self.network!r}: expected one of {', '.join(NETWORK_MODES)}",
                retryable=False,
            )
        if not self.bwrap:
            raise ExecutorError(
                "local jobs run under bubblewrap, which is not installed: apt-get install bubblewrap "
                "(or run scripts/setup_local_jobs.sh)",
                retryable=False,
            )
        account = self.job_account()
        if account is not None and account.pw_uid == 0:
            raise ExecutorError(
                f"the local job user {self.job_user!r} is root; expected an unprivileged user", retryable=False
            )
        return account

    def prepare(self, work_dir: Path) -> None:
        """Create the job's working directory, owned by the identity the job runs as, private to it."""
        work_dir.mkdir(mode=0o700)
        account = self.job_account()
        if account is not None:
            os.chown(work_dir, account.pw_uid, account.pw_gid)

    def prepare_kept(self, directory: Path) -> None:
        """Create (or keep) a directory that outlives one job, such as a task's checkpoints: owned by the identity
        jobs run as, private to it; its parents stay the portal's and private to it."""
        directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
        account = self.job_account()
        if account is not None:
            os.chown(directory, account.pw_uid, account.pw_gid)

    def describe(self) -> str:
        who = f"user {self.job_user}" if self.privileged else "the portal's uid in a user namespace"
        net = "no network" if self.network == NETWORK_NONE else "the host's network"
        return f"bubblewrap sandbox as {who}, {net}, no user namespaces, /tmp of {self.tmp_gib:g} GiB"

    def job_environment(self, work_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
        """The base environment of a job: a plain PATH, HOME in its working directory, who it runs as."""
        account = self.job_account()
        user = account.pw_name if account is not None else pwd.getpwuid(os.geteuid()).pw_name
        base = {
            "PATH": JOB_PATH,
            "HOME": str(work_dir),
            "USER": user,
            "LOGNAME": user,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "SHELL": "/bin/sh",
        }
        base.update(env)
        return base

    @staticmethod
    def env_file(env: Mapping[str, str]) -> IO[bytes]:
        """An unlinked file holding ``env`` as shell assignments, ready to be read from its start.

        Pass its descriptor to :meth:`argv` and to the process (``pass_fds``); close it once started.
        """
        check_env_names(env)
        file = tempfile.TemporaryFile()  # noqa: SIM115 - the caller closes it once the sandbox started
        file.write("".join(f"{name}={shlex.quote(value)}\n" for name, value in env.items()).encode())
        file.flush()
        file.seek(0)
        return file

    @staticmethod
    def seccomp_file() -> IO[bytes]:
        """An unlinked file holding :func:`no_user_namespaces_filter`, read from its start: its descriptor goes to
        :meth:`argv` and to the process (``pass_fds``), one per sandbox (bubblewrap reads it to its end)."""
        program = no_user_namespaces_filter()
        file = tempfile.TemporaryFile()  # noqa: SIM115 - the caller closes it once the sandbox started
        file.write(program)
        file.flush()
        file.seek(0)
        return file

    @staticmethod
    def secret_file(value: str) -> int:
        """A memory-only file (never on disk) holding ``value``, read from its start: the descriptor to pass to
        :meth:`argv` as a secret file and to the process (``pass_fds``); close it once started."""
        fd = os.memfd_create("hcs-secret")
        try:
            os.write(fd, value.encode())
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError:
            os.close(fd)
            raise
        return fd

    def argv(
        self,
        work_dir: Path,
        devices: Sequence[str],
        env_fd: int,
        seccomp_fd: int,
        command: Sequence[str],
        binds: Sequence[tuple[Path, str]] = (),
        ro_files: Sequence[tuple[Path, str]] = (),
        secret_files: Sequence[tuple[int, str]] = (),
    ) -> list[str]:
        """The command line that runs ``command`` in the sandbox with exactly the environment of ``env_fd``
        (a descriptor from :meth:`env_file`, inherited by the process), under the seccomp filter of ``seccomp_fd``
        (from :meth:`seccomp_file`, inherited likewise).

        ``devices`` are paths relative to ``dev_dir`` (``nvidia0``, ``dri/renderD128``); those that exist
        are the only device nodes beyond /dev's basics the job sees. ``binds`` are (host directory, path in
        the sandbox) pairs the job may also write, such as its task's checkpoint directory; ``ro_files`` are
        (host file, path under /run) pairs it may only read, such as the VRAM interceptor. ``secret_files`` are
        (descriptor from :meth:`secret_file`, path in the sandbox) pairs: bubblewrap copies each into the
        sandbox's own memory (it never lies on the host's disk and ends with the sandbox), mode 0400, owned by
        the job's identity (chowned as root, just before privileges are dropped, when the portal is root).
        """
        account = self.check()
        _check_secret_file_paths(
            [inside for _fd, inside in secret_files],
            [str(work_dir), *(inside for _host, inside in (*binds, *ro_files))],
        )
        argv = [
            "env",
            "--ignore-signal=TERM,INT,HUP",  # the command gets the stop signal; the sandbox outlives it
            self.bwrap,
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]
        if self.network == NETWORK_NONE:
            argv.append("--unshare-net")
        for tree in _SYSTEM_TREES:
            argv += ["--ro-bind-try", tree, tree]
        for path in self.hidden:
            if any(path == t or path.startswith(t + "/") for t in _SYSTEM_TREES):
                argv += ["--tmpfs", path]
        tmp_size = str(int(self.tmp_gib * 2**30))
        argv += ["--proc", "/proc", "--dev", "/dev", "--dir", "/run"]
        for scratch in ("/tmp", "/var/tmp"):  # what a job writes there is memory: bounded, and its memory limit's
            argv += ["--perms", "1777", "--size", tmp_size, "--tmpfs", scratch]
        argv += ["--perms", "0400", "--file", str(env_fd), _ENV_PATH]
        for host, inside in ro_files:
            for parent in reversed(Path(inside).parents[:-1]):  # searchable by the job user, or it cannot load it
                argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--ro-bind", str(host), inside]
        for device in devices:
            argv += ["--dev-bind-try", str(Path(self.dev_dir) / device), f"/dev/{device}"]
        # The working directory keeps its host path; its parents exist in the sandbox only as empty, searchable dirs.
        for parent in reversed(work_dir.parents[:-1]):
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--bind", str(work_dir), str(work_dir)]
        for host, inside in binds:
            for parent in reversed(Path(inside).parents[:-1]):  # searchable, or the job cannot reach it
                argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--bind", str(host), inside]
        for fd, inside in secret_files:
            for parent in reversed(Path(inside).parents[:-1]):  # searchable by the job user, or it cannot read it
                argv += ["--perms", "0755", "--dir", str(parent)]
            argv += ["--perms", "0400", "--bind-data", str(fd), inside]
        argv += ["--seccomp", str(seccomp_fd), "--chdir", str(work_dir), "--"]
        if account is not None:
            # The environment and the secret files are the job's alone (0400): a visitor's shell cannot read them.
            paths = " ".join(shlex.quote(inside) for inside in (_ENV_PATH, *(path for _fd, path in secret_files)))
            chown = f'chown -h {account.pw_uid}:{account.pw_gid} -- {paths} && exec "$@"'
            argv += ["/bin/sh", "-c", chown, "hcs-job-files"]
        if account is not None:
            argv += [
                "setpriv",
                f"--reuid={account.pw_uid}",
                f"--regid={account.pw_gid}",
                "--clear-groups",
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--",
            ]
        argv += ["env", "-i", "--default-signal=TERM,INT,HUP", "/bin/sh", "-c", _EXPORT_AND_RUN, "hcs-job", *command]
        return argv

    def enter_argv(self, pid: int) -> list[str]:
        """The command line of an interactive shell inside the running sandbox of process ``pid``.

        The shell joins that sandbox's namespaces (so it sees the job's files, processes and network, and
        nothing else), drops to the job's identity like the job did, and gets the job's environment from
        the sandbox's own copy of it, never the portal's. Like the job, it cannot make user namespaces.
        """
        account = self._joinable()
        argv = [sys.executable, "-c", _WITHOUT_USER_NAMESPACES, _CODE_ROOT]
        argv += ["nsenter", f"--target={pid}", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]
        argv += [
            "setpriv",
            f"--reuid={account.pw_uid}",
            f"--regid={account.pw_gid}",
            "--clear-groups",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--no-new-privs",
            "--",
        ]
        return [*argv, "env", "-i", "/bin/sh", "-c", _INTERACTIVE_SHELL]

    def visit_argv(self, pid: int) -> list[str]:
        """The command line of a visitor's interactive shell inside the running sandbox of process ``pid``.

        It joins the sandbox's namespaces like :meth:`enter_argv` but becomes ``visitor_user`` (no capabilities,
        ``no_new_privs``) with a plain environment of its own: it sees the job's processes and whatever the job
        left readable to all, never the job's environment (``/run/hcs-job.env`` and ``/proc/<pid>/environ`` are
        the job user's alone), its secret files (0400, the job user's) or its working directory (0700). Like the
        job, it cannot make user namespaces.
        """
        account = self._joinable()
        try:
            visitor = pwd.getpwnam(self.visitor_user)
        except KeyError:
            raise ExecutorError(
                f"the visitor account {self.visitor_user!r} does not exist on this host", retryable=False
            )
        if visitor.pw_uid in (0, account.pw_uid):
            raise ExecutorError(
                f"the visitor account {self.visitor_user!r} must be unprivileged and not the job's", retryable=False
            )
        argv = [sys.executable, "-c", _WITHOUT_USER_NAMESPACES, _CODE_ROOT]  # like the job's own shell
        argv += ["nsenter", f"--target={pid}", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]
        argv += [
            "setpriv",
            f"--reuid={visitor.pw_uid}",
            f"--regid={visitor.pw_gid}",
            "--clear-groups",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--no-new-privs",
            "--",
        ]
        return [*argv, "env", "-i", "/bin/sh", "-c", _VISITOR_SHELL]

    def _joinable(self) -> pwd.struct_passwd:
        """The job user, when the portal may join its jobs' sandboxes (as root); ExecutorError otherwise.

        An unprivileged portal's sandboxes live in user namespaces bubblewrap nests, which the portal's uid
        cannot enter (nsenter: "reassociate to namespace failed: Operation not permitted").
        """
        account = self.check()
        if account is None:
            raise ExecutorError(
                "reaching into a running local job (Web Console, Connect) needs the portal to run as root: "
                "an unprivileged portal cannot join its jobs' sandboxes",
                retryable=False,
            )
        return account

    def forward_argv(self, pid: int, socket_path: str, port: int) -> list[str]:
        """A forwarder from a unix socket of the portal host to ``port`` on the loopback of process ``pid``'s sandbox.

        It joins only the sandbox's network and PID namespaces (so it ends with the job), keeps the portal's
        file tree for the socket, and connects to the job's port for each client.
        """
        self._joinable()
        argv = ["nsenter", f"--target={pid}", "--net", "--pid"]
        return [*argv, "--", "socat", f"UNIX-LISTEN:{socket_path},fork,mode=600", f"TCP:127.0.0.1:{port}"]

    def probe(self, scratch: Path) -> None:
        """Run ``true`` in a sandbox like a job's: raises ExecutorError with bubblewrap's message on failure."""
        work_dir = scratch / ".sandbox-probe"
        shutil.rmtree(work_dir, ignore_errors=True)
        try:
            self.prepare(work_dir)
            with self.env_file({"PATH": JOB_PATH}) as env, self.seccomp_file() as seccomp:
                argv = self.argv(work_dir, (), env.fileno(), seccomp.fileno(), ("true",))
                result = subprocess.run(
                    argv,
                    env=TRUSTED_ENV,
                    capture_output=True,
                    text=True,
                    timeout=20,
                    check=False,
                    pass_fds=(env.fileno(), seccomp.fileno()),
                )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExecutorError(f"the job sandbox does not start: {exc}", retryable=False)
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
        if result.returncode != 0:
            raise ExecutorError(
                f"the job sandbox does not start (bubblewrap exited {result.returncode}): "
                f"{result.stderr.strip()[-300:]}",
                retryable=False,
            )
