"""Bad input gets a clear error that names the parameter (table-driven).

Each row calls one public entry point with one bad value and asserts the exception type and
a message that names the parameter (and, where there is one, the value). Rows that run a CLI
check that the error comes *before* any work, so no result is lost.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from tutorial_utils import te_on_cpu
from tutorial_utils.cli import gpu_setup
from tutorial_utils.cli.argtypes import output_file, record_file
from tutorial_utils.context_parallel import context_parallel_attention
from tutorial_utils.inputs import pack_segments, random_qkv
from tutorial_utils.pages.runtime import setup_devices
from tutorial_utils.perfmodel.records import write_record
from tutorial_utils.perfmodel.workload import (
    fit_cp_to_devices,
    get_workload,
    preset_from_env,
)
from tutorial_utils.reference import MaskSpec, blockwise_attention, dense_attention
from tutorial_utils.reorder import ReorderStrategy, reorder_causal_load_balancing
from tutorial_utils.te import (
    attention as ref_api,  # the reference facade (conftest pins the backend)
)
from tutorial_utils.validation import check_window, validate_packed_inputs

IDS = np.ones((1, 8), np.int32)
POS = np.arange(8, dtype=np.int32)[None]
X = jnp.zeros((1, 8, 2, 4))
KV = jnp.zeros((1, 8, 1, 4))


def _validate(**kw):
    return validate_packed_inputs(
        kw.pop("ids", IDS), kw.pop("pos", POS), **{"max_segments_per_seq": 1, **kw}
    )


def _cp(**kw):
    mesh = Mesh(np.array(jax.devices()[:1]), ("cp",))
    return context_parallel_attention(
        X, KV, KV, jnp.asarray(IDS), jnp.asarray(POS), mesh=mesh, **kw
    )


def _reorder(**kw):
    args = dict(
        tensor=jnp.zeros((1, 16)),
        strategy=ReorderStrategy.Striped,
        cp_size=4,
        seq_dim=1,
        stripe_size=1,
    )
    args.update(kw)
    return reorder_causal_load_balancing(**args)


def _fused(qkv=None, desc=None, bias=None, **kw):
    args = dict(
        attn_bias_type=ref_api.AttnBiasType.NO_BIAS,
        attn_mask_type=ref_api.AttnMaskType.PADDING_CAUSAL_MASK,
        qkv_layout=ref_api.QKVLayout.THD_THD_THD,
        softmax_type=ref_api.AttnSoftmaxType.VANILLA_SOFTMAX,
        scaling_factor=0.5,
        dropout_probability=0.0,
        is_training=False,
    )
    args.update(kw)
    desc = (
        desc
        if desc is not None
        else ref_api.SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(IDS), jnp.asarray(POS))
    )
    return ref_api.fused_attn(qkv or (X, KV, KV), bias, desc, None, **args)


def _offsets(lens, offs):
    return ref_api.SequenceDescriptor.from_seqlens_and_offsets(jnp.asarray(lens), jnp.asarray(offs))


def _plan(**kw):
    from tutorial_utils.cli.plan import plan

    return plan(get_workload("seed").replace(**kw))


def _env(name, value, fn):
    def run():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old

    return run


def _te_cpu_fp32():
    # before TE is imported: TE's own import refuses a machine without its extension
    te_on_cpu.install()
    from transformer_engine.jax import attention as A

    def call(
        q, kv, ids, pos
    ):  # under jit: TE traces and refuses; nothing is dispatched op by op first
        return A.fused_attn(
            (q, kv, kv),
            None,
            A.SequenceDescriptor.from_segment_ids_and_pos(ids, pos),
            None,
            A.AttnBiasType.NO_BIAS,
            A.AttnMaskType.PADDING_CAUSAL_MASK,
            A.QKVLayout.THD_THD_THD,
            A.AttnSoftmaxType.VANILLA_SOFTMAX,
            0.5,
            0.0,
            False,
        )

    return jax.jit(call)(X, KV, jnp.asarray(IDS), jnp.asarray(POS))


def _backend_choice():
    from tutorial_utils.te import _backend

    return _backend._decide()


# (name, call, exception, pattern the message must contain)
CASES = [
    # validator
    (
        "validator cp_size 0",
        lambda: _validate(cp_size=0),
        ValueError,
        r"cp_size=0 must be a positive int",
    ),
    (
        "validator cp_size -4",
        lambda: _validate(cp_size=-4),
        ValueError,
        r"cp_size=-4 must be a positive int",
    ),
    (
        "validator num_kv_heads 0",
        lambda: _validate(cp_size=2, strategy="ulysses", num_q_heads=4, num_kv_heads=0),
        ValueError,
        r"num_kv_heads=0 must be a positive int",
    ),
    (
        "validator max_segments 0",
        lambda: _validate(max_segments_per_seq=0),
        ValueError,
        r"max_segments_per_seq",
    ),
    (
        "validator negative id",
        lambda: _validate(ids=np.array([[1, 1, -1, 0]]), pos=np.arange(4)[None]),
        ValueError,
        r"segment_ids\[0, 2\]=-1",
    ),
    (
        "validator 1-D ids",
        lambda: _validate(ids=IDS[0], pos=POS[0]),
        ValueError,
        r"segment_ids must be 2-D",
    ),
    (
        "validator float ids",
        lambda: _validate(ids=IDS.astype(np.float32)),
        ValueError,
        r"segment_ids/segment_pos must be",
    ),
    (
        "validator pos shape",
        lambda: _validate(pos=POS[:, :4]),
        ValueError,
        r"segment_pos has shape \(1, 4\)",
    ),
    ("validator stripe 0", lambda: _validate(stripe_size=0), ValueError, r"stripe_size=0"),
    (
        "validator strategy",
        lambda: _validate(strategy="mesh"),
        ValueError,
        r"strategy='mesh' is unknown",
    ),
    (
        "validator window",
        lambda: _validate(window_size=(-3, 0)),
        ValueError,
        r"window_size=\(-3, 0\)",
    ),
    (
        "validator seq not divisible",
        lambda: _validate(cp_size=3),
        ValueError,
        r"segment_ids.shape\[1\]=8",
    ),
    (
        "validator split segment",
        lambda: _validate(ids=np.array([[1, 1, 0, 1]]), pos=np.array([[0, 1, 0, 2]])),
        ValueError,
        r"segment 1 is not contiguous",
    ),
    (
        "validator ids above max",
        lambda: _validate(
            ids=np.array([[1, 2, 3, 0]]), pos=np.array([[0, 0, 0, 1]]), max_segments_per_seq=2
        ),
        ValueError,
        r"max_segments_per_seq=2",
    ),
    # windows and masks
    ("window not a pair", lambda: check_window("abc"), ValueError, r"window_size='abc'"),
    ("window -2", lambda: check_window((-2, 0)), ValueError, r"window_size=\(-2, 0\)"),
    ("window float", lambda: check_window((1.5, 0)), ValueError, r"the left bound must be an int"),
    (
        "mask spec window",
        lambda: MaskSpec(window=(1, 2, 3)),
        ValueError,
        r"window_size=\(1, 2, 3\)",
    ),
    (
        "blockwise block_q 0",
        lambda: blockwise_attention(X, KV, KV, IDS, IDS, POS, POS, scale=1.0, block_q=0),
        ValueError,
        r"block_q=0",
    ),
    # context parallelism
    (
        "cp stripe 0",
        lambda: _cp(stripe_size=0),
        ValueError,
        r"stripe_size=0 must be a positive int",
    ),
    ("cp strategy", lambda: _cp(strategy="tree"), ValueError, r"strategy='tree' is unknown"),
    (
        "cp ids shape",
        lambda: context_parallel_attention(
            X,
            KV,
            KV,
            jnp.ones((1, 4), jnp.int32),
            jnp.zeros((1, 4)),
            mesh=Mesh(np.array(jax.devices()[:1]), ("cp",)),
        ),
        ValueError,
        r"segment_ids/segment_pos must have shape \(1, 8\)",
    ),
    # reorders
    ("reorder cp 0", lambda: _reorder(cp_size=0), ValueError, r"cp_size=0"),
    ("reorder stripe 0", lambda: _reorder(stripe_size=0), ValueError, r"stripe_size=0"),
    (
        "reorder stripe too big",
        lambda: _reorder(stripe_size=8),
        ValueError,
        r"not divisible by cp_size\*stripe_size",
    ),
    ("reorder seq_dim", lambda: _reorder(seq_dim=5), ValueError, r"seq_dim=5"),
    (
        "reorder strategy",
        lambda: _reorder(strategy="striped"),
        ValueError,
        r"strategy must be ReorderStrategy",
    ),
    (
        "reorder dual chunk odd cp",
        lambda: _reorder(strategy=ReorderStrategy.DualChunkSwap, cp_size=3, stripe_size=None),
        ValueError,
        r"cp_size=3 must be a multiple of 2",
    ),
    # inputs and workloads
    (
        "random_qkv batch -1",
        lambda: random_qkv(0, -1, 8, 2, 1, 4, jnp.float32),
        ValueError,
        r"batch=-1",
    ),
    (
        "random_qkv head_dim 0",
        lambda: random_qkv(0, 1, 8, 2, 1, 0, jnp.float32),
        ValueError,
        r"head_dim=0",
    ),
    ("pack align 0", lambda: pack_segments([[3]], 8, align=0), ValueError, r"align=0"),
    ("pack empty segment", lambda: pack_segments([[0]], 8), ValueError, r"lengths\[0\]\[0\]=0"),
    (
        "workload batch 0",
        lambda: get_workload("tiny").replace(batch=0),
        ValueError,
        r"Workload.batch",
    ),
    (
        "workload heads",
        lambda: get_workload("tiny").replace(num_kv_heads=3),
        ValueError,
        r"num_q_heads=8",
    ),
    (
        "workload dtype",
        lambda: get_workload("tiny").replace(dtype="int8"),
        ValueError,
        r"Workload.dtype='int8'",
    ),
    ("unknown preset", lambda: get_workload("nosuch"), ValueError, r"preset='nosuch' is unknown"),
    (
        "preset env",
        _env("CP_TUTORIAL_PRESET", "nosuch", preset_from_env),
        ValueError,
        r"CP_TUTORIAL_PRESET='nosuch' is unknown",
    ),
    (
        "cp env 0",
        _env("CP_TUTORIAL_CP", "0", lambda: fit_cp_to_devices(get_workload("cpu"), 4)),
        ValueError,
        r"CP_TUTORIAL_CP='0' must be a positive integer",
    ),
    (
        "fit devices 0",
        lambda: fit_cp_to_devices(get_workload("cpu"), 0),
        ValueError,
        r"num_devices=0",
    ),
    ("setup_devices 0", lambda: setup_devices(0), ValueError, r"num_cpu_devices"),
    (
        "backend env",
        _env("TUTORIAL_TE_BACKEND", "bogus", _backend_choice),
        ValueError,
        r"TUTORIAL_TE_BACKEND='bogus' is not one of",
    ),
    # the facade (reference backend) and TE-on-CPU
    (
        "facade mask type string",
        lambda: _fused(attn_mask_type="causal"),
        ValueError,
        r"expected a AttnMaskType member",
    ),
    ("facade score_mod", lambda: _fused(score_mod=lambda s: s), ValueError, r"score_mod"),
    (
        "facade dropout",
        lambda: _fused(dropout_probability=0.1, is_training=True),
        ValueError,
        r"dropout_probability=0.1",
    ),
    ("facade window", lambda: _fused(window_size=(-5, 0)), ValueError, r"window_size=\(-5, 0\)"),
    (
        "facade max segments 0",
        lambda: _fused(max_segments_per_seq=0),
        ValueError,
        r"max_segments_per_seq=0",
    ),
    (
        "facade dropout 1.5 at inference",
        lambda: _fused(dropout_probability=1.5, is_training=False),
        ValueError,
        r"dropout_probability=1.5 must be a float in \[0, 1\), whether or not is_training is set",
    ),
    (
        "validator traced ids",
        lambda: jax.jit(lambda i, p: validate_packed_inputs(i, p, max_segments_per_seq=1))(
            IDS, POS
        ),
        ValueError,
        r"segment_ids is a traced array .* needs concrete arrays",
    ),
    (
        "random_qkv int dtype",
        lambda: random_qkv(0, 1, 8, 2, 1, 4, jnp.int32),
        ValueError,
        r"dtype=.*int32.* is not a floating dtype",
    ),
    (
        "pack fractional length",
        lambda: pack_segments([[2.5]], 8),
        ValueError,
        r"lengths\[0\]\[0\]=2.5 must be an int",
    ),
    (
        "facade kernel availability heads",
        lambda: ref_api.is_fused_attn_kernel_available(
            True, 1, "bf16", "bf16", None, None, None, None, 0.0, 4, 0, 16, 16, 8, 8
        ),
        ValueError,
        r"kv_num_heads=0",
    ),
    (
        "descriptor without positions",
        lambda: ref_api.SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(IDS)),
        ValueError,
        r"segment_pos=None",
    ),
    (
        "facade int q",
        lambda: _fused(qkv=(X.astype(jnp.int32), KV, KV)),
        ValueError,
        r"q.dtype=int32 is not a floating",
    ),
    (
        "facade bool v",
        lambda: _fused(qkv=(X, KV, KV.astype(bool))),
        ValueError,
        r"v.dtype=bool is not a floating",
    ),
    (
        "facade mixed dtypes",
        lambda: _fused(qkv=(X, KV.astype(jnp.bfloat16), KV)),
        ValueError,
        r"q/k/v dtypes differ",
    ),
    (
        "facade head_dim",
        lambda: _fused(qkv=(X, jnp.zeros((1, 8, 1, 8)), jnp.zeros((1, 8, 1, 8)))),
        ValueError,
        r"head_dim differs: q.shape\[3\]=4 but k.shape\[3\]=8",
    ),
    (
        "facade batch",
        lambda: _fused(qkv=(jnp.zeros((2, 8, 2, 4)), KV, KV)),
        ValueError,
        r"batch sizes differ",
    ),
    (
        "facade v shorter",
        lambda: _fused(qkv=(X, KV, KV[:, :6])),
        ValueError,
        r"nothing is padded or broadcast",
    ),
    (
        "facade v fewer heads",
        lambda: _fused(qkv=(jnp.zeros((1, 8, 4, 4)), jnp.zeros((1, 8, 2, 4)), KV)),
        ValueError,
        r"k has shape \(1, 8, 2, 4\) but v has \(1, 8, 1, 4\)",
    ),
    (
        "facade kv packed on heads axis",
        lambda: _fused(qkv=(X, jnp.stack([KV, KV], axis=3)), qkv_layout=ref_api.QKVLayout.THD_T2HD),
        ValueError,
        r"qkv_layout=THD_T2HD: the packed kv tensor has shape \(1, 8, 1, 2, 4\)",
    ),
    ("facade batch 0", lambda: _fused(qkv=(X[:0], KV[:0], KV[:0])), ValueError, r"zero-sized axis"),
    (
        "facade 3-D q",
        lambda: _fused(qkv=(X[0], KV, KV)),
        ValueError,
        r"q has shape \(8, 2, 4\); attention inputs are 4-D",
    ),
    (
        "facade scaling None",
        lambda: _fused(scaling_factor=None),
        ValueError,
        r"scaling_factor=None must be a finite",
    ),
    (
        "facade scaling nan",
        lambda: _fused(scaling_factor=float("nan")),
        ValueError,
        r"scaling_factor=nan",
    ),
    (
        "facade bias missing",
        lambda: _fused(
            attn_bias_type=ref_api.AttnBiasType.POST_SCALE_BIAS,
            attn_mask_type=ref_api.AttnMaskType.NO_MASK,
            qkv_layout=ref_api.QKVLayout.BSHD_BSHD_BSHD,
        ),
        ValueError,
        r"attn_bias_type=POST_SCALE_BIAS but bias=None",
    ),
    (
        "facade bias shape",
        lambda: _fused(
            bias=jnp.zeros((1, 2, 8, 4)),
            attn_bias_type=ref_api.AttnBiasType.POST_SCALE_BIAS,
            attn_mask_type=ref_api.AttnMaskType.NO_MASK,
            qkv_layout=ref_api.QKVLayout.BSHD_BSHD_BSHD,
        ),
        ValueError,
        r"bias has shape \(1, 2, 8, 4\); it must be \[batch or 1, heads or 1, seq_q, seq_kv\]",
    ),
    (
        "facade overlapping offsets",
        lambda: _fused(desc=_offsets([[4, 4, -1]], [[0, 2, -1]])),
        ValueError,
        r"q row 0: segment \[2, 6\) overlaps the previous one",
    ),
    (
        "facade offsets past the row",
        lambda: _fused(desc=_offsets([[4, 6]], [[0, 4]])),
        ValueError,
        r"runs past seq_len=8",
    ),
    (
        "facade end offset",
        lambda: _fused(desc=_offsets([[4, 4, -1]], [[0, 4, 8]])),
        ValueError,
        r"2 positive seqlens but 3 offsets >= 0",
    ),
    (
        "cp int q",
        lambda: context_parallel_attention(
            X.astype(jnp.int32),
            KV,
            KV,
            jnp.asarray(IDS),
            jnp.asarray(POS),
            mesh=Mesh(np.array(jax.devices()[:1]), ("cp",)),
        ),
        ValueError,
        r"q.dtype=int32",
    ),
    (
        "cp v shorter",
        lambda: context_parallel_attention(
            X,
            KV,
            KV[:, :4],
            jnp.asarray(IDS),
            jnp.asarray(POS),
            mesh=Mesh(np.array(jax.devices()[:1]), ("cp",)),
        ),
        ValueError,
        r"keys and values need the same sequence length",
    ),
    ("cp scaling inf", lambda: _cp(scaling_factor=float("inf")), ValueError, r"scaling_factor=inf"),
    (
        "dense head_dim",
        lambda: dense_attention(X, jnp.zeros((1, 8, 1, 2)), KV, IDS, IDS, POS, POS, scale=1.0),
        ValueError,
        r"head_dim differs",
    ),
    (
        "plan memory",
        lambda: _plan(seq_len=2**40),
        ValueError,
        r"max_memory_bytes: this plan needs about 819,200.0 GiB",
    ),
    ("te-on-cpu fp32", _te_cpu_fp32, ValueError, r"Unsupported backend: qkv dtype kFloat32"),
    # files: checked before any work, never replaced silently
    ("record exists", None, FileExistsError, r"already exists"),
    ("out is a folder", None, ValueError, r"--out '.*' is a folder"),
    (
        "out exists",
        None,
        ValueError,
        r"--out '.*' already exists; choose another name or add --force",
    ),
    ("out under a file", None, ValueError, r"is a file, not a folder"),
    ("name is a path", None, ValueError, r"--name 'a/b' must be a file name"),
    ("record folder is a file", None, ValueError, r"--out '.*' is a file; give a folder"),
    ("name exists", None, ValueError, r"--name '.*r.json' already exists"),
    # the GPU set-up
    (
        "cuda major env",
        _env("CUDA_MAJOR", "11", gpu_setup.cuda_major),
        SystemExit,
        r"CUDA_MAJOR='11'",
    ),
    (
        "unknown run step",
        lambda: gpu_setup.run_commands("b", "o", steps=["bulid"]),
        ValueError,
        r"steps=\['bulid'\]",
    ),
    ("bundle cuda 11", lambda: gpu_setup.bundle_requirements(11), ValueError, r"cuda=11"),
    (
        "old cudnn",
        lambda: gpu_setup.check_cudnn(((9, 6, 0), "libcudnn.so.9")),
        SystemExit,
        r"cuDNN 9.6.0",
    ),
]


def _file_case(name, tmp_path):
    """The file rows need a temporary folder."""
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    (tmp_path / "recs").mkdir()
    (tmp_path / "recs" / "r.json").write_text("{}")
    record = {
        "schema": "cp-bench/1",
        "label": "x",
        "source": "cpu-te",
        "config": {
            "batch": 1,
            "seq_len": 8,
            "num_q_heads": 2,
            "num_kv_heads": 1,
            "head_dim": 4,
            "cp_size": 1,
            "dtype": "float32",
        },
        "hardware": {"platform": "cpu", "device_count": 1, "backend": "t"},
        "results": [{"strategy": "single", "mean_ms": 1.0}],
    }
    return {
        "record exists": lambda: write_record(
            record, tmp_path / "recs", name="r.json", overwrite=False
        ),
        "out is a folder": lambda: output_file("--out", tmp_path, force=False),
        "out exists": lambda: output_file("--out", taken, force=False),
        "out under a file": lambda: output_file("--out", a_file / "report.json", force=True),
        "name is a path": lambda: record_file(tmp_path, "a/b", force=False),
        "record folder is a file": lambda: record_file(a_file, None, force=False),
        "name exists": lambda: record_file(tmp_path / "recs", "r", force=False),
    }[name]


@pytest.mark.parametrize("name, call, exc, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_named(name, call, exc, pattern, tmp_path):
    call = call or _file_case(name, tmp_path)
    with pytest.raises(exc, match=pattern):
        call()


def test_the_table_is_large_enough():
    assert len(CASES) >= 60, len(CASES)


def test_existing_output_is_replaced_only_with_force(tmp_path):
    taken = tmp_path / "report.json"
    taken.write_text("{}")
    assert (
        output_file("--out", taken, force=True) == taken and taken.read_text() == "{}"
    )  # checked, not touched


def test_check_cli_refuses_bad_outputs_and_unknown_names_before_running(tmp_path, capsys):
    from tutorial_utils.cli import check

    with pytest.raises(SystemExit):
        check.main(["--out", str(tmp_path)])
    assert "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        check.main(["--quick", "--only", "no-such-check"])
    err = capsys.readouterr().err
    assert (
        "--only: 'no-such-check' matches no check; names are:" in err and "facade-signatures" in err
    )


def test_bench_cli_refuses_an_existing_name_before_running(tmp_path, capsys):
    from tutorial_utils.cli import bench as bench_cli

    (tmp_path / "mine.json").write_text("{}")
    with pytest.raises(SystemExit):
        bench_cli.run(
            ["--preset", "tiny", "--out", str(tmp_path), "--name", "mine", "--no-progress"]
        )
    assert "--name" in capsys.readouterr().err and (tmp_path / "mine.json").read_text() == "{}"


def test_te_facade_names_what_te_alone_rejects_obscurely_or_computes_wrongly():
    """TE-on-CPU, in its own process: each input the facade rejects fails in TE alone too.

    TE alone raises a bare ``AssertionError`` from inside a primitive, or returns NaN or a
    wrong result; the facade raises ``ValueError`` naming the parameter first. So no input
    the facade rejects would have worked.
    """
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("TUTORIAL_TE_BACKEND", "XLA_FLAGS")}
    proc = subprocess.run(
        [sys.executable, str(root / "tests" / "scripts" / "te_facade_inputs_script.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    names = {
        "kv packed on the heads axis": "qkv_layout=THD_T2HD",
        "v shorter than k": "v has (1, 6, 1, 8)",
        "v with fewer heads than k": "v has (1, 8, 1, 8)",
        "int q": "q.dtype=int32",
        "scaling_factor nan": "scaling_factor=nan",
        "overlapping offsets": "q row 0: segment [2, 8) overlaps",
        "dropout 1.5 at inference": "dropout_probability=1.5 must be a float in [0, 1)",
        "max_segments_per_seq 0": "max_segments_per_seq=0 must be a positive int",
    }
    # TE alone accepts these silently (a value that means nothing, kept until it bites in training)
    silently_accepted = {"dropout 1.5 at inference"}
    assert set(report) == set(names)
    for case, row in report.items():
        assert row["facade"] and names[case] in row["facade"], (case, row)
        alone = row["te_alone"]
        if case in silently_accepted:
            assert alone.startswith("ran"), f"{case}: TE alone no longer accepts it ({alone})"
            continue
        wrong = alone.startswith(("raised", "wrong")) or (
            alone.startswith("ran, max") and float(alone.rsplit("= ", 1)[1]) > 0.1
        )
        assert wrong, f"{case}: TE alone handled it ({alone}), so the facade must not reject it"


def test_numpy_inputs_behave_as_under_jit():
    """NumPy q/k/v (and ids/positions) give the same output eagerly as jax arrays do under jit."""
    rng = np.random.default_rng(1)
    q, k, v = (
        rng.normal(size=s).astype(np.float32) for s in ((1, 8, 2, 4), (1, 8, 1, 4), (1, 8, 1, 4))
    )
    want = jax.jit(lambda *a: _fused(qkv=a))(*map(jnp.asarray, (q, k, v)))
    np.testing.assert_allclose(_fused(qkv=(q, k, v)), want, atol=1e-6)
    mesh = Mesh(np.array(jax.devices()[:1]), ("cp",))
    out = context_parallel_attention(q, k, v, IDS, POS, mesh=mesh, scaling_factor=0.5)
    ref, _ = dense_attention(q, k, v, IDS, IDS, POS, POS, scale=0.5, spec=MaskSpec(window=(-1, 0)))
    np.testing.assert_allclose(out, ref, atol=1e-6)


def test_setup_devices_keeps_a_device_count_the_caller_chose(monkeypatch):
    """A 1-, 2- or 8-device run sets XLA_FLAGS itself; a chapter's setup_devices(4) keeps it.
    Without
    such a flag, asking for more devices than an already started JAX has is still an error."""
    import jax

    have = len(jax.devices())
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count={have}")
    setup_devices(have + 4)
    assert os.environ["XLA_FLAGS"] == f"--xla_force_host_platform_device_count={have}"
    monkeypatch.delenv("XLA_FLAGS")
    with pytest.raises(RuntimeError, match=rf"sees {have} CPU device\(s\), not {have + 4}"):
        setup_devices(have + 4)
