"""Fake vendor tools for the detector tests: small executables on PATH that print recorded output.

Each fake answers by its argument list: the recorded fixture for a known one, else the exit code and
message a real tool gives for an unknown option. The detectors run them through ``subprocess`` exactly
as they run the real tools.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"

_SCRIPT = """#!{python}
import json, sys, time
answers = json.loads({answers!r})
reply = answers.get(" ".join(sys.argv[1:]), answers.get("*"))
if reply is None:
    sys.stderr.write("Error: invalid option " + " ".join(sys.argv[1:]) + "\\n")
    sys.exit(2)
time.sleep(reply.get("sleep", 0))
if "file" in reply:
    sys.stdout.write(open(reply["file"], encoding="utf-8").read())
sys.stdout.write(reply.get("text", ""))
sys.stderr.write(reply.get("stderr", ""))
sys.exit(reply.get("exit", 0))
"""


def install(bin_dir: Path, name: str, answers: dict[str, dict | str]) -> Path:
    """Write an executable ``name`` into ``bin_dir``; ``answers`` maps an argument string ("*" = any) to a
    fixture file name or a dict of ``file``/``text``/``stderr``/``exit``/``sleep``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    resolved = {
        args: {"file": str(FIXTURES / reply)}
        if isinstance(reply, str)
        else {**reply, **({"file": str(FIXTURES / reply["file"])} if "file" in reply else {})}
        for args, reply in answers.items()
    }
    path = bin_dir / name
    path.write_text(_SCRIPT.format(python=sys.executable, answers=json.dumps(resolved)))
    path.chmod(0o755)
    return path


NPU_SMI = {
    "info": "npu-smi-info.txt",
    "info -t topo": "npu-smi-topo.txt",
    "info -t ecc -i 0 -c 0": "npu-smi-ecc-clean.txt",
    "info -t ecc -i 1 -c 0": "npu-smi-ecc-errors.txt",
    "info -t ecc -i 2 -c 0": "npu-smi-ecc-clean.txt",
    "info -t ecc -i 3 -c 0": "npu-smi-ecc-clean.txt",
}
AMD_SMI = {
    "static --json": "amd-smi-static.json",
    "metric --json": "amd-smi-metric.json",
    "list --json": "amd-smi-list.json",
    "topology --json": "amd-smi-topology.json",
    "version --json": "amd-smi-version.json",
}
ROCM_SMI_ARGS = (
    "--showproductname --showmeminfo vram --showuse --showtemp --showbus --showuniqueid --showdriverversion --json"
)
ROCM_SMI = {ROCM_SMI_ARGS: "rocm-smi.json"}
HY_SMI = {ROCM_SMI_ARGS: "hy-smi.txt"}
CNMON = {"info": "cnmon-info.txt"}
