"""What each ``hcs`` command does; the argument parser lives in ``__main__``.

Every command takes the parsed arguments and a :class:`~hcs_cli.client.Client` and returns the process's
exit status; API refusals propagate as :class:`~hcs_cli.client.ApiError` and are printed in one place.
"""

from __future__ import annotations

import argparse
import getpass
import json
import shlex
import sys
import time
import uuid
from pathlib import Path

import yaml

from hcs_cli import config, forward, terminal
from hcs_cli.client import ApiError, Client, ConnectionFailed
from hcs_cli.output import print_json, table, when

# Submission options that go to the API as they are, by their field name.
PLAIN_FIELDS = (
    "name",
    "kind",
    "vdc",
    "queue",
    "cpu",
    "memory_gib",
    "gpu_spec",
    "instances",
    "elastic_min",
    "elastic_max",
    "expected_duration",
    "wall_time",
    "image",
    "framework",
    "model_path",
    "epochs",
    "batch_size",
    "checkpoint_path",
    "max_retries",
    "ide_type",
    "idle_stop_minutes",
    "idle_stop_percent",
    "port",
    "max_tokens",
    "temperature",
    "autoscale_min",
    "autoscale_max",
    "autoscale_cpu_percent",
    "autoscale_gpu_percent",
    "autoscale_rps",
    "autoscale_concurrency",
    "autoscale_latency_ms",
    "scale_to_zero_after_s",
)
# How long a follower waits between two reads when nothing new came.
FOLLOW_INTERVAL_S = 1.0
# A follower rides out a server restart or a network blip this many times in a row before giving up.
FOLLOW_RETRIES = 10
# After a submit, the scheduling cycle it asked for ranks the task within moments: wait this long for it.
RANK_WAIT_S = 5.0
RANK_POLL_S = 0.25
# A submit that got no answer is sent again this many times (1 s, then 2 s later), under the same key.
SUBMIT_RETRIES = 2
SUBMIT_RETRY_DELAY_S = 1.0


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


