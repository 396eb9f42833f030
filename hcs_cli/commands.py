"""What each ``hcs`` command does; the argument parser lives in ``__main__``.

Every command takes the parsed arguments and a :class:`~hcs_cli.client.Client` and returns the process's
exit status; API refusals propagate as :class:`~hcs_cli.client.ApiError` and are printed in one place.
"""

from __future__ import annotations

import argparse
import getpass
import shlex
import sys
import time

from hcs_cli import config
from hcs_cli.client import ApiError, Client, ConnectionFailed
from hcs_cli.output import print_json, table, when

# Submission options that go to the API as they are, by their field name.
PLAIN_FIELDS = (
    "name", "kind", "vdc", "queue", "cpu", "memory_gib", "gpu_spec", "instances", "elastic_min", "elastic_max",
    "expected_duration", "wall_time", "image", "framework", "model_path", "epochs", "batch_size",
    "checkpoint_path", "max_retries", "ide_type", "port", "max_tokens", "temperature", "autoscale_min",
    "autoscale_max", "autoscale_cpu_percent", "autoscale_gpu_percent",
)  # fmt: skip
# How long a follower waits between two reads when nothing new came.
FOLLOW_INTERVAL_S = 1.0
# A follower rides out a server restart or a network blip this many times in a row before giving up.
FOLLOW_RETRIES = 10


def key_values(pairs: list[str] | None, option: str) -> dict[str, str]:
    """``["K=V", ...]`` as a dict; a pair without ``=`` is a usage error naming the option."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{option}: expected KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def login(args: argparse.Namespace) -> int:
    """Trade a username and password for the user's API token and keep it in the login file."""
    url = config.normalise_url(args.url or _stored_url() or input("Portal URL: "))
    username = args.username or input("Username: ")
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"Password for {username}: ")
    body = Client(url).post("auth/token/", data={"username": username, "password": password})
    path = config.save(config.Config(url, body["token"], username))
    print(f"Logged in to {url} as {username}; token kept in {path}")
    return 0


def _stored_url() -> str:
    try:
        return config.load().url
    except config.ConfigError:
        return ""


def logout(args: argparse.Namespace) -> int:
    """Forget the login file. The token itself stays valid: an admin revokes it in the admin."""
    if config.forget():
        print(f"Logged out: removed {config.config_path()}")
    else:
        print("Not logged in: nothing to remove")
    return 0


def submit(args: argparse.Namespace, api: Client) -> int:
    """Submit a task from the options; the API checks it as it checks the pages' forms."""
    body = {field: getattr(args, field) for field in PLAIN_FIELDS if getattr(args, field) is not None}
    body["project"] = args.project
    for field in ("project", "vdc", "queue"):  # an id or a name: the API tells them apart by JSON type
        if isinstance(body.get(field), str) and body[field].isdigit():
            body[field] = int(body[field])
    if args.command is not None and args.argv:
        raise argparse.ArgumentTypeError("give the command with -c/--command or after --, not both")
    command = args.command if args.command is not None else shlex.join(args.argv) if args.argv else None
    if command is not None:
        body["command"] = command
    if args.env:
        body["env"] = key_values(args.env, "-e/--env")
    if args.secret_env:
        body["secret_env"] = key_values(args.secret_env, "--secret-env")
    refs = [{"secret": name, "env": var} for var, name in key_values(args.secret, "-s/--secret").items()]
    refs += [{"secret": name, "file": path} for path, name in key_values(args.secret_file, "--secret-file").items()]
    if refs:
        body["secret_refs"] = refs
    if args.label:
        body["required_labels"] = key_values(args.label, "--label")
    if args.preemptible is not None:
        body["preemptible"] = args.preemptible
    task = api.post("tasks/", json=body)
    if args.json:
        print_json(task)
    else:
        print(f"Submitted task {task['id']} ({task['name']}): {_summary(task)}")
    return 0


def _summary(task: dict) -> str:
    """The task's state in a line, as the pages word it."""
    status = task["status"]
    if status == "queued":
        position = task.get("queue_position")
        start = when(task.get("estimated_start")) or "unknown"
        return f"queued in {task['queue_name']}, position {position or '?'}, estimated start {start}"
    if task.get("cluster_name"):
        return f"{status} on {task['cluster_name']}"
    return status


