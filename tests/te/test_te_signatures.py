"""The facade's public names match TransformerEngine 2.20.2's Python source, read without importing
TE.

The wheel of ``transformer-engine==2.20.2`` is pure Python. It is fetched once with
``pip download --no-deps`` into ``~/.cache/cp-attention-tutorial/`` (or ``$CP_TUTORIAL_CACHE``)
and three files are parsed with :mod:`ast`: ``transformer_engine/jax/attention.py``,
``.../sharding.py`` and ``.../quantize/helper.py``. For every function the parameter names,
order, kinds and defaults must agree; defaults are compared as source text (``ast.unparse`` of
TE's default against the facade's default rendered the same way, e.g. ``CPStrategy.DEFAULT``).
TE's enums take their values from a C extension, so only member names and order are compared.

The tests skip (with the reason) only when the wheel cannot be obtained.
"""

import ast
import dataclasses
import enum
import inspect
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

import tutorial_utils.te as te
from tutorial_utils.te import attention as fa
from tutorial_utils.te import sharding as fs

TE_VERSION = "2.20.2"
WHEEL_GLOB = f"transformer_engine-{TE_VERSION}-*.whl"


def _cache_dir() -> pathlib.Path:
    base = os.environ.get("CP_TUTORIAL_CACHE")
    if base:
        return pathlib.Path(base)
    return (
        pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
        / "cp-attention-tutorial"
    )


def _obtain_wheel():
    cache = _cache_dir()
    found = sorted(cache.glob(WHEEL_GLOB)) if cache.is_dir() else []
    if found:
        return found[0], None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "--retries",
                "1",
                "--timeout",
                "20",
                f"transformer-engine=={TE_VERSION}",
                "-d",
                str(cache),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"pip download failed: {err!r}"
    found = sorted(cache.glob(WHEEL_GLOB))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return (
            None,
            (
                f"pip download transformer-engine=={TE_VERSION} failed (rc={proc.returncode}):"
                f" {' | '.join(tail)}"
            ),
        )
    return found[0], None


@pytest.fixture(scope="module")
def te_source():
    wheel, why = _obtain_wheel()
    if wheel is None:
        pytest.skip(f"cannot obtain the TE {TE_VERSION} wheel (no network?): {why}")
    trees = {}
    with zipfile.ZipFile(wheel) as zf:
        for key, path in (
            ("attention", "transformer_engine/jax/attention.py"),
            ("sharding", "transformer_engine/jax/sharding.py"),
            ("helper", "transformer_engine/jax/quantize/helper.py"),
        ):
            trees[key] = ast.parse(zf.read(path).decode("utf-8"), filename=path)
    return trees


def _top(tree, name, kind):
    for node in tree.body:
        if isinstance(node, kind) and node.name == name:
            return node
    raise AssertionError(f"{name} not found at the top level of TE's source")


def _method(cls_node, name):
    for node in cls_node.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{cls_node.name}.{name} not found in TE's source")


def _te_params(fn: ast.FunctionDef, drop_first=False):
    """[(name, kind, default source or None)] from TE's function definition."""
    a = fn.args
    positional = [(x, inspect.Parameter.POSITIONAL_ONLY) for x in a.posonlyargs] + [
        (x, inspect.Parameter.POSITIONAL_OR_KEYWORD) for x in a.args
    ]
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    params = [(arg.arg, kind, default) for (arg, kind), default in zip(positional, defaults)]
    if a.vararg:
        params.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, None))
    params += [
        (arg.arg, inspect.Parameter.KEYWORD_ONLY, None if d is None else ast.unparse(d))
        for arg, d in zip(a.kwonlyargs, a.kw_defaults)
    ]
    if a.kwarg:
        params.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, None))
    return params[1:] if drop_first else params


def _render(default):
    if default is inspect.Parameter.empty:
        return None
    if isinstance(default, enum.Enum):
        return f"{type(default).__name__}.{default.name}"
    return repr(default)


def _facade_params(fn):
    return [(p.name, p.kind, _render(p.default)) for p in inspect.signature(fn).parameters.values()]


def _assert_same(facade, te_params, what):
    got = _facade_params(facade)
    assert [p[0] for p in got] == [p[0] for p in te_params], f"{what}: parameter names/order differ"
    for (name, kind, default), (_, te_kind, te_default) in zip(got, te_params):
        assert kind == te_kind, f"{what}({name}): kind {kind} != TE's {te_kind}"
        assert default == te_default, f"{what}({name}): default {default} != TE's {te_default}"