def read_task_file(path: str) -> dict:
    """A task file's fields: one JSON or YAML mapping (``-`` reads standard input). The API checks the fields
    and refuses unknown keys by name; here only the shape is checked."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read the task file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError:
        data = _yaml(text, path)
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(
            f"{path}: expected a task file holding one mapping of task fields (name: ..., project: ...)"
        )
    return data


def _yaml(text: str, path: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise argparse.ArgumentTypeError(f"{path}: expected YAML or JSON; it does not parse{where}") from None


def submit(args: argparse.Namespace, api: Client) -> int:
    """Submit a task from a task file, or a template, and the options (which override the file's fields); the API
    checks it as it checks the pages' forms."""
    if args.template:
        if args.file:
            raise argparse.ArgumentTypeError("give -f/--file or --template, not both")
        template = _template(api, args.template, args.project)
        body = _submit_body(args, required=False)
        body.pop("project", None)  # a template submits to its own project
        answer = _post_once(f"task-templates/{template['id']}/submit/", body, api)
    else:
        answer = _post_once("tasks/", _submit_body(args), api)
    task = _ranked(answer, api)
    if args.json:
        print_json(task)
    else:
        print(f"Submitted task {task['id']} ({task['name']}): {_summary(task)}")
    return 0


def _submit_body(args: argparse.Namespace, required: bool = True) -> dict:
    """The submit body of a task file and the options of ``hcs submit`` (which override the file's fields); with
    ``required`` False only what the options give (the fields a template's submission overrides)."""
    body = read_task_file(args.file) if args.file else {}
    body.update({field: getattr(args, field) for field in PLAIN_FIELDS if getattr(args, field) is not None})
    if args.project is not None:
        body["project"] = args.project
    for needed, option in (("project", "-p/--project"), ("name", "-n/--name")) if required else ():
        if body.get(needed) in (None, ""):
            raise argparse.ArgumentTypeError(f"give {option}, or {needed}: in a task file (-f)")
    if required:
        body.setdefault("kind", "training")
    for field in ("project", "vdc", "queue"):  # an id or a name: the API tells them apart by JSON type
        if isinstance(body.get(field), str) and body[field].isdigit():
            body[field] = int(body[field])
    if args.command is not None and args.argv:
        raise argparse.ArgumentTypeError("give the command with -c/--command or after --, not both")
    command = args.command if args.command is not None else shlex.join(args.argv) if args.argv else None
    if command is not None:
        body["command"] = command
    # Variables and labels given as options join the file's, and win where both name one.
    for field, pairs, option in (
        ("env", args.env, "-e/--env"),
        ("secret_env", args.secret_env, "--secret-env"),
        ("required_labels", args.label, "--label"),
    ):
        if pairs:
            base = body.get(field) if isinstance(body.get(field), dict) else {}
            body[field] = {**base, **key_values(pairs, option)}
    refs = [{"secret": name, "env": var} for var, name in key_values(args.secret, "-s/--secret").items()]
    refs += [{"secret": name, "file": path} for path, name in key_values(args.secret_file, "--secret-file").items()]
    if refs:
        body["secret_refs"] = refs
    if args.preemptible is not None:
        body["preemptible"] = args.preemptible
    if getattr(args, "schedule_min", None):
        body["autoscale_schedule"] = list(args.schedule_min)  # the API reads each line and says what is wrong
    return body


def _post_once(path: str, body: dict, api: Client):
    """POST a submit, retrying when no answer came back; one Idempotency-Key for all the tries, so the
    server creates the task once however many of them reached it."""
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    retries = 0
    while True:
        try:
            return api.post(path, json=body, headers=headers)
        except ConnectionFailed as exc:
            retries += 1
            if retries > SUBMIT_RETRIES:
                raise
            print(f"hcs: {exc}; retrying with the same Idempotency-Key", file=sys.stderr)
            time.sleep(SUBMIT_RETRY_DELAY_S * retries)


def _ranked(task: dict, api: Client) -> dict:
    """The task once the scheduling cycle its submission asked for has ranked it (or anything else happened),
    waiting at most RANK_WAIT_S; as submitted when no cycle came in that time."""
    deadline = time.monotonic() + RANK_WAIT_S
    while task["status"] in ("pending", "queued") and not task.get("queue_position"):
        if time.monotonic() >= deadline:
            break
        time.sleep(RANK_POLL_S)
        task = api.get(f"tasks/{task['id']}/")
    return task


def _summary(task: dict) -> str:
    """The task's state in a line, as the pages word it."""
    status = task["status"]
    if status == "queued":
        position = task.get("queue_position")
        if not position:
            return f"queued in {task['queue_name']}, not ranked yet (the next scheduling cycle ranks it; `hcs status`)"
        start = when(task.get("estimated_start")) or "unknown"
        reason = f", waiting because {task['pending_message']}" if task.get("pending_message") else ""
        return f"queued in {task['queue_name']}, position {position}, estimated start {start}{reason}"
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
        [
            t["id"],
            t["name"],
            t["kind"],
            t["project_name"],
            t["queue_name"],
            t["status"],
            t.get("queue_position"),
            t["gpu_spec"],
            t.get("cluster_name"),
            when(t["submitted_at"]),
        ]
        for t in tasks
    ]
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


def task_file(args: argparse.Namespace, api: Client) -> int:
    """Print a task's task file: what it was submitted with, secret values never (their names in a comment)."""
    data = api.get(f"tasks/{args.id}/task-file/")
    if args.json:
        print_json(data)
        return 0
    names = api.get(f"tasks/{args.id}/")["secret_env_names"]
    print(f"# Task file of task {args.id}: `hcs submit -f FILE` submits it again.")
    if names:
        print(
            f"# Secret variables left out (values are never shown): {', '.join(names)}; give them again under "
            "secret_env or with --secret-env."
        )
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
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


def delete(args: argparse.Namespace, api: Client) -> int:
    """Delete an ended task that never ran (one with metered usage is kept for billing, and the API says so)."""
    api.delete(f"tasks/{args.id}/")
    print(f"Task {args.id} deleted")
    return 0


def sweep_parameters(params: list[str] | None, combos: list[str] | None) -> dict | list:
    """``--param lr=0.1,0.01`` (a grid) or ``--combo lr=0.1,batch_size=32`` (explicit combinations) as the API's
    ``parameters``; values stay text, as the jobs get them."""
    if params and combos:
        raise argparse.ArgumentTypeError("give --param (a grid) or --combo (explicit combinations), not both")
    if combos:
        return [key_values(combo.split(","), "--combo") for combo in combos]
    if not params:
        raise argparse.ArgumentTypeError("give the values to sweep: --param NAME=V1,V2 (repeat) or --combo NAME=V,...")
    grid = {}
    for name, values in key_values(params, "--param").items():
        grid[name] = values.split(",")
    return grid


