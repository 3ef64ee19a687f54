"""What the README's test command needs from the machine: scripts/install_chromium.sh (run by
scripts/test.sh before any test) and the CI skip policy (tests/skip_policy.py)."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import skip_policy
from helpers import REPO, needs_native_bf16

INSTALL_CHROMIUM = os.path.join(REPO, "scripts", "install_chromium.sh")


def stub(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)


def run_install_chromium(tmp_path, uid, apt_get=None, sudo=True, chromium=False):
    """Run the script with PATH holding only stubs (``chromium``, ``apt-get``, ``sudo``, ``id``; /usr/bin's
    real chromium is not on it), each recording its arguments in calls.log; returns (process, calls)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    stub(bin_dir, "id", f'[ "$1" = -u ] && echo {uid}')
    if chromium:
        stub(bin_dir, "chromium", "")
    if apt_get is not None:
        stub(bin_dir, "apt-get", f'echo "apt-get $*" >> {log}\n{apt_get}')
    if sudo:
        stub(bin_dir, "sudo", f'echo "sudo $*" >> {log}\n"$@"')
    proc = subprocess.run(["/bin/bash", INSTALL_CHROMIUM], env={"PATH": str(bin_dir)}, capture_output=True, text=True)
    return proc, log.read_text().splitlines() if log.exists() else []


# apt-get install's stub puts a chromium on PATH, as the real package does
INSTALLS = '[ "$1" = install ] && printf "#!/bin/bash\\n" > "${0%/*}/chromium" && /bin/chmod +x "${0%/*}/chromium"; true'


def test_chromium_on_path_installs_nothing(tmp_path):
    proc, calls = run_install_chromium(tmp_path, 0, apt_get="exit 1", chromium=True)
    assert (proc.returncode, calls, proc.stdout + proc.stderr) == (0, [], "")


@pytest.mark.parametrize("uid, expected", [
    (0, ["apt-get update -qq", "apt-get install -y -qq chromium"]),
    (1000, ["sudo apt-get update -qq", "apt-get update -qq", "sudo apt-get install -y -qq chromium",
            "apt-get install -y -qq chromium"]),
])
def test_missing_chromium_is_installed_with_apt_get_through_sudo_unless_root(tmp_path, uid, expected):
    proc, calls = run_install_chromium(tmp_path, uid, apt_get=INSTALLS)
    assert proc.returncode == 0, proc.stderr
    assert calls == expected
    assert "apt-get install -y chromium" in proc.stdout


ASK = ("error: the tests need Debian's Chromium (tests/integration/test_serve_browser.py): install it, "
       "e.g. sudo apt-get install -y chromium, then run this again")


@pytest.mark.parametrize("case", ["no apt-get", "not root, no sudo", "apt-get fails", "installs no chromium"])
def test_chromium_that_cannot_be_installed_is_asked_for_in_one_line(tmp_path, case):
    apt_get = {"no apt-get": None, "apt-get fails": 'echo "E: Unable to locate package chromium" >&2; exit 100',
               "installs no chromium": "true"}.get(case, INSTALLS)
    proc, _ = run_install_chromium(tmp_path, 1000 if case == "not root, no sudo" else 0, apt_get=apt_get,
                                   sudo=case != "not root, no sudo")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == ASK


def test_readme_test_command_installs_chromium_before_anything_else():
    lines = [line for line in open(os.path.join(REPO, "scripts", "test.sh")) if line.strip() and line[0] != "#"]
    commands = [line.split()[:2] for line in lines if line.startswith(("bash ", "exec "))]
    assert commands[0] == ["bash", "scripts/install_chromium.sh"]
    assert ["bash", "scripts/setup_env.sh"] in commands[1:]
    ci = [line.strip() for line in open(os.path.join(REPO, ".ci", "run")) if line.strip() and line[0] != "#"]
    assert ci[-1] == "bash scripts/test.sh" and not any("apt-get" in line or "pytest" in line for line in ci)


# --------------------------------------------------------------------------- CI skip policy

SKIPPING_TESTS = f"""
import pytest

def test_runs():
    pass

def test_missing_data_file():
    pytest.skip("no German gettext catalogs installed")

@pytest.mark.skipif(True, reason={needs_native_bf16.kwargs["reason"]!r})
def test_needs_bf16():
    pass

@pytest.mark.xfail(reason="a known fairseq bug", strict=True)
def test_expected_to_fail():
    assert False
"""


