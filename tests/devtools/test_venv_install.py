"""The venv installer (devtools/venv_install.py): uv with pip's indexes, else pip.

The real install runs at the start of every ``make test`` and CI leg; these tests check what it
hands to uv and that a failing uv falls back to pip with the same packages.
"""

import subprocess
import sys

import pytest
import venv_install as V


def test_pip_s_settings_reach_uv_and_a_missing_local_path_is_skipped(tmp_path, monkeypatch):
    links = tmp_path / "wheels"
    links.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", f"{links} {tmp_path / 'gone'}")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///srv/a/simple https://example.org/simple")
    monkeypatch.setenv("PIP_CONSTRAINT", str(tmp_path / "no-such-constraints.txt"))
    settings = V.pip_settings(sys.executable)
    assert settings["extra-index-url"][-2:] == [
        "file:///srv/a/simple",
        "https://example.org/simple",
    ]
    assert str(links) in settings["find-links"]
    cmd = V.uv_command("uv", "/venv/bin/python", settings, ["-e", ".[test]"])
    assert cmd[:8] == [
        "uv",
        "pip",
        "install",
        "--quiet",
        "--python",
        "/venv/bin/python",
        "--index-strategy",
        "unsafe-best-match",
    ]  # no bytecode: written on first import
    assert cmd[-2:] == ["-e", ".[test]"]
    pairs = list(zip(cmd, cmd[1:]))
    assert ("--extra-index-url", "https://example.org/simple") in pairs and (
        "--find-links",
        str(links),
    ) in pairs
    assert (
        str(tmp_path / "gone") not in cmd
    )  # pip warns and skips a missing local path; uv would stop
    assert str(tmp_path / "no-such-constraints.txt") not in cmd


def _fake_run(calls, uv_ok):
    def run(cmd, **kwargs):
        calls.append(list(cmd))
        failed = cmd[1:3] == ["pip", "install"] and not uv_ok  # "<venv>/bin/uv pip install ..."
        return subprocess.CompletedProcess(cmd, 1 if failed else 0, "", "")

    return run


@pytest.mark.parametrize("uv_ok", [True, False])
def test_uv_installs_and_a_failing_uv_falls_back_to_pip_with_the_same_packages(
    tmp_path, monkeypatch, capsys, uv_ok
):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.touch()
    (python.parent / "uv").touch()
    calls = []
    monkeypatch.setattr(V.subprocess, "run", _fake_run(calls, uv_ok))
    monkeypatch.setattr(V, "pip_settings", lambda _: {"find-links": [str(tmp_path)]})
    assert V.install(str(python), ["-e", ".[test]"]) == ("uv" if uv_ok else "pip")
    assert calls[0] == [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"]
    assert calls[1] == [str(python), "-m", "pip", "install", "--quiet", "uv"]
    assert calls[2][0] == str(python.parent / "uv") and calls[2][-2:] == ["-e", ".[test]"]
    if uv_ok:
        assert len(calls) == 3
    else:
        assert calls[3] == [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "-e",
            ".[test]",
        ]
        assert "failed; installing with pip instead" in capsys.readouterr().err


def test_bad_choices_and_paths_name_the_setting(tmp_path, monkeypatch, capsys):
    with pytest.raises(
        ValueError, match=r"TUTORIAL_INSTALLER='conda' must be one of auto, uv, pip"
    ):
        V.install(sys.executable, ["x"], choice="conda")
    assert V.main([str(tmp_path / "nope" / "python"), "x"]) == 2
    err = capsys.readouterr().err
    assert "VENV_PYTHON=" in err and "does not exist; create the venv first" in err
    assert V.main(["-e"]) == 2


def test_the_install_writes_bytecode_of_the_common_imports_even_where_the_environment_forbids_it(
    tmp_path, monkeypatch
):
    """``warm_bytecode`` imports with writing allowed; ``PYTHONDONTWRITEBYTECODE`` alone would leave
    no .pyc."""
    real = V.WARM_CODE
    # the real list: TE's JAX code is imported after the CPU stand-in is installed (TE alone refuses
    # to import)
    assert real.index("tutorial_utils.te_on_cpu") < real.index("transformer_engine.jax")
    (tmp_path / "warm_me.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    code = "import warm_me"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    assert not (tmp_path / "__pycache__").exists()  # what the environment alone does
    monkeypatch.setattr(V, "WARM_CODE", code)
    assert V.warm_bytecode(sys.executable) == 0
    assert list((tmp_path / "__pycache__").glob("warm_me.*.pyc"))
