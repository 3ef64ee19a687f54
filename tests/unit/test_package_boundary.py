"""The plugin and the lab apart: ``--user-dir fairseq_plugins`` loads none of the project's own tooling."""
import subprocess
import sys

from helpers import REPO, cli_env


def test_importing_the_plugin_imports_nothing_of_the_lab():
    """``import fairseq_plugins`` (what ``--user-dir`` does) installs the plugin and leaves the
    benchmarks, the experiment driver and their speed targets (``fairseq_plugins_lab``) unimported."""
    code = ("import sys, fairseq_plugins\n"
            "from fairseq.models import ARCH_MODEL_REGISTRY\n"
            "assert 'rnnsearch' in ARCH_MODEL_REGISTRY\n"  # the control: the plugin is installed
            "print(sorted(name for name in sys.modules if name.split('.')[0] == 'fairseq_plugins_lab'))\n")
    out = subprocess.run([sys.executable, "-c", code], env=cli_env(), cwd=REPO, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    assert out.splitlines()[-1] == "[]"
