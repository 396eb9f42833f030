"""``hcs``: submit, list, follow, stop and delete HCS Portal tasks from a shell, open a shell in them and reach
their ports, through the REST API (and the Web Console's socket).

Exit status: 0 done; 1 the API refused (its field errors are printed); 2 a usage, login or connection
problem.
"""

from __future__ import annotations

import argparse
import sys

from hcs_cli import commands, config
from hcs_cli.client import ApiError, Client, ConnectionFailed

KINDS = ("dev_env", "training", "inference", "fine_tuning")
STATUSES = (
    "pending",
    "queued",
    "scheduled",
    "starting",
    "running",
    "scaled_to_zero",
    "preempted",
    "suspended",
    "completed",
    "failed",
    "stopped",
)


def _submit_parser(sub) -> None:
    p = sub.add_parser(
        "submit",
        help="submit a task",
        description="Submit a task. Everything after `--` is the command, e.g. `hcs submit -p alpha -q high "
        "--gpu '1(A100)' -- python train.py --lr 0.1`. With -f, the task file's fields are the base and the options "
        "given override them. With --template, the template's task file is the base instead.",
    )
    _task_options(p)
    p.add_argument(
        "-T",
        "--template",
        metavar="NAME_OR_ID",
        help="submit from a template of your project (`hcs template ls`); -p picks the project of a name",
    )
    p.add_argument("--json", action="store_true", help="print the created task as JSON")
    p.add_argument("argv", nargs="*", metavar="COMMAND", help="the command, after --")
    p.set_defaults(handler=commands.submit)


