"""The one logging path (ci/base/log.py): steps and errors as GitHub Actions workflow commands, streamed
commands that keep their tail for the one-line error, transfer progress in tenths or as a bar."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest

from ci.base import log
from ci.base.errors import WheelhouseError


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def configured():
    """``configure(...)`` for one test; the logger is put back as it was afterwards."""
    root = logging.getLogger(log.ROOT)
    before = (list(root.handlers), root.level, root.propagate)

    def setup(**kwargs) -> io.StringIO:
        out = io.StringIO()
        log.configure(stream=out, **kwargs)
        return out

    yield setup
    root.handlers[:], root.level, root.propagate = before


def test_steps_fold_into_groups_with_durations_on_github_actions(configured):
    out = configured(github_actions=True)
    clock = FakeClock()
    with pytest.raises(WheelhouseError), log.Steps(clock=clock) as steps:
        steps.start("toolchain: Python 3.12, torch 2.13.0")
        log.get("toolchain").info("  Resolved 31 packages")
        clock.now += 12.34
        steps.start("sources: git https://example.invalid/x.git @ v1")
        clock.now += 2
        raise WheelhouseError("git fetch failed")
    log.report_error("git fetch https://example.invalid/x.git v1 failed 4 times: fatal: no route; check the URL")
    assert out.getvalue().splitlines() == [
        "::group::toolchain: Python 3.12, torch 2.13.0",
        "  Resolved 31 packages",
        "toolchain: Python 3.12, torch 2.13.0: done in 12.3s",
        "::endgroup::",
        "::group::sources: git https://example.invalid/x.git @ v1",
        "sources: git https://example.invalid/x.git @ v1: failed after 2.0s",
        "::endgroup::",
        "::error::git fetch https://example.invalid/x.git v1 failed 4 times: fatal: no route; check the URL",
    ]


def test_steps_and_errors_outside_github_actions_are_plain_lines(configured):
    out = configured(github_actions=False)
    clock = FakeClock()
    with log.Steps(clock=clock) as steps:
        steps.start("build: build_scripts/fixture.sh")
        clock.now += 61
    log.report_error("versions.yaml: components.x.max_job: unknown key (did you mean 'max_jobs'?)")
    assert out.getvalue().splitlines() == [
        "--- build: build_scripts/fixture.sh",
        "--- build: build_scripts/fixture.sh: done in 61.0s",
        "error: versions.yaml: components.x.max_job: unknown key (did you mean 'max_jobs'?)",
    ]


def test_steps_give_each_keyed_steps_duration_the_running_one_so_far_and_the_total(configured):
    configured(github_actions=False)
    clock = FakeClock()
    with log.Steps(clock=clock) as steps:
        steps.start("toolchain: Python 3.12", key="toolchain")
        clock.now += 12.5
        steps.start("a step the caller does not time")
        clock.now += 1
        steps.start("build: fixture", key="build")
        clock.now += 30
        assert steps.durations() == {"toolchain": 12.5, "build": 30.0, "total": 43.5}
        clock.now += 4  # the step ends later: its duration is then taken when it ends
    assert steps.durations() == {"toolchain": 12.5, "build": 34.0, "total": 47.5}


def test_an_annotation_stays_one_line():
    formatter = log._Formatter(github_actions=True)
    record = logging.LogRecord("wheelhouse", logging.ERROR, __file__, 1, "100% broken\nsecond", None, None)
    record.wheelhouse = "error"
    assert formatter.format(record) == "::error::100%25 broken%0Asecond"


def test_credentials_in_urls_never_reach_the_log(configured):
    out = configured()
    log.get("toolchain").info("installing torch==2.13.0 from https://ci:s3cret-token@mirror.example.invalid/simple")
    with pytest.raises(WheelhouseError) as info:
        log.run_streamed([sys.executable, "-c", "import sys; print('proxy http://u:pw@proxy.invalid:3128 refused');"
                          " sys.exit(1)"], "install torch from https://ci:s3cret-token@mirror.example.invalid/simple")
    text = out.getvalue() + str(info.value)
    assert "s3cret-token" not in text and ":pw@" not in text
    assert "https://***@mirror.example.invalid/simple" in text and "http://***@proxy.invalid:3128" in text


def test_output_streams_while_the_command_runs_and_its_tail_names_the_failure(tmp_path: Path, configured):
    """The child waits for a file that only a logged line creates: captured output would hang here."""
    out = configured()
    go = tmp_path / "go"
    child = (
        "import pathlib, sys, time\n"
        "print('Resolved 31 packages in 2ms', flush=True)\n"
        f"go = pathlib.Path({str(go)!r})\n"
        "deadline = time.time() + 30\n"
        "while not go.exists() and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print('streamed' if go.exists() else 'captured', flush=True)\n"
        "print('error: Failed to fetch: torch-2.13.0-cp312-none-linux_x86_64.whl (HTTP 503)', file=sys.stderr)\n"
        "sys.exit(2)\n"
    )

    class Go(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "Resolved 31 packages" in record.getMessage():
                go.touch()

    logger = log.get("toolchain")
    logger.addHandler(handler := Go())
    try:
        with pytest.raises(WheelhouseError) as info:
            log.run_streamed([sys.executable, "-c", child], "install torch 2.13.0", hint="check the index",
                             logger=logger)
    finally:
        logger.removeHandler(handler)
    assert out.getvalue().splitlines() == [
        "  Resolved 31 packages in 2ms",
        "  streamed",
        "  error: Failed to fetch: torch-2.13.0-cp312-none-linux_x86_64.whl (HTTP 503)",
    ]
    assert str(info.value) == ("could not install torch 2.13.0: error: Failed to fetch: "
                               "torch-2.13.0-cp312-none-linux_x86_64.whl (HTTP 503); check the index")


def test_redrawn_progress_lines_are_thinned_and_the_finished_line_kept(configured):
    out = configured()
    child = (
        "import sys\n"
        "for i in range(0, 100, 5):\n"
        "    sys.stderr.write(f'Receiving objects: {i:3d}% ({i}/100)\\r')\n"
        "sys.stderr.write('Receiving objects: 100% (100/100), done.\\n')\n"
        "sys.stderr.write('fatal: the remote end hung up unexpectedly\\n')\n"
        "sys.exit(128)\n"
    )
    result = log.stream([sys.executable, "-c", child], redraw_every=3600)
    assert out.getvalue().splitlines() == ["  Receiving objects:   0% (0/100)",
                                           "  Receiving objects: 100% (100/100), done.",
                                           "  fatal: the remote end hung up unexpectedly"]
    assert result.returncode == 128 and result.last_line == "fatal: the remote end hung up unexpectedly"
    assert result.tail == ("Receiving objects: 100% (100/100), done.", "fatal: the remote end hung up unexpectedly")


def test_a_command_that_cannot_start_is_one_line():
    with pytest.raises(WheelhouseError, match=r"^could not create the venv: /nonexistent/uv: No such file"):
        log.run_streamed(["/nonexistent/uv", "venv"], "create the venv")


def test_transfer_progress_prints_each_tenth_in_mib(configured):
    out = configured()
    progress = log.TransferProgress()
    total = 5 * log.MIB
    for done in range(0, total + 1, log.MIB // 4):
        progress("upload big.whl", done, total)
    for done in (log.MIB, 2 * log.MIB):  # a retry starts the upload again
        progress("upload big.whl", done, total)
    assert out.getvalue().splitlines() == [
        *(f"upload big.whl: {p}% ({p * 5 / 100:.1f} of 5.0 MiB)" for p in range(0, 101, 10)),
        "upload big.whl: 20% (1.0 of 5.0 MiB)",
        "upload big.whl: 40% (2.0 of 5.0 MiB)",
    ]


def test_transfer_progress_on_a_terminal_is_a_bar():
    screen = io.StringIO()
    progress = log.TransferProgress(bar=True, stream=screen)
    for done in range(0, 3 * log.MIB + 1, log.MIB):
        progress("download art.zip", done, 3 * log.MIB)
    drawn = screen.getvalue()
    assert "download art.zip" in drawn and "100%" in drawn and "3.00M/3.00M" in drawn


def test_a_secret_too_short_to_be_a_token_is_not_masked_everywhere(caplog):
    """The test server's token is `t`: masking it by value turned every t of the output into ***."""
    from ci.store.github_api import GitHubAPI

    caplog.set_level(logging.INFO, logger="wheelhouse")
    line = "renamed wheelhouse_fixture-0.1.0.whl.clobber-711799d7 to wheelhouse_fixture-0.1.0.whl"
    GitHubAPI("owner/repo", token="t").info(line)
    token = "ghp_" + "x" * 36
    GitHubAPI("owner/repo", token=token).info(f"{line} with {token}")
    assert caplog.messages == [line, f"{line} with ***"]
    assert log.mask("a t", "t") == "a t" and log.mask(f"a {'s' * 8}", "s" * 8) == "a ***"
