"""scripts/setup.sh on a machine it has set up already: what it checks, asks for, and prints.

Each test runs the real script in a copy of the repository's setup files, against this machine's real
package database (dpkg), with `apt-get` and `sudo` replaced by recorders: whatever the script would
install shows up in the record. The venv is a stand-in already stamped as installed, so the Python
part is checked but never re-run.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REQUIRED = ("tesseract-ocr", "tesseract-ocr-eng")


def _installed(package: str) -> bool:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${db:Status-Abbrev}", package], capture_output=True, text=True
    )
    return done.stdout.strip() == "ii"


pytestmark = pytest.mark.skipif(
    shutil.which("dpkg-query") is None or not all(map(_installed, REQUIRED)),
    reason="needs a Debian machine that scripts/setup.sh has set up",
)

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "{record}"
exit 1
"""
# dpkg-query as on this machine, except that the packages in $HIDE are reported as not installed.
DPKG_HIDING = """#!/bin/bash
/usr/bin/dpkg-query "$@" | while read -r name rest; do
  case " $HIDE " in *" $name "*) echo "$name un " ;; *) echo "$name $rest" ;; esac
done
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def checkout() -> Iterator[Path]:
    """setup.sh and pyproject.toml in a folder anyone may use, with a stamped venv and recorders."""
    root = Path(tempfile.mkdtemp(prefix="vision-rag-setup-"))
    root.chmod(0o755)
    (root / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    _executable(venv_bin / "python", "#!/bin/sh\nexit 0\n")  # never run: the stamp says installed
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    (root / ".venv" / ".vision_rag_installed").write_text(digest + "\n")
    tools = root / "tools"
    tools.mkdir()
    record = root / "record.log"
    record.touch()
    record.chmod(0o666)
    for name in ("apt-get", "sudo"):
        _executable(tools / name, RECORDER.format(record=record))
    _executable(tools / "dpkg-query", DPKG_HIDING)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run_setup(root: Path, *, hide: str = "", user: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{root / 'tools'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(root),
        "HIDE": hide,
        "LANG": "C.UTF-8",
    }
    command = ["bash", str(root / "scripts" / "setup.sh")]
    if user:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    return subprocess.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)


def test_a_re_run_installs_nothing_prints_nothing_and_takes_seconds(checkout: Path):
    # Seven runs: the fonts check that misread itself (`fc-list | grep -q` under pipefail) did so
    # in about two runs of three.
    for _ in range(7):
        started = time.monotonic()
        done = run_setup(checkout)
        assert time.monotonic() - started < 15
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert (checkout / "record.log").read_text() == ""


@pytest.fixture
def nobody() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the script as another user")
    return str(pwd.getpwnam("nobody").pw_uid)


def test_without_root_or_sudo_it_prints_the_one_root_command_and_goes_on(checkout: Path, nobody: str):
    (checkout / "tools" / "sudo").unlink()  # no sudo at all
    done = run_setup(checkout, hide="fonts-noto-cjk tesseract-ocr-rus", user=nobody)

    assert done.returncode == 0, done.stderr
    command = [line.strip() for line in done.stderr.splitlines() if "apt-get install" in line]
    assert command == [
        "apt-get update && apt-get install -y --no-install-recommends tesseract-ocr-rus fonts-noto-cjk"
    ]
    assert (checkout / "record.log").read_text() == ""  # nothing was attempted


def test_without_root_and_without_tesseract_it_says_so_and_fails(checkout: Path, nobody: str):
    (checkout / "tools" / "sudo").unlink()
    done = run_setup(checkout, hide="tesseract-ocr", user=nobody)

    assert done.returncode == 1
    assert "apt-get update && apt-get install -y --no-install-recommends tesseract-ocr\n" in done.stderr
    assert "ingest needs tesseract-ocr" in done.stderr


def test_as_root_it_installs_what_is_missing(checkout: Path):
    if os.geteuid() != 0:
        pytest.skip("runs as root")
    done = run_setup(checkout, hide="chromium")
    assert "setup: installing chromium" in done.stderr
    assert (checkout / "record.log").read_text().splitlines()[0] == "apt-get update -qq"