def _task_options(p) -> None:
    """The options of a task submission (``hcs submit``, ``hcs sweep submit``)."""
    p.add_argument(
        "-f",
        "--file",
        metavar="PATH",
        help="a task file: the API's submit fields as one YAML or JSON document (- for standard input)",
    )
    p.add_argument("-p", "--project", help="project name or id (required unless the task file names it)")
    p.add_argument("--vdc", help="VDC name or id (default: the default VDC)")
    p.add_argument("-q", "--queue", help="queue name within the VDC, or id")
    p.add_argument("-k", "--kind", choices=KINDS, help="default: the task file's, else training")
    p.add_argument("-n", "--name", help="required unless the task file names it")
    p.add_argument(
        "-g",
        "--gpu",
        dest="gpu_spec",
        metavar="SPEC",
        help="GPU spec: 2(V100), 1(A100|H100), 0.5(vgpu), 1(16G,50%%), vram=16Gi,tflops-fp16=100, 0",
    )
    p.add_argument("--cpu", help="cores per instance")
    p.add_argument("--memory", dest="memory_gib", metavar="GIB", help="memory per instance, GiB")
    p.add_argument("-i", "--instances", type=int, help="instances started together (a gang)")
    p.add_argument("--elastic-min", type=int)
    p.add_argument("--elastic-max", type=int)
    p.add_argument(
        "-d",
        "--expected-duration",
        metavar="DURATION",
        help="an estimate (10m, 2h, 1h30m, 02:00:00): queue estimates and the medium window",
    )
    p.add_argument("-t", "--wall-time", metavar="DURATION", help="hard limit: the job is stopped after it")
    p.add_argument("--image")
    p.add_argument("-c", "--command", help="the command as one string (or give it after --)")
    p.add_argument("-e", "--env", action="append", metavar="KEY=VALUE", help="environment variable (repeat)")
    p.add_argument(
        "--secret-env",
        action="append",
        metavar="KEY=VALUE",
        help="secret variable: given to the job, never shown back (repeat)",
    )
    p.add_argument(
        "-s",
        "--secret",
        action="append",
        metavar="VAR=SECRET",
        help="give the project's secret SECRET to the job as variable VAR (repeat; see `hcs secrets`)",
    )
    p.add_argument(
        "--secret-file",
        action="append",
        metavar="/PATH=SECRET",
        help="give the project's secret SECRET to the job as an owner-read-only file at /PATH (repeat)",
    )
    p.add_argument("-l", "--label", action="append", metavar="KEY=VALUE", help="required cluster label (repeat)")
    p.add_argument("--preemptible", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--framework", help="training: pytorch, deepspeed, tensorflow, mindspore, jax")
    p.add_argument("--model-path")
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--checkpoint-path")
    p.add_argument("--max-retries", type=int)
    p.add_argument("--ide", dest="ide_type", help="dev environment: jupyter or vscode")
    p.add_argument("--idle-stop-minutes", type=int, help="dev environment: stop when idle this long (0: never)")
    p.add_argument("--idle-stop-percent", type=int, help="dev environment: idle under this GPU utilisation (%%)")
    p.add_argument("--port", type=int, help="inference: the port the server listens on")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature")
    p.add_argument("--autoscale-min", type=int)
    p.add_argument("--autoscale-max", type=int)
    p.add_argument("--autoscale-cpu-percent", type=int)
    p.add_argument("--autoscale-gpu-percent", type=int)
    p.add_argument("--autoscale-rps", type=int, help="inference: target requests/s per replica")
    p.add_argument("--autoscale-concurrency", type=int, help="inference: target requests in flight per replica")
    p.add_argument("--autoscale-latency-ms", type=int, help="inference: target mean time of a request (ms)")
    p.add_argument(
        "--scale-to-zero-after",
        dest="scale_to_zero_after_s",
        type=int,
        metavar="SECONDS",
        help="inference (with --port): release the cards after this many seconds without a request through Connect; "
        "the next request wakes the service and waits for it",
    )
    p.add_argument(
        "--schedule-min",
        action="append",
        metavar="'DAYS HH:MM-HH:MM N [TZ]'",
        help="inference: at least N replicas then, e.g. 'Mon-Fri 08:00-20:00 4 Europe/Berlin' (time zone UTC when "
        "left out; within --autoscale-min..--autoscale-max; repeat; replaces a task file's schedule)",
    )


def _sweep_parser(sub) -> None:
    description = (
        "Parameter sweeps: one submission, a task per combination of parameter values (at most 100), each job "
        "getting its values as HCS_PARAM_<NAME> variables; all are created or none."
    )
    p = sub.add_parser("sweep", help="parameter sweeps: submit, list, show, stop", description=description)
    actions = p.add_subparsers(dest="sweep_action", required=True, metavar="ACTION")
    a = actions.add_parser(
        "submit",
        help="submit a sweep",
        description="Submit a sweep: the task (a task file and/or the options of `hcs submit`) once per combination, "
        "e.g. `hcs sweep submit -f task.yaml --param lr=0.1,0.01 --param batch_size=32,64` (4 tasks). "
        "-n names the sweep; its tasks are <name>-1, <name>-2, ...",
    )
    _task_options(a)
    a.add_argument(
        "-P",
        "--param",
        action="append",
        metavar="NAME=V1,V2,...",
        help="a grid parameter and its values (repeat: the cartesian product of all)",
    )
    a.add_argument(
        "--combo",
        action="append",
        metavar="NAME=V,NAME=V",
        help="one explicit combination (repeat; instead of --param)",
    )
    a.add_argument(
        "--goal",
        choices=("max", "min"),
        help="the best element: highest (max, default) or lowest (min) metric its job prints as HCS_METRIC name=value",
    )
    a.add_argument("--dry-run", action="store_true", help="check every element and print the price; create nothing")
    a.add_argument("--json", action="store_true", help="print the API's answer as JSON")
    a.add_argument("argv", nargs="*", metavar="COMMAND", help="the command, after --")
    a.set_defaults(handler=commands.sweep_submit)
    a = actions.add_parser("ls", help="your projects' sweeps with their task counts")
    a.add_argument("-p", "--project", help="project name or id")
    a.add_argument("--json", action="store_true")
    a.set_defaults(handler=commands.sweep_ls)
    a = actions.add_parser("show", help="a sweep's elements: values, task, status")
    a.add_argument("id", type=int)
    a.add_argument("--json", action="store_true")
    a.set_defaults(handler=commands.sweep_show)
    a = actions.add_parser("stop", help="stop every unfinished task of a sweep")
    a.add_argument("id", type=int)
    a.add_argument("-r", "--reason", default="", help="kept in each task's timeline")
    a.add_argument("--json", action="store_true")
    a.set_defaults(handler=commands.sweep_stop)


def _secrets_parser(sub) -> None:
    description = (
        "Secrets a project keeps for its tasks (registry passwords, API keys, dataset tokens). Values "
        "are read from standard input and never shown back; owners manage them."
    )
    p = sub.add_parser(
        "secrets", help="a project's secrets: list names, set (add or rotate) and remove", description=description
    )
    actions = p.add_subparsers(dest="secrets_action", required=True, metavar="ACTION")
    a = actions.add_parser("ls", help="the project's secrets, by name")
    a.add_argument("-p", "--project", required=True, help="project name or id")
    a.add_argument("--json", action="store_true")
    a.set_defaults(handler=commands.secrets_ls)
    a = actions.add_parser("set", help="add a secret, or give an existing one a new value (read from stdin)")
    a.add_argument("-p", "--project", required=True, help="project name or id")
    a.add_argument("name", help="e.g. HF_TOKEN: letters, digits and underscores")
    a.add_argument("-d", "--description", help="what it is for (shown to the project's members)")
    a.set_defaults(handler=commands.secrets_set)
    a = actions.add_parser("rm", help="remove a secret (refused while waiting or running tasks refer to it)")
    a.add_argument("-p", "--project", required=True, help="project name or id")
    a.add_argument("name")
    a.set_defaults(handler=commands.secrets_rm)


def _template_parser(sub) -> None:
    description = (
        "Templates: task files a project keeps under a name. Owners save, change and delete them; everyone in the "
        "project lists them, and owners and members submit from one with `hcs submit --template NAME`."
    )
    p = sub.add_parser("template", help="a project's task templates: list, show, save, remove", description=description)
    actions = p.add_subparsers(dest="template_action", required=True, metavar="ACTION")
    a = actions.add_parser("ls", help="your projects' templates")
    a.add_argument("-p", "--project", help="project name or id")
    a.add_argument("--json", action="store_true")
    a.set_defaults(handler=commands.template_ls)
    a = actions.add_parser("show", help="a template's task file (YAML)")
    a.add_argument("template", metavar="NAME_OR_ID")
    a.add_argument("-p", "--project", help="the project of a template given by name")
    a.add_argument("--json", action="store_true")
    a.set_defaults(handler=commands.template_show)
    a = actions.add_parser(
        "save", help="keep a task's task file as a template of its project (owners; secret values never)"
    )
    a.add_argument("task_id", type=int, metavar="TASK_ID")
    a.add_argument("name", metavar="NAME")
    a.add_argument("-d", "--description", help="what it is for (shown to the project's members)")
    a.add_argument("--json", action="store_true")
    a.set_defaults(handler=commands.template_save)
    a = actions.add_parser("rm", help="delete a template (owners)")
    a.add_argument("template", metavar="NAME_OR_ID")
    a.add_argument("-p", "--project", help="the project of a template given by name")
    a.set_defaults(handler=commands.template_rm)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="hcs", description=__doc__.split("\n\n")[0].removeprefix("``hcs``: "))
    top.add_argument("--url", help="the portal (default: HCS_URL, else the one of `hcs login`)")
    sub = top.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "login",
        help="log in and keep an API token",
        description="Trade a username and "
        "password for an API token, kept in $XDG_CONFIG_HOME/hcs/config.json (mode 0600).",
    )
    p.add_argument("--url", default=argparse.SUPPRESS, help="the portal, e.g. https://portal.example")
    p.add_argument("-u", "--username")
    p.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    p.set_defaults(handler=commands.login, anonymous=True)

    p = sub.add_parser("logout", help="forget the kept token")
    p.set_defaults(handler=commands.logout, anonymous=True)

    _submit_parser(sub)

    p = sub.add_parser("ls", help="list tasks")
    p.add_argument("-s", "--status", help=f"one or more, comma-separated: {','.join(STATUSES)}")
    p.add_argument("-p", "--project", help="project name or id")
    p.add_argument("-k", "--kind", choices=KINDS)
    p.add_argument("-q", "--queue", help="queue name")
    p.add_argument("--limit", type=int, default=200, help="at most this many tasks (default 200)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=commands.ls)

    p = sub.add_parser("status", help="a task's details, pending reason, estimated start and timeline")
    p.add_argument("id", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=commands.status)

    p = sub.add_parser("task-file", help="a task's task file (YAML), to submit again with `hcs submit -f`")
    p.add_argument("id", type=int)
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(handler=commands.task_file)

    p = sub.add_parser("logs", help="a run's output; -f follows it until the run ends")
    p.add_argument("id", type=int)
    p.add_argument("-a", "--attempt", type=int, help="which run (default: the latest)")
    p.add_argument("-n", "--tail", type=int, default=200, help="lines from the end to start with (default 200)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the run ends")
    p.set_defaults(handler=commands.logs)

    p = sub.add_parser("stop", help="stop a task")
    p.add_argument("id", type=int)
    p.add_argument("-r", "--reason", default="", help="kept in the task's timeline")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=commands.stop)

    p = sub.add_parser("delete", help="delete an ended task that never ran (a task that ran is kept for billing)")
    p.add_argument("id", type=int)
    p.set_defaults(handler=commands.delete)

    p = sub.add_parser(
        "exec",
        help="a shell in a running task (the Web Console), or one command in it",
        description="Open the Web Console of a running task from this terminal: without a command, an interactive "
        "shell (exit or Ctrl-D ends it); with one after `--`, run it in the task's shell, print its output and exit "
        "with its status, e.g. `hcs exec 42 -- nvidia-smi`. The command is run as an argument list (quote shell "
        "syntax: `hcs exec 42 -- sh -c 'ls | wc -l'`) with no standard input. Owners and members of the project "
        "(and users allowed any project's console) may open it.",
    )
    p.add_argument("id", type=int)
    p.add_argument("-i", "--instance", type=int, default=0, help="which instance of a gang (default 0)")
    p.add_argument("argv", nargs="*", metavar="COMMAND", help="the command, after --")
    p.set_defaults(handler=commands.exec_)

    p = sub.add_parser(
        "port-forward",
        help="a task's port (Connect) on a local address",
        description="Serve PORT of a running task (one of its Connect ports) on http://127.0.0.1:LOCAL until "
        "interrupted, e.g. `hcs port-forward 42 8888` then `curl localhost:8888/`. Requests and WebSocket "
        "upgrades go to the port's Connect origin as your user: owners and members of the project only.",
    )
    p.add_argument("id", type=int)
    p.add_argument("port", type=int, help="the task's port")
    p.add_argument("-l", "--local-port", type=int, help="the local port (default: the task's port; 0 picks a free one)")
    p.set_defaults(handler=commands.port_forward)

    _sweep_parser(sub)
    _template_parser(sub)
    _secrets_parser(sub)

    p = sub.add_parser("queue", help="queues with their counts, and your waiting tasks with their positions")
    p.add_argument("--vdc", help="only this VDC (name)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=commands.queue)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if getattr(args, "anonymous", False):
            return args.handler(args)
        settings = config.load(args.url)
        return args.handler(args, Client(settings.url, settings.token))
    except ApiError as exc:
        for line in exc.lines():
            print(f"hcs: {line}", file=sys.stderr)
        return 1
    except (config.ConfigError, ConnectionFailed, argparse.ArgumentTypeError) as exc:
        print(f"hcs: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
