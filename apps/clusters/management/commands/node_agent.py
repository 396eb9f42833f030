"""Run the node agent: every 10 s, report this host's accelerators (NVML, npu-smi, hy-smi, amd-smi, cnmon)."""

from __future__ import annotations

import json
import logging
import time

import requests
from django.core.management.base import BaseCommand, CommandError

from apps.clusters.detectors import DETECTORS, NodeCollector, detectors_for

log = logging.getLogger("hcs.node_agent")


class Command(BaseCommand):
    help = (
        "Report this host's accelerators to the portal every --interval seconds. The detectors are chosen by what the "
        "host has (NVML library, npu-smi, hy-smi, amd-smi / rocm-smi, cnmon on PATH); --detector forces one."
    )

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="Portal base URL")
        parser.add_argument("--token", required=True, help="Agent token of this node (manage.py issue_agent_token)")
        parser.add_argument("--interval", type=float, default=10.0)
        parser.add_argument("--node", default=None, help="Node name (default: host name)")
        parser.add_argument(
            "--detector", default="auto", choices=["auto", *DETECTORS], help="Which detector reads the devices"
        )
        parser.add_argument("--once", action="store_true", help="Report once and exit")
        parser.add_argument("--print", action="store_true", help="Print the report as JSON too")

    def handle(self, *args, url: str, token: str, interval: float, node: str | None, once: bool, **options):
        if interval <= 0:
            raise CommandError(f"Expected --interval above 0 seconds, got {interval:g}.")
        try:
            detectors = detectors_for(options["detector"])
        except ImportError as exc:
            raise CommandError(f"Detector {options['detector']} cannot load its library: {exc}") from None
        collector = NodeCollector(detectors, node_name=node)
        if not collector.start():
            log.warning(collector.reason)
        else:
            log.info("detectors: %s", ", ".join(d.name for d in collector.started))
        endpoint = url.rstrip("/") + "/api/v1/agent/report/"
        try:
            while True:
                report = collector.collect()
                if options["print"]:
                    self.stdout.write(json.dumps(report.as_dict(), indent=2))
                try:
                    response = requests.post(
                        endpoint, json=report.as_dict(), timeout=10, headers={"Authorization": f"Agent {token}"}
                    )
                    if response.status_code >= 400:
                        log.error("portal refused the report (%s): %s", response.status_code, response.text[:500])
                    else:
                        log.info("reported %d devices: %s", len(report.devices), response.json())
                except requests.RequestException as exc:
                    log.error("cannot reach the portal at %s: %s", endpoint, exc)
                if once:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
        finally:
            collector.stop()