def ls(args: argparse.Namespace, api: Client) -> int:
    """The user's projects' tasks, newest first, filtered as the API filters them."""
    params = {"ordering": "-submitted_at"}
    if args.status:
        params["status__in"] = args.status
    if args.kind:
        params["kind"] = args.kind
    if args.project:
        params["project" if args.project.isdigit() else "project_name"] = args.project
    if args.queue:
        params["queue_name"] = args.queue
    tasks = api.pages("tasks/", params, limit=args.limit)
    if args.json:
        print_json(tasks)
        return 0
    rows = [
        [t["id"], t["name"], t["kind"], t["project_name"], t["queue_name"], t["status"], t.get("queue_position"),
         t["gpu_spec"], t.get("cluster_name"), when(t["submitted_at"])]
        for t in tasks
    ]  # fmt: skip
    headers = ["ID", "NAME", "KIND", "PROJECT", "QUEUE", "STATUS", "POS", "GPU", "CLUSTER", "SUBMITTED"]
    print(table(headers, rows) if rows else "No tasks.")
    return 0


def status(args: argparse.Namespace, api: Client) -> int:
    """One task: what it asked for, where it is, why it waits, and its timeline."""
    task = api.get(f"tasks/{args.id}/")
    if args.json:
        print_json(task)
        return 0
    fields = [
        ("Task", f"{task['id']} {task['name']} ({task['kind']})"),
        ("Project", f"{task['project_name']} in VDC {task['vdc_name']}, owner {task['owner']}"),
        ("Queue", f"{task['queue_name']} ({task['priority_class']})"),
        ("Status", task["status"] + (f": {task['status_message']}" if task.get("status_message") else "")),
        ("Exit code", task.get("exit_code")),
        ("Failure reason", task.get("failure_reason")),
        ("Queue position", task.get("queue_position")),
        ("Estimated start", when(task.get("estimated_start"))),
        ("Pending reason", " - ".join(filter(None, (task.get("pending_reason"), task.get("pending_message"))))),
        ("Resources", _resources(task)),
        ("Expected duration", task.get("expected_duration")),
        ("Wall time", task.get("wall_time")),
        ("Guaranteed window", task.get("window")),
        ("Cluster", task.get("cluster_name")),
        ("Nodes", ", ".join(p.get("node_name", "") for p in task.get("placement") or [])),
        ("Runs", task.get("attempt")),
        ("Submitted", when(task.get("submitted_at"))),
        ("Started", when(task.get("started_at"))),
        ("Finished", when(task.get("finished_at"))),
        ("Command", task.get("command")),
    ]
    width = max(len(label) for label, _ in fields)
    for label, value in fields:
        if value not in (None, ""):
            print(f"{label + ':':<{width + 1}} {value}")
    print("\nTimeline:")
    events = task["events"]
    rows = [[when(e["created_at"]), e["kind"], e.get("to_status"), e.get("actor"), e["message"]] for e in events]
    print(table(["TIME", "EVENT", "STATUS", "BY", "MESSAGE"], rows))
    return 0


def _resources(task: dict) -> str:
    parts = [f"{task['cpu']} cpu", f"{task['memory_gib']} GiB"]
    if task.get("gpu_spec"):
        parts.append(f"gpu {task['gpu_spec']}")
    return ", ".join(parts) + f" x {task['instances']} instance(s)"


def logs(args: argparse.Namespace, api: Client) -> int:
    """Print a run's output; with ``-f``, keep printing what it writes until the run ends."""
    params = {"tail": args.tail}
    if args.attempt:
        params["attempt"] = args.attempt
    body = api.get(f"tasks/{args.id}/logs/", params)
    _write(body["text"])
    if not args.follow:
        if body["note"] and not body["text"]:
            print(body["note"], file=sys.stderr)
        return 0
    note = _note(body, "")
    failures = 0
    while body["running"] or body["more"]:
        if not body["more"]:
            time.sleep(FOLLOW_INTERVAL_S)
        try:
            body = api.get(f"tasks/{args.id}/logs/", {"after": body["cursor"]})
        except ConnectionFailed as exc:
            failures += 1
            if failures > FOLLOW_RETRIES:
                raise
            print(f"hcs: {exc}; retrying", file=sys.stderr)
            continue
        failures = 0
        _write(body["text"])
        note = _note(body, note)
    print(f"hcs: run {body['attempt']} of task {args.id} ended; the task is {body['status']}", file=sys.stderr)
    return 0


