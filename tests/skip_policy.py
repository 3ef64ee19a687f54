"""On CI (``CI`` set to true, as CI services do), a skipped test is a failure: a skip there means a tool
or a data file the suite needs is missing, and would hide the tests it stops. The one exception is
the documented hardware skip, ``helpers.needs_native_bf16`` (a CPU without native bf16). conftest.py
imports these hooks; a test conftest can import them the same way."""
import os

import pytest
from helpers import needs_native_bf16

ALLOWED_ON_CI = {needs_native_bf16.kwargs["reason"]}


def on_ci():
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _fail_if_not_allowed(report, reason):
    if on_ci() and report.skipped and not hasattr(report, "wasxfail") and reason not in ALLOWED_ON_CI:
        report.outcome = "failed"
        report.longrepr = f"skipped on CI (CI={os.environ['CI']}), where only the no-native-bf16 skip may skip: {reason}"


def _skip_reason(excinfo):
    return str(excinfo.value.msg) if excinfo is not None and excinfo.errisinstance(pytest.skip.Exception) else ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_if_not_allowed(outcome.get_result(), _skip_reason(call.excinfo))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped as a whole (``pytest.importorskip``, ``pytest.skip(allow_module_level=True)``)."""
    outcome = yield
    report = outcome.get_result()
    _fail_if_not_allowed(report, report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr))
