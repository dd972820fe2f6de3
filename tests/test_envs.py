"""The set-up's lock (envs/requirements.lock) and its install (envs/install.py: by uv, else by pip processes at once)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ENVS = Path(__file__).resolve().parents[1] / "envs"
spec = importlib.util.spec_from_file_location("envs_install", ENVS / "install.py")
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)
Q = "install --quiet --no-compile"   # what install.py adds to the pip command it is given


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==([^\s#]+)", line)
        if match:
            found[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return found


def test_the_lock_pins_every_requirement_at_its_version() -> None:
    wanted, locked = pins(ENVS / "requirements.txt"), pins(ENVS / "requirements.lock")
    assert {name: locked.get(name) for name in wanted} == wanted
    assert len(locked) > len(wanted)  # their dependencies too
    assert "hotcold" not in locked and not any("+" in v for v in locked.values())
    assert "pip" in locked  # a venv made without pip gets it from the lock (make setup)


def test_every_lock_line_is_read_and_the_largest_starts_first() -> None:
    lock = install.read_lock(str(ENVS / "requirements.lock"))
    assert len(lock) == len(pins(ENVS / "requirements.lock"))
    assert lock[0][0].startswith("torch==") and lock[0][1] == max(mb for _, mb in lock)


def test_packages_go_to_the_group_with_the_least_work() -> None:
    lock = [("a==1", 100.0), ("b==1", 10.0), ("c==1", 50.0), ("d==1", 0.0), ("e==1", 30.0)]
    # with 20 MB a package: a to 0 (120), c to 1 (70), e to 1 (120), b to 0 (a tie: the first; 130), d to 1 (140)
    by_hand = {"a==1": 0, "c==1": 1, "e==1": 1, "b==1": 0, "d==1": 1}
    groups = install.spread(lock, 2)
    assert {pin: g for g, group in enumerate(groups) for pin in group} == by_hand
    assert install.spread(lock, 1) == [["a==1", "c==1", "e==1", "b==1", "d==1"]]
    assert install.spread(lock[:1], 4) == [["a==1"]]  # no empty group, no pip run for nothing


def test_a_bad_lock_line_is_named_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.lock").write_text("# header\ntorch>=2.4\n")
    proc = subprocess.run([sys.executable, str(ENVS / "install.py"), "lock", str(tmp_path / "bad.lock"), "--", "true"],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"{tmp_path / 'bad.lock'}:2: not 'name==version  # size MB installed': "
                                                "'torch>=2.4'"]


@pytest.mark.parametrize("fails", [False, True])
def test_every_group_is_installed_and_a_failed_one_fails_the_set_up(tmp_path: Path, fails: bool) -> None:
    (tmp_path / "ok.lock").write_text("a==1  # 5.0 MB installed\nb==2  # 1.0 MB installed\nc==3\n")
    pip = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + '\\n'); "
           f"sys.exit({int(fails)} if 'b==2' in sys.argv else 0)", str(tmp_path / "calls")]
    proc = subprocess.run([sys.executable, str(ENVS / "install.py"), "lock", str(tmp_path / "ok.lock"), "--jobs", "2", "--",
                           *pip], capture_output=True, text=True)
    calls = sorted((tmp_path / "calls").read_text().splitlines())
    assert calls == [f"{Q} --no-deps a==1", f"{Q} --no-deps b==2 c==3"]
    assert proc.returncode == int(fails)
    if fails:
        assert "pip failed for 1 of 2 groups" in proc.stderr


def test_a_package_the_environment_has_at_another_version_is_replaced_first_alone(tmp_path: Path) -> None:
    """A new environment's own setuptools: replacing it beside another pip process showed that one a
    half-removed package."""
    (tmp_path / "ok.lock").write_text(f"pytest==0.1  # 1.0 MB installed\na==1  # 5.0 MB installed\n"
                                      f"pluggy=={version('pluggy')}  # 1.0 MB installed\n")
    pip = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + '\\n')",
           str(tmp_path / "calls")]
    proc = subprocess.run([sys.executable, str(ENVS / "install.py"), "lock", str(tmp_path / "ok.lock"), "--jobs", "2", "--",
                           *pip], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == f"{Q} --no-deps pytest==0.1"  # the same version of pluggy is no replacement: it goes in a group
    assert sorted(calls[1:]) == [f"{Q} --no-deps a==1", f"{Q} --no-deps pluggy=={version('pluggy')}"]


def fake_pip(tmp_path: Path, config: str = "", fails_for: str = "") -> list[str]:
    """A pip command that appends its arguments to ``calls``, prints ``config`` for ``config list`` and fails
    for an argument ``fails_for``."""
    (tmp_path / "config.txt").write_text(config)
    return [sys.executable, "-c", "import sys; a = sys.argv[3:]; open(sys.argv[1], 'a').write(' '.join(a) + '\\n'); "
            "print(open(sys.argv[2]).read() if a[:2] == ['config', 'list'] else '', end=''); "
            f"sys.exit({fails_for!r} in a and {fails_for!r} != '')", str(tmp_path / "calls"), str(tmp_path / "config.txt")]


def test_uv_is_told_pips_indexes_links_constraints_and_certificate(tmp_path: Path) -> None:
    config = ("global.extra-index-url='https://a.example/simple https://b.example/simple'\n"
              "global.find-links='/from/file'\n:env:.find-links='/from/env'\ninstall.index-url='https://i.example'\n"
              "global.index-url='https://ignored.example'\nglobal.constraint='c.txt'\nglobal.cert='ca.pem'\n"
              "global.timeout='60'\n")
    settings = install.pip_settings(fake_pip(tmp_path, config))
    assert settings["find-links"] == "/from/env" and settings["index-url"] == "https://i.example"   # env, install
    args, env = install.uv_options(settings)
    assert args == ["--index-strategy", "unsafe-best-match", "--index-url", "https://i.example",
                    "--extra-index-url", "https://a.example/simple", "--extra-index-url", "https://b.example/simple",
                    "--find-links", "/from/env", "--constraint", "c.txt"]
    assert env == {"SSL_CERT_FILE": "ca.pem"}
    assert install.uv_options({}) == (["--index-strategy", "unsafe-best-match"], {})


def test_pips_settings_are_read_once_per_environment(tmp_path: Path) -> None:
    """The lock's install reads them (``pip config list``); each later install into the environment reuses them."""
    venv = tmp_path / "venv"
    venv.mkdir()
    first = install.uv_settings(venv, fake_pip(tmp_path, "global.find-links='/wheels'\n"))
    assert first == (["--index-strategy", "unsafe-best-match", "--find-links", "/wheels"], {})
    assert (tmp_path / "calls").read_text().splitlines() == ["config list"]
    assert install.uv_settings(venv, fake_pip(tmp_path, "global.find-links='/elsewhere'\n")) == first
    assert (tmp_path / "calls").read_text().splitlines() == ["config list"]   # not asked again


def test_where_uv_does_not_install_pip_installs_the_lock(tmp_path: Path) -> None:
    (tmp_path / "ok.lock").write_text("a==1  # 5.0 MB installed\nb==2  # 1.0 MB installed\n")
    pip = fake_pip(tmp_path, fails_for="uv==9.9")
    proc = subprocess.run([sys.executable, str(ENVS / "install.py"), "lock", str(tmp_path / "ok.lock"), "--jobs",
                           "2", "--uv", "uv==9.9", "--venv", str(tmp_path / "venv"), "--", *pip],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == f"install: uv==9.9 did not install; pip installs {tmp_path / 'ok.lock'}"
    calls = [c for c in (tmp_path / "calls").read_text().splitlines() if c != "config list"]  # read meanwhile
    assert calls[0] == f"{Q} --no-deps uv==9.9"
    assert sorted(calls[1:]) == [f"{Q} --no-deps a==1", f"{Q} --no-deps b==2"]