def run_inner_pytest(tmp_path, ci):
    """pytest on SKIPPING_TESTS and a module skipped as a whole, with this suite's hooks; returns the
    outcome of every test, the (file, reason) of every skip and the summary line."""
    (tmp_path / "conftest.py").write_text("from skip_policy import pytest_make_collect_report, "
                                          "pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_skips.py").write_text(SKIPPING_TESTS)
    (tmp_path / "test_tool.py").write_text(textwrap.dedent("""
        import pytest
        pytest.importorskip("no_such_tool_module")

        def test_uses_the_tool():
            pass
        """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI"))}
    env["PYTHONPATH"] = os.path.join(REPO, "tests")
    if ci is not None:
        env["CI"] = ci
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "no:randomly", "--continue-on-collection-errors", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True)
    outcomes = dict((test, outcome) for outcome, test in
                    re.findall(r"^(PASSED|FAILED|SKIPPED|XFAIL|ERROR) (?:\[\d+\] )?(\S+)", proc.stdout, re.M))
    # -rA names a skip by its location and reason, not its node id
    skips = re.findall(r"^SKIPPED \[\d+\] ([^:\s]+):\d+: (.*)$", proc.stdout, re.M)
    return outcomes, skips, proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("ci", ["true", "1"])
def test_on_ci_a_missing_tool_or_file_fails_and_only_the_bf16_skip_skips(tmp_path, ci):
    outcomes, skips, summary = run_inner_pytest(tmp_path, ci)
    assert outcomes["test_skips.py::test_missing_data_file"] == "FAILED"
    assert outcomes["test_tool.py"] == "ERROR"
    assert skips == [("test_skips.py", needs_native_bf16.kwargs["reason"])]
    assert (outcomes["test_skips.py::test_runs"], outcomes["test_skips.py::test_expected_to_fail"]) == ("PASSED", "XFAIL")
    assert re.match(r"=+ 1 failed, 1 passed, 1 skipped, 1 xfailed, (\d+ warnings?, )?1 error in ", summary), summary


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_off_ci_skips_stay_skips(tmp_path, ci):
    _, _, summary = run_inner_pytest(tmp_path, ci)
    assert re.match(r"=+ 1 passed, 3 skipped, 1 xfailed(, \d+ warnings?)? in ", summary), summary


def test_this_suite_uses_the_skip_policy(request):
    hooks = {impl.function for impl in request.config.pluginmanager.hook.pytest_runtest_makereport.get_hookimpls()}
    assert skip_policy.pytest_runtest_makereport in hooks
    hooks = {impl.function for impl in request.config.pluginmanager.hook.pytest_make_collect_report.get_hookimpls()}
    assert skip_policy.pytest_make_collect_report in hooks


@pytest.mark.slow
def test_export_hf_works_beside_a_torchaudio_that_cannot_load(generation_models, tmp_path):
    """A venv made by plain pip holds a torchaudio that does not load beside torch's CPU build; a
    stand-in that fails as it does (OSError at import) breaks transformers the same way, yet the
    installed fairseq-plugins-export-hf exports, and a user's script with the guard imports the
    pipeline."""
    site = tmp_path / "site"
    (site / "torchaudio").mkdir(parents=True)
    (site / "torchaudio" / "__init__.py").write_text(
        'raise OSError("Could not load this library: .../torchaudio/lib/_torchaudio.so (a stand-in)")\n')
    env = {**os.environ, "PYTHONPATH": str(site)}

    def python(code):
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)

    broken = python("from transformers import pipeline")
    assert broken.returncode != 0 and "_torchaudio.so" in broken.stderr  # the stand-in reproduces the failure
    export = os.path.join(os.path.dirname(sys.executable), "fairseq-plugins-export-hf")
    proc = subprocess.run([export, generation_models["vaswani_transformer"], str(tmp_path / "hf")], env=env,
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "hf" / "config.json").is_file(), proc.stderr[-2000:]
    guarded = python("from fairseq_plugins.torchaudio_guard import hide_unloadable_torchaudio\n"
                     "hide_unloadable_torchaudio()\n"
                     "from transformers import pipeline\n"
                     f"print(pipeline('translation', model={str(tmp_path / 'hf')!r}, trust_remote_code=True)(['4 5 6'])[0]['translation_text'] != None)")
    assert guarded.returncode == 0 and guarded.stdout.strip().endswith("True"), guarded.stderr[-2000:]


def test_setup_env_says_what_it_is_doing_during_the_install(tmp_path):
    """A fresh venv takes 5-8 minutes: a line per step, with the time so far, and one when it is ready
    (pip stubbed: it records its arguments; the interpreter is this one)."""
    venv, web, log = tmp_path / "venv", tmp_path / "web", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    stub(venv / "bin", "python", f'exec {sys.executable} "$@"')
    stub(venv / "bin", "pip", f'echo "pip $*" >> {log}')
    package = web / "node_modules" / "onnxruntime-web" / "package.json"  # onnxruntime-web there already
    package.parent.mkdir(parents=True)
    with open(os.path.join(REPO, "scripts", "setup_onnx_web.sh")) as f:
        version = re.search(r"^VERSION=(\S+)", f.read(), re.M)[1]
    package.write_text(f'{{"version": "{version}"}}')
    env = dict(os.environ, VENV=str(venv), PYTHON=sys.executable, FAIRSEQ_PLUGINS_ONNX_WEB=str(web))
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "setup_env.sh")], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    steps = [re.sub(r"\(\d+ s so far\)", "(N s so far)", line) for line in proc.stdout.splitlines()]
    assert steps[0].startswith(f"== creating {venv} (Python ")
    assert steps[0].endswith("about 5-8 minutes on a fresh machine")
    torchaudio = [line for line in steps if line.startswith("== removing torchaudio")]  # where it cannot load
    assert steps[1:-1] == ["== step 1/3 (N s so far): installing torch (the largest download)",
                           "== step 2/3 (N s so far): installing fairseq, the suite and its test tools", *torchaudio,
                           "== step 3/3 (N s so far): onnxruntime-web for the ONNX page (npm)"]
    assert re.fullmatch(rf"== {re.escape(str(venv))} ready in \d+ s", steps[-1])
    assert len(log.read_text().splitlines()) >= 2  # both installs ran, through the stub
