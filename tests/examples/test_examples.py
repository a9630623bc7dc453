"""The standalone recipes (examples/) and the runner that executes unmodified TE scripts on CPU.

Every recipe runs as a subprocess through ``python -m tutorial_utils.te_on_cpu``: TE's own
JAX code, the stand-in kernel, N simulated devices. Each recipe checks itself against one device
and exits non-zero when it disagrees, so a zero exit status plus its printed line is the check.
The runner's refusals (fp32 like cuDNN, a C function the stand-in lacks, PyTorch) are run too, and
a script that follows TE's published CP tutorial (read from ../shared/seeds at test time, shrunk
to CPU sizes, TE's imports unchanged) runs through it.

Cost (this 2-core machine, shared): each recipe is one interpreter start plus two or three
compiles, 15-30 s of CPU; the multi-process recipe starts five interpreters.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest
from helpers import run_script
from recipe_runs import ELSEWHERE, ON_THE_RECIPES_PAGE, check_result_lines
from seed_script import seed_program

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RECIPES = sorted(p.name for p in EXAMPLES.glob("*.py"))
ALLOWED_IMPORTS = {"jax", "numpy", "transformer_engine", "flax", "optax"}
# the runner's banner: three lines of at most 88 characters (a page shows them unscrolled)
BANNER_SCRIPT = re.compile(r"^te_on_cpu: (\S+)$")
BANNER = re.compile(
    r"^te_on_cpu: it runs TransformerEngine 2\.20\.2 on (\d+) simulated CPU devices?$"
)
BANNER_NOTE = (
    " (its JAX code; CPU reference kernel in place of cuDNN; CPU numbers are not GPU numbers)"
)


def _ok(proc, devices):
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    lines = proc.stdout.splitlines()
    assert BANNER_SCRIPT.match(lines[0]), lines[0]
    banner = BANNER.match(lines[1])
    assert banner and int(banner.group(1)) == devices, lines[1]
    assert sum(bool(BANNER.match(line)) for line in lines) == 1, "exactly one banner"
    assert lines[2] == BANNER_NOTE, lines[2]
    assert all(len(line) <= 88 for line in lines[1:3]), lines[1:3]  # the path is the reader's
    return lines[3:]


# ----------------------------------------------------------------------------- the recipes are copy


def test_recipes_are_few_short_and_import_only_jax_numpy_te_flax_optax():
    assert 5 <= len(RECIPES) <= 9, RECIPES
    stdlib = set(sys.stdlib_module_names)
    for name in RECIPES:
        source = (EXAMPLES / name).read_text()
        # as ruff formats them at 88 columns (examples/ruff.toml; make lint)
        assert len(source.splitlines()) <= 180, f"{name}: {len(source.splitlines())} lines"
        assert ast.get_docstring(ast.parse(source)), f"{name} says what it shows"
        for node in ast.walk(ast.parse(source)):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for mod in mods:
                top = mod.split(".")[0]
                assert top in ALLOWED_IMPORTS or top in stdlib, f"{name} imports {mod}"
                assert top != "tutorial_utils"


# ----------------------------------------------------------------------------- every recipe through

# The four-device runs of the recipes on the Recipes page are checked on the site build's executed
# page (tests/site/test_site.py, tests/recipe_runs.py): the build already runs each recipe that
# way, as a subprocess through the runner. The rest (other device counts, and recipes the site shows
# without running, such as flax_nnx.py on 4) run here.
RUNS = ELSEWHERE


@pytest.mark.parametrize(
    "recipe, devices, says",
    RUNS,
    ids=lambda x: str(x) if not isinstance(x, str) or x.endswith(".py") else None,
)
def test_recipe_runs_standalone_and_matches_one_device(recipe, devices, says):
    assert recipe in RECIPES
    check_result_lines(_ok(run_script(EXAMPLES / recipe, devices), devices), says)


def test_every_recipe_is_run_somewhere():
    ran = {r for r, _, _ in ON_THE_RECIPES_PAGE + ELSEWHERE}
    assert ran == set(RECIPES), set(RECIPES) ^ ran
    page = (ROOT / "docs" / "recipes.md").read_text()
    for recipe, devices, _ in ON_THE_RECIPES_PAGE:
        call = f'run("{recipe}")' if devices == 4 else f'run("{recipe}", devices={devices})'
        assert call in page, f"docs/recipes.md no longer runs {recipe} on {devices} devices"


# ----------------------------------------------------------------------------- the runner's refusal


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(body)
    return path


def test_runner_gives_tes_fp32_refusal_and_names_missing_c_functions(tmp_path, monkeypatch):
    fp32 = _script(
        tmp_path,
        "fp32.py",
        """
