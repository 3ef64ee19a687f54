"""``--user-dir`` from a folder other than the checkout, by install mode (see docs/INSTALL.md's install notes).

fairseq resolves a --user-dir that is not a path from the current folder next to its own
package (``site-packages/fairseq/../fairseq_plugins``): a ``pip install .`` puts the suite
there, a ``pip install -e .`` does not (only a finder that points at the checkout)."""
import os
import shutil
import sys

import fairseq
import pytest
from helpers import REPO, run

PARSE = ("from fairseq import options; import sys; "
         "args = options.parse_args_and_arch(options.get_training_parser(), "
         "['data', '--user-dir', sys.argv[1], '--arch', 'rnnsearch_tiny']); "
         "import fairseq_plugins; print(args.arch, fairseq_plugins.__file__)")


@pytest.mark.slow
def test_bare_name_after_pip_install(tmp_path):
    source, site = tmp_path / "source", tmp_path / "site-packages"
    source.mkdir()  # a copy, so that the build's files stay out of the checkout
    shutil.copy(os.path.join(REPO, "setup.py"), source)
    shutil.copytree(os.path.join(REPO, "fairseq_plugins"), source / "fairseq_plugins",
                    ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-compile",
         "--disable-pip-version-check", "--target", site, source])
    # fairseq beside it, as pip lays them out: a real folder (its ".." must be site), entries linked
    installed = os.path.dirname(fairseq.__file__)
    (site / "fairseq").mkdir()
    for entry in os.listdir(installed):
        (site / "fairseq" / entry).symlink_to(os.path.join(installed, entry))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run([sys.executable, "-c", PARSE, "fairseq_plugins"], cwd=elsewhere, env={"PYTHONPATH": str(site)})
    arch, path = out.strip().splitlines()[-1].split()
    assert arch == "rnnsearch_tiny" and path.startswith(str(site))


def test_package_path_works_from_anywhere(tmp_path):
    """docs/INSTALL.md's form for an editable install: the package's folder, from Python."""
    command = ("python -c \"$0\" \"$(python -c 'import fairseq_plugins, os; "
               "print(os.path.dirname(fairseq_plugins.__file__))')\"")
    out = run(["bash", "-c", command, PARSE], cwd=tmp_path)
    arch, path = out.strip().splitlines()[-1].split()
    assert arch == "rnnsearch_tiny" and os.path.samefile(os.path.dirname(path), os.path.join(REPO, "fairseq_plugins"))