def sweep_submit(args: argparse.Namespace, api: Client) -> int:
    """Submit a sweep: the task of ``hcs submit``'s file and options once per combination, all or none."""
    body = {**_submit_body(args), "parameters": sweep_parameters(args.param, args.combo)}
    if args.goal:
        body["goal"] = args.goal
    if args.dry_run:
        body["dry_run"] = True
    answer = _post_once("sweeps/", body, api)
    if args.json:
        print_json(answer)
        return 0
    price = answer["price"]
    if answer["dry_run"]:
        print(f"Dry run: {answer['size']} tasks would be created (nothing was)")
    else:
        print(f"Submitted sweep {answer['id']} ({answer['name']}): {answer['size']} tasks")
    print(_elements(answer["elements"]))
    if price["hourly_price"] is not None:
        cost = f", {price['estimated_cost']} over the expected duration" if price["estimated_cost"] else ""
        print(f"Price: {price['hourly_price']} {price['currency']}/h for all tasks at once{cost}")
    return 0


def _metric(element: dict) -> str:
    return f"{element['metric_name']}={element['metric_value']}" if element.get("metric_value") is not None else ""


def _elements(elements: list[dict]) -> str:
    rows = [
        [e["task"], e["name"], " ".join(f"{k}={v}" for k, v in e["values"].items()), e["status"], _metric(e)]
        for e in elements
    ]
    return table(["TASK", "NAME", "VALUES", "STATUS", "METRIC"], rows)


def _counts(sweep: dict) -> str:
    return ", ".join(f"{n} {status}" for status, n in sweep["counts"]["by_status"].items()) or "no tasks"


def sweep_ls(args: argparse.Namespace, api: Client) -> int:
    """The sweeps of the user's projects, newest first, with their tasks counted per status."""
    params = {"ordering": "-created_at"}
    if args.project:
        params["project" if args.project.isdigit() else "project_name"] = args.project
    sweeps = api.pages("sweeps/", params)
    if args.json:
        print_json(sweeps)
        return 0
    rows = [
        [s["id"], s["name"], s["project_name"], s["counts"]["total"], _counts(s), when(s["created_at"])] for s in sweeps
    ]
    print(table(["ID", "NAME", "PROJECT", "TASKS", "STATUS", "CREATED"], rows))
    return 0


def sweep_show(args: argparse.Namespace, api: Client) -> int:
    """A sweep: its counts, then each element's values, task and status (``hcs logs TASK`` for its output)."""
    sweep = api.get(f"sweeps/{args.id}/")
    if args.json:
        print_json(sweep)
        return 0
    print(
        f"Sweep {sweep['id']} ({sweep['name']}) of {sweep['project_name']} by {sweep['created_by']}: {_counts(sweep)}"
    )
    print(_elements(sweep["elements"]))
    best = sweep["best"]
    if best:
        print(f"Best ({sweep['goal']}): task {best['task']} ({best['name']}) {_metric(best)}")
    return 0


def sweep_stop(args: argparse.Namespace, api: Client) -> int:
    """Stop every unfinished task of a sweep."""
    sweep = api.post(f"sweeps/{args.id}/stop/", json={"reason": args.reason})
    if args.json:
        print_json(sweep)
    else:
        print(f"Sweep {sweep['id']} ({sweep['name']}): {_counts(sweep)}")
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
        [
            q["vdc_name"],
            q["name"],
            q["priority_class"],
            q["policy"],
            "open" if q["is_open"] else "closed",
            q["waiting_count"],
            q["active_count"],
        ]
        for q in queues
    ]
    print(table(["VDC", "QUEUE", "CLASS", "POLICY", "STATE", "WAITING", "ACTIVE"], rows) if rows else "No queues.")
    if waiting:
        print("\nYour projects' waiting tasks:")
        rows = [
            [
                t["queue_name"],
                t.get("queue_position"),
                t["id"],
                t["name"],
                t["project_name"],
                t["status"],
                when(t.get("estimated_start")),
                t.get("pending_message") or t.get("pending_reason"),
            ]
            for t in sorted(waiting, key=lambda t: (t["queue_name"], t.get("queue_position") or 1 << 30))
        ]
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


