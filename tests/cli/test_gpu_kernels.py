"""The import gate's question to TE for the seed workload (``tutorial_utils.cli.gpu_kernels``),
asked of a stand-in that applies TE 2.20.2's cuDNN 9.14.0 rule (``nvte_get_fused_attn_backend``:
no kernel for a non-causal mask, padding-causal included, with ``max_seqlen_kv > 1024`` and a
sliding window). ``check --quick`` runs at 512 tokens, where that rule never fires."""

from types import SimpleNamespace

from tutorial_utils.cli import gpu_kernels as K
from tutorial_utils.cli.check_signatures import KERNEL_AVAILABLE_PARAMS
from tutorial_utils.perfmodel.workload import PRESETS

ATTENTION = SimpleNamespace(
    QKVLayout=SimpleNamespace(THD_THD_THD="THD_THD_THD"),
    AttnBiasType=SimpleNamespace(NO_BIAS="NO_BIAS"),
    AttnSoftmaxType=SimpleNamespace(VANILLA_SOFTMAX="VANILLA_SOFTMAX"),
    AttnMaskType=SimpleNamespace(
        PADDING_CAUSAL_MASK="PADDING_CAUSAL_MASK",
        PADDING_CAUSAL_BOTTOM_RIGHT_MASK="PADDING_CAUSAL_BOTTOM_RIGHT_MASK",
    ),
)


def te_rule(cudnn):
    """TE 2.20.2's availability as far as cuDNN 9.14.0's bug goes."""

    def available(call):
        kw = K.kernel_keywords(ATTENTION, call)
        causal_only = kw["attn_mask_type"] in ("CAUSAL_MASK", "CAUSAL_BOTTOM_RIGHT_MASK")
        return not (
            cudnn == (9, 14, 0)
            and kw["kv_max_seqlen"] > 1024
            and kw["window_size"][0] != -1
            and not causal_only
        )

    return available


def test_the_seed_calls_are_the_benchmarks_and_use_tes_own_keywords():
    calls = K.seed_kernel_calls()
    assert [(c.step, c.mask, c.q_max_seqlen, c.kv_max_seqlen) for c in calls] == [
        ("bench-single", "PADDING_CAUSAL_MASK", 65536, 65536),
        ("bench-emulated", "PADDING_CAUSAL_BOTTOM_RIGHT_MASK", 16384, 65536),
        ("bench-emulated", "PADDING_CAUSAL_MASK", 16384, 16384),
    ]
    assert all(c.window == PRESETS["seed"].window == (8192, 0) for c in calls)
    kw = K.kernel_keywords(ATTENTION, calls[0])
    assert set(kw) <= set(KERNEL_AVAILABLE_PARAMS)  # TE 2.20.2's parameter names
    assert (kw["q_num_heads"], kw["kv_num_heads"], kw["head_dim_qk"], kw["batch_size"]) == (
        128,
        8,
        128,
        2,
    )
    assert kw["qkv_layout"] == "THD_THD_THD" and kw["q_dtype"] is PRESETS["seed"].jnp_dtype


def test_cudnn_9_14_0_is_refused_for_the_seed_and_named():
    lines, refusal = K.seed_kernel_verdict(te_rule((9, 14, 0)), (9, 14, 0))
    assert all(line.startswith("NO kernel") for line in lines), lines
    assert refusal.startswith("TE has no fused kernel for the seed workload on this node")
    assert "cuDNN 9.14.0 has a known bug" in refusal and "s_kv > 1024" in refusal
    assert "one GPU (bench-single): THD PADDING_CAUSAL_MASK, s_q 65536 / s_kv 65536" in refusal


def test_a_good_cudnn_passes_and_a_missing_emulated_kernel_does_not_stop_the_run():
    lines, refusal = K.seed_kernel_verdict(te_rule((9, 19, 0)), (9, 19, 0))
    assert refusal is None and all(line.startswith("kernel: ") for line in lines)
    lines, refusal = K.seed_kernel_verdict(lambda call: call.step == "bench-single", (9, 19, 0))
    assert refusal is None and sum(line.startswith("NO kernel") for line in lines) == 2
    _, refusal = K.seed_kernel_verdict(lambda call: False, (9, 19, 0))
    assert "known bug" not in refusal and "support matrix" in refusal