def _write(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def _note(body: dict, last: str) -> str:
    """Say why nothing comes (not started yet, no backend yet) once, not at every read."""
    note = body["note"] if not body["text"] and body["note"] != "No new output." else last
    if note and note != last:
        print(f"hcs: {note}", file=sys.stderr)
    return note


def stop(args: argparse.Namespace, api: Client) -> int:
    """Stop a task: a waiting one at once, a running one on its backend right after."""
    task = api.post(f"tasks/{args.id}/stop/", json={"reason": args.reason})
    if args.json:
        print_json(task)
    else:
        print(f"Task {task['id']} ({task['name']}): {task['status']}")
    return 0


def queue(args: argparse.Namespace, api: Client) -> int:
    """Every queue the user can see with its counts, then the user's waiting tasks in queue order."""
    params = {"vdc_name": args.vdc} if args.vdc else {}
    queues = api.pages("queues/", {**params, "ordering": "name"})
    waiting = api.pages("tasks/", {**params, "waiting": "true", "ordering": "queue_position"})
    if args.json:
        print_json({"queues": queues, "waiting": waiting})
        return 0
    rows = [
        [q["vdc_name"], q["name"], q["priority_class"], q["policy"], "open" if q["is_open"] else "closed",
         q["waiting_count"], q["active_count"]]
        for q in queues
    ]  # fmt: skip
    print(table(["VDC", "QUEUE", "CLASS", "POLICY", "STATE", "WAITING", "ACTIVE"], rows) if rows else "No queues.")
    if waiting:
        print("\nYour projects' waiting tasks:")
        rows = [
            [t["queue_name"], t.get("queue_position"), t["id"], t["name"], t["project_name"], t["status"],
             when(t.get("estimated_start")), t.get("pending_message") or t.get("pending_reason")]
            for t in sorted(waiting, key=lambda t: (t["queue_name"], t.get("queue_position") or 1 << 30))
        ]  # fmt: skip
        print(table(["QUEUE", "POS", "ID", "NAME", "PROJECT", "STATUS", "ESTIMATED START", "WHY"], rows))
    return 0


def _project_id(api: Client, project: str) -> int:
    """A project's id from its id or name, among those the user can see."""
    if project.isdigit():
        return int(project)
    found = api.get("projects/", {"name": project})["results"]
    if not found:
        raise argparse.ArgumentTypeError(f"no project {project!r} that you can see")
    return found[0]["id"]


def _secret(api: Client, project: int, name: str) -> dict | None:
    found = api.get("project-secrets/", {"project": project, "name": name})["results"]
    return found[0] if found else None


def secrets_ls(args: argparse.Namespace, api: Client) -> int:
    """The names of a project's secrets (never their values)."""
    secrets = api.pages("project-secrets/", {"project": _project_id(api, args.project), "ordering": "name"})
    if args.json:
        print_json(secrets)
        return 0
    rows = [[s["name"], s["description"], s.get("updated_by"), when(s["updated_at"])] for s in secrets]
    print(table(["NAME", "DESCRIPTION", "UPDATED BY", "UPDATED"], rows) if rows else "No secrets.")
    return 0


def secrets_set(args: argparse.Namespace, api: Client) -> int:
    """Add a secret or rotate its value; the value comes from standard input (never from the command line, which
    every account on the host can read), without its final newline when typed at a terminal."""
    if sys.stdin.isatty():
        value = getpass.getpass(f"Value of {args.name}: ")
    else:
        value = sys.stdin.read()
    project = _project_id(api, args.project)
    existing = _secret(api, project, args.name)
    body = {"value": value}
    if args.description is not None:
        body["description"] = args.description
    if existing is None:
        api.post("project-secrets/", json={"project": project, "name": args.name, **body})
        print(f"Secret {args.name} added to project {args.project}.")
    else:
        api.request("PATCH", f"project-secrets/{existing['id']}/", json=body)
        print(f"Secret {args.name} of project {args.project} has a new value: each task's next attempt gets it.")
    return 0


def secrets_rm(args: argparse.Namespace, api: Client) -> int:
    """Remove a secret; the API refuses while waiting or running tasks refer to it, and says which."""
    existing = _secret(api, _project_id(api, args.project), args.name)
    if existing is None:
        raise argparse.ArgumentTypeError(f"project {args.project} has no secret {args.name!r} that you can see")
    api.request("DELETE", f"project-secrets/{existing['id']}/")
    print(f"Secret {args.name} removed from project {args.project}.")
    return 0


__all__ = [
    "ApiError",
    "login",
    "logout",
    "submit",
    "ls",
    "status",
    "logs",
    "stop",
    "queue",
    "secrets_ls",
    "secrets_set",
    "secrets_rm",
]
