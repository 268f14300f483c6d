"""scripts/apt-install.sh waits for apt's locks instead of failing at once."""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "apt-install.sh"


def fake_apt(tmp_path: Path, failures: int) -> dict[str, str]:
    """A PATH where dpkg-query knows no package and apt-get fails ``failures`` times with
    apt's lock message before it succeeds; each call is appended to ``calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "apt-get").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path}/calls\n'
        f"n=$(wc -l < {tmp_path}/calls)\n"
        f'if [ "$n" -le {failures} ]; then\n'
        '  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1"\n'
        "  exit 100\n"
        "fi\n"
    )
    for tool in ("dpkg-query", "apt-get"):
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KVSERVE_APT_LOCK_POLL": "0"}


def test_a_held_lock_is_waited_for_then_the_install_runs(tmp_path):
    env = fake_apt(tmp_path, failures=2)
    subprocess.run([SCRIPT, "pkg-a", "pkg-b"], env=env, check=True, capture_output=True)
    assert (tmp_path / "calls").read_text().splitlines() == [
        "update -qq",
        "update -qq",
        "update -qq",
        "install -y -qq pkg-a pkg-b",
    ]


def test_the_wait_is_bounded(tmp_path):
    env = {**fake_apt(tmp_path, failures=10**6), "KVSERVE_APT_LOCK_WAIT": "0"}
    done = subprocess.run([SCRIPT, "pkg-a"], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "Could not get lock" in done.stderr
    assert "apt-get update failed" in done.stderr


def test_other_apt_errors_fail_at_once(tmp_path):
    env = fake_apt(tmp_path, failures=0)
    (tmp_path / "bin" / "apt-get").write_text(
        "#!/bin/sh\necho 'E: Unable to locate package'\nexit 100\n"
    )
    done = subprocess.run([SCRIPT, "nope"], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "Unable to locate package" in done.stderr