import jax.numpy as jnp
from transformer_engine.jax.attention import (AttnBiasType, AttnMaskType, AttnSoftmaxType,
    QKVLayout, fused_attn)
q = jnp.ones((1, 8, 1, 8), jnp.float32)
fused_attn((q, q, q), None, None, None, AttnBiasType.NO_BIAS, AttnMaskType.CAUSAL_MASK,
QKVLayout.BSHD_BSHD_BSHD,
           AttnSoftmaxType.VANILLA_SOFTMAX, 1.0, 0.0, False)
""",
    )
    proc = run_script(fp32, 1)
    assert proc.returncode != 0 and BANNER.match(proc.stdout.splitlines()[1])
    assert "ValueError: Unsupported backend: qkv dtype kFloat32" in proc.stderr, proc.stderr[-2000:]
    assert "cast q/k/v with .astype(jnp.bfloat16)" in proc.stderr
    norm = _script(
        tmp_path,
        "norm.py",
        """
import jax, jax.numpy as jnp
from transformer_engine.jax.flax import LayerNorm
x = jnp.ones((2, 8, 16), jnp.bfloat16)
LayerNorm().init(jax.random.PRNGKey(0), x)
""",
    )
    # TE's LayerNorm runs as TE's pure JAX under the runner; a user's switch that turns its
    # custom call on is kept, noted on stderr, and the C function it needs is named
    monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "NormFwdPrimitive=true")
    proc = run_script(norm, 1)
    assert proc.returncode != 0
    assert "te_on_cpu: note: your NVTE_JAX_CUSTOM_CALLS='NormFwdPrimitive=true'" in proc.stderr
    assert (
        "transformer_engine_jax.get_norm_fwd_workspace_sizes is not implemented by the CPU stand-in"
        in proc.stderr
    )


def test_runner_refuses_torch_clearly_and_passes_args_and_exit_status(tmp_path):
    # a library's probe (importlib.util.find_spec, as JAX's compilation cache does via etils) is not
    # refused
    probe = (
        "import importlib.util\n"
        "importlib.util.find_spec('tensorflow')\nimportlib.util.find_spec('torch')\n"
    )
    proc = run_script(_script(tmp_path, "uses_torch.py", probe + "import torch\n"), 2)
    assert proc.returncode == 2 and BANNER.match(proc.stdout.splitlines()[1])
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], "one line, no traceback"
    assert "`import torch`" in proc.stderr and "transformer_engine.jax" in proc.stderr
    echo = _script(
        tmp_path,
        "echo.py",
        "import sys, jax\nprint(sys.argv[1:], jax.device_count(), __name__)\n"
        "sys.exit(int(sys.argv[-1]))\n",
    )
    proc = run_script(echo, 3, "--flag", "7")
    assert proc.returncode == 7 and proc.stdout.splitlines()[3] == "['--flag', '7'] 3 __main__"
    proc = run_script(tmp_path / "missing.py", 2)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


# ----------------------------------------------------------------------------- TE's published tutor


def test_published_tutorial_script_runs_through_the_runner(tmp_path):
    # TE's imports unchanged; the script checks Ring and AllGather against one device itself
    code = seed_program(
        batch=2, seq_len=512, heads=4, kv_heads=2, head_dim=16, window=64, stripe=8,
        self_check_tol=0.05,
    )  # fmt: skip
    out = _ok(run_script(_script(tmp_path, "te_cp_tutorial.py", code), 4), 4)
    assert any(line.startswith("seed RING stripe 1:") for line in out), out
    assert any(line.startswith("seed ALL_GATHER stripe 8:") for line in out), out


def test_the_changes_to_your_model_are_lines_of_a_recipe_that_runs():
    """Every line of the Recipes page's diff is a line of examples/ (which the tests run)."""
    page = (ROOT / "docs" / "recipes.md").read_text()
    diff = page.split("```diff\n", 1)[1].split("```", 1)[0].splitlines()
    body = [line[1:].strip() for line in diff if line[:1] in "+ " and line[1:].strip()]
    added = [line for line in diff if line.startswith("+")]
    assert 20 <= len(diff) <= 30 and len(added) >= 10, len(diff)
    recipe_lines = {ln.strip() for p in EXAMPLES.glob("*.py") for ln in p.read_text().splitlines()}
    missing = [line for line in body if line not in recipe_lines]
    assert not missing, missing