def _template(api: Client, key: str, project: str | None = None) -> dict:
    """A template by id, or by name (within ``project`` when given: names are unique per project)."""
    if key.isdigit():
        return api.get(f"task-templates/{key}/")
    params = {"name": key}
    if project:
        params["project" if project.isdigit() else "project_name"] = project
    found = api.pages("task-templates/", params)
    if not found:
        where = f" in project {project}" if project else ""
        raise argparse.ArgumentTypeError(f"no template {key!r}{where} that you can see (`hcs template ls`)")
    if len(found) > 1:
        projects = ", ".join(sorted(t["project_name"] for t in found))
        raise argparse.ArgumentTypeError(
            f"template {key!r} is in several projects ({projects}): give -p/--project or the template's id"
        )
    return found[0]


def template_ls(args: argparse.Namespace, api: Client) -> int:
    """The templates of the user's projects (or of one), by project and name."""
    params = {"ordering": "project__name,name"}
    if args.project:
        params["project" if args.project.isdigit() else "project_name"] = args.project
    templates = api.pages("task-templates/", params)
    if args.json:
        print_json(templates)
        return 0
    rows = [
        [
            t["id"],
            t["name"],
            t["project_name"],
            t["kind"],
            t["description"][:60],
            t.get("created_by"),
            when(t["updated_at"]),
        ]
        for t in templates
    ]
    headers = ["ID", "NAME", "PROJECT", "KIND", "DESCRIPTION", "BY", "UPDATED"]
    print(table(headers, rows) if rows else "No templates.")
    return 0


def template_show(args: argparse.Namespace, api: Client) -> int:
    """A template's task file as YAML (``hcs submit -f`` takes it, with -p)."""
    template = _template(api, args.template, args.project)
    if args.json:
        print_json(template)
        return 0
    print(f"# Template {template['id']} ({template['name']}) of project {template['project_name']}")
    if template["description"]:
        print(f"# {template['description']}")
    sys.stdout.write(yaml.safe_dump(template["task_file"], sort_keys=False, allow_unicode=True))
    return 0


def template_save(args: argparse.Namespace, api: Client) -> int:
    """Keep a task's task file (what it was submitted with, secret values never) as a template of its project;
    the project's owners may."""
    data = api.get(f"tasks/{args.task_id}/task-file/")
    project = data.pop("project")
    body = {"project": project, "name": args.name, "description": args.description or "", "task_file": data}
    template = api.post("task-templates/", json=body)
    if args.json:
        print_json(template)
    else:
        print(f"Saved task {args.task_id} as template {template['id']} ({template['name']}) of project {project}")
    return 0


def template_rm(args: argparse.Namespace, api: Client) -> int:
    """Delete a template (the project's owners); tasks submitted from it stay."""
    template = _template(api, args.template, args.project)
    api.request("DELETE", f"task-templates/{template['id']}/")
    print(f"Template {template['id']} ({template['name']}) of project {template['project_name']} deleted")
    return 0


def exec_(args: argparse.Namespace, api: Client) -> int:
    """The Web Console from this terminal: an interactive shell, or one command whose output and status come back."""
    argv = list(args.argv or [])
    interactive = not argv
    rows, cols = terminal.window_size(sys.stdin.fileno()) if interactive else (24, 80)
    token = api.session.headers["Authorization"].removeprefix("Token ")
    ws = terminal.open_console(api.base_url, token, args.id, args.instance, rows, cols)
    try:
        if interactive:
            terminal.interactive(ws, sys.stdin.fileno(), sys.stdout.buffer)
            return 0
        return terminal.run_command(ws, argv, sys.stdout.buffer)
    except terminal.Refused as refused:
        print(f"hcs: {refused}", file=sys.stderr)
        return 1
    finally:
        ws.close()


def port_forward(args: argparse.Namespace, api: Client) -> int:
    """Serve a task's Connect app on 127.0.0.1 until interrupted (Ctrl-C: exit status 130, as for every command)."""
    visit = forward.Visit(api, args.id, args.port)
    local_port = args.port if args.local_port is None else args.local_port

    def announce(address: str) -> None:
        print(f"Forwarding {address} -> task {args.id} port {args.port} ({visit.target.origin})", flush=True)

    forward.serve(visit, local_port, announce)
    return 0


__all__ = [
    "ApiError",
    "login",
    "logout",
    "submit",
    "ls",
    "status",
    "task_file",
    "logs",
    "stop",
    "queue",
    "secrets_ls",
    "secrets_set",
    "secrets_rm",
    "template_ls",
    "template_show",
    "template_save",
    "template_rm",
    "exec_",
    "port_forward",
]
