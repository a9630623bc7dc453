"""The run ledger (devtools/run_ledger.py): a hooked interpreter records its CPU and its XLA
compiles.

The hook goes into a temporary site folder, which a fresh interpreter adds with
``site.addsitedir`` (that is how Python reads a venv's ``.pth`` files), so nothing is written to
the suite's own venv. One subprocess compiles a jitted function twice over a fresh compilation
cache: the first process misses and writes, the second hits. Without the variable the hook
records nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import run_ledger

PROGRAM = (
    "import site, sys; site.addsitedir(sys.argv[1]); "
    "import compile_cache; compile_cache.enable(sys.argv[2]); "
    "import jax, jax.numpy as jnp; print(jax.jit(lambda x: x * 3 + 1)(jnp.arange(5.0)).sum())"
)


def _run(site_dir, cache, ledger=None):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (run_ledger.ENV, "TUTORIAL_COMPILE_CACHE_DIR")
    }
    if ledger:
        env[run_ledger.ENV] = str(ledger)
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(site_dir), str(cache)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "35.0"


def test_a_hooked_process_records_its_cpu_compiles_and_cache_hits(tmp_path):
    site_dir, cache, ledger = tmp_path / "site", tmp_path / "cache", tmp_path / "ledger.jsonl"
    site_dir.mkdir()
    pth = run_ledger.install(str(site_dir))
    assert pth.name == run_ledger.PTH_NAME and run_ledger.ENV in pth.read_text()

    _run(site_dir, cache)  # no variable: nothing is recorded
    assert not ledger.exists()
    _run(site_dir, cache / "a", ledger)  # misses, compiles and writes
    first = run_ledger.summarize(run_ledger.read(ledger))
    _run(site_dir, cache / "a", ledger)  # the same program: read back from the cache
    both = run_ledger.summarize(run_ledger.read(ledger))

    assert first["processes"] == 1 and first["cpu_s"] > 0 and not first["hook_missing"]
    assert (
        first["compiles"] >= 1
        and first["cache_hits"] == 0
        and first["cache_misses"] == first["compiles"]
    )
    assert (
        both["processes"] == 2 and both["compiles"] == first["compiles"]
    )  # nothing compiled the second time
    assert both["cache_hits"] == first["cache_misses"]
    assert both["keys_missed_more_than_once"] == 0
    rows = run_ledger.read(ledger)
    assert any(r["k"] == "request" and r["name"] == "jit__lambda" for r in rows)
    text = run_ledger.format_summary(both)
    assert "2 processes" in text and f"{both['cache_hits']} hits" in text
    assert json.loads(json.dumps(both)) == both

    assert run_ledger.uninstall(str(site_dir)) and not pth.exists()
    assert not run_ledger.uninstall(str(site_dir))


def test_two_site_folders_with_the_hook_record_a_process_once(tmp_path):
    """Under ``make test-ledger`` the venv has the line and so does the test's own folder: one
    record, not two."""
    sites = [tmp_path / "venv-site", tmp_path / "test-site"]
    for site_dir in sites:
        site_dir.mkdir()
        run_ledger.install(str(site_dir))
    ledger = tmp_path / "ledger.jsonl"
    program = "import site, sys; [site.addsitedir(d) for d in sys.argv[1:]]"
    subprocess.run(
        [sys.executable, "-c", program, *map(str, sites)],
        check=True,
        timeout=60,
        env={**os.environ, run_ledger.ENV: str(ledger)},
    )
    assert [r["k"] for r in run_ledger.read(ledger)] == ["proc"]


def test_a_cache_that_is_missed_twice_is_counted(tmp_path):
    rows = [
        {"k": "read", "pid": 1, "s": 0.0, "key": "k1", "hit": False},
        {"k": "read", "pid": 2, "s": 0.0, "key": "k1", "hit": False},
        {"k": "read", "pid": 2, "s": 0.0, "key": "k2", "hit": False},
    ]
    assert run_ledger.summarize(rows)["keys_missed_more_than_once"] == 1


def test_bad_input_names_the_parameter(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--site-dir='.*nowhere' is not a folder"):
        run_ledger.install(str(tmp_path / "nowhere"))
    assert run_ledger.main(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "ledger=" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"k": "proc"}\nnot json\n')
    with pytest.raises(ValueError, match=r"line 2 is not JSON"):
        run_ledger.read(bad)