FUNCTIONS = [
    "fused_attn",
    "reorder_causal_load_balancing",
    "inverse_reorder_causal_load_balancing",
    "is_fused_attn_kernel_available",
]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_signatures(te_source, name):
    _assert_same(
        getattr(fa, name), _te_params(_top(te_source["attention"], name, ast.FunctionDef)), name
    )


@pytest.mark.parametrize(
    "name", ["from_seqlens", "from_seqlens_and_offsets", "from_segment_ids_and_pos", "__init__"]
)
def test_sequence_descriptor_constructors(te_source, name):
    cls = _top(te_source["attention"], "SequenceDescriptor", ast.ClassDef)
    node = _method(cls, name)
    if name != "__init__":
        assert any(ast.unparse(d) == "classmethod" for d in node.decorator_list)
        assert isinstance(inspect.getattr_static(fa.SequenceDescriptor, name), classmethod)
        facade = getattr(fa.SequenceDescriptor, name)  # bound: cls dropped, as in TE's drop_first
    else:
        facade = fa.SequenceDescriptor
    _assert_same(facade, _te_params(node, drop_first=True), f"SequenceDescriptor.{name}")


ENUMS = [
    "AttnBiasType",
    "AttnMaskType",
    "AttnSoftmaxType",
    "QKVLayout",
    "QKVFormat",
    "CPStrategy",
    "ReorderStrategy",
]


def _enum_members(cls_node):
    names = []
    for node in cls_node.body:
        if isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


@pytest.mark.parametrize("name", ENUMS)
def test_enum_member_names_and_order(te_source, name):
    node = _top(te_source["attention"], name, ast.ClassDef)
    assert [ast.unparse(b) for b in node.bases] == ["Enum"]
    facade = getattr(fa, name)
    assert issubclass(facade, enum.Enum)
    assert list(facade.__members__) == _enum_members(node)
    te_methods = {
        n.name for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    }
    missing = {m for m in te_methods if not hasattr(facade, m)}
    assert not missing, f"{name} lacks TE's methods {sorted(missing)}"


def test_mesh_resource_fields(te_source):
    node = _top(te_source["sharding"], "MeshResource", ast.ClassDef)
    assert any(ast.unparse(d) == "dataclass" for d in node.decorator_list)
    te_fields = [
        (n.target.id, None if n.value is None else ast.unparse(n.value))
        for n in node.body
        if isinstance(n, ast.AnnAssign)
    ]
    ours = [(f.name, repr(f.default)) for f in dataclasses.fields(fs.MeshResource)]
    assert ours == te_fields
    assert te.MeshResource is fs.MeshResource


def test_autocast_signature(te_source):
    node = _top(te_source["helper"], "autocast", ast.FunctionDef)
    assert any(ast.unparse(d) == "contextmanager" for d in node.decorator_list)
    _assert_same(te.autocast, _te_params(node), "autocast")


def test_public_names_exist(te_source):
    for name in FUNCTIONS + ENUMS + ["SequenceDescriptor"]:
        _top(te_source["attention"], name, (ast.FunctionDef, ast.ClassDef))  # in TE
        assert name in fa.__all__ and hasattr(fa, name)  # and in the facade


def _run_with_te_on_path(tmp_path, backend: str):
    wheel, why = _obtain_wheel()
    if wheel is None:
        pytest.skip(f"cannot obtain the TE {TE_VERSION} wheel (no network?): {why}")
    site = tmp_path / "te-site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "TUTORIAL_TE_BACKEND"}
    env.update(PYTHONPATH=str(site), TUTORIAL_TE_BACKEND=backend, JAX_PLATFORMS="cpu")
    code = "import tutorial_utils.te as te; print(te.backend_name())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_installed_te_without_its_extension_falls_back_or_explains(tmp_path):
    """The pip package without a built JAX extension (as on a machine without CUDA)."""
    auto = _run_with_te_on_path(tmp_path, "auto")  # no GPU here: TE's JAX code with the CPU kernel
    assert auto.returncode == 0, auto.stderr
    assert (
        auto.stdout.strip()
        == f"TransformerEngine {TE_VERSION} (its JAX code; CPU reference kernel in place of cuDNN)"
    )
    forced = _run_with_te_on_path(tmp_path, "te")
    assert forced.returncode != 0
    assert "TUTORIAL_TE_BACKEND=te" in forced.stderr and "make gpu-setup" in forced.stderr, (
        forced.stderr[-2000:]
    )
