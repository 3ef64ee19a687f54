"""The tools that need no model start without torch or fairseq; everything else still gets the plugin."""
import os
import shutil
import subprocess
import sys

import pytest

from fairseq_plugins_tools import TOOLS
from helpers import cli_env

HEAVY = ("torch", "fairseq", "fairseq_cli")


def imported_top_level_modules(cmd):
    """Top-level modules a command imports, from CPython's own import log (PYTHONPROFILEIMPORTTIME)."""
    proc = subprocess.run(cmd, env=cli_env({"PYTHONPROFILEIMPORTTIME": "1"}), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # lines: "import time:  self [us] | cumulative | imported package", nesting shown by indentation
    names = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines()
             if line.startswith("import time:") and "imported package" not in line}
    return names, proc.stdout


@pytest.mark.parametrize("command", sorted(TOOLS))
def test_tool_help_imports_neither_torch_nor_fairseq(command):
    script = shutil.which(command, path=os.path.dirname(sys.executable))
    assert script, f"{command} is not installed beside {sys.executable}"
    names, out = imported_top_level_modules([script, "--help"])
    assert "usage:" in out
    assert "fairseq_plugins" in names  # the control: the log does list what the tool imports
    assert not names & set(HEAVY), f"{command} --help imported {sorted(names & set(HEAVY))}"


def test_import_fairseq_plugins_still_installs_the_plugin():
    """Outside the light tools' launcher, importing the package installs the patches and registers the models."""
    code = ("import fairseq_plugins, sys\n"
            "from fairseq.models import ARCH_MODEL_REGISTRY\n"
            "from fairseq import checkpoint_utils\n"
            "from fairseq_plugins.patches import checkpoint_io\n"
            "assert 'torch' in sys.modules and 'rnnsearch' in ARCH_MODEL_REGISTRY\n"
            "assert checkpoint_utils.load_checkpoint_to_cpu.__module__ == checkpoint_io.__name__\n")
    subprocess.run([sys.executable, "-c", code], env=cli_env(), check=True)
