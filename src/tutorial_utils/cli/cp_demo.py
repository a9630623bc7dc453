"""``launch --demo``'s worker: CP strategies on a global mesh over all processes, checked.

Every rank runs each strategy on the mesh over all processes' devices, compares its own shards
with two one-process baselines and prints a ``DEMO-RESULT`` JSON line; rank 0 also prints a
``PASS``/``FAIL`` line per strategy, and every rank a last line over all of them. The
baselines are computed once, by rank 0 on its own device, and broadcast to every rank (the
ranks would all compute the same thing, each compiling it): the fp32 reference (dense, full
matmul precision) for every strategy and, for ``te-*``, TE's ``fused_attn`` without CP on the
same bf16 inputs (what TE's own CP tests compare with). Tolerance: TE's
``rtol = atol = eps**(2/3)`` of the demo's dtype.

Imports TE's facade at its top, which picks TE's backend from ``TUTORIAL_TE_BACKEND`` and may
start JAX: ``launch.py`` imports this module only after ``--backend`` has set that variable and
:func:`~tutorial_utils.cli.distributed_init.initialize` has joined the distributed runtime.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tutorial_utils import te
from tutorial_utils.cli.attention_compare import (
    cp_attention_loss,
    cp_mesh,
    cp_workload_for,
    self_attention_reference,
    te_attention_loss,
    te_cp_options,
    tolerance,
)
from tutorial_utils.perfmodel.workload import get_workload, make_qkv, workload_segments
from tutorial_utils.reorder import ReorderStrategy, reorder_causal_load_balancing
from tutorial_utils.te import attention

__all__ = ["demo_workload", "run_demo"]

OUTPUTS = ("out", "dq", "dk", "dv")


def demo_workload(preset: str, n: int, dtype: str | None = None):
    """The demo's workload at ``cp = n``.

    Args:
        preset: ``"tiny"`` (resized for ``n``) or ``"cpu"``.
        n: The CP size (all processes' devices).
        dtype: The inputs' dtype, or ``None`` for the preset's.

    Returns:
        The :class:`~tutorial_utils.perfmodel.workload.Workload`.
    """
    wl = cp_workload_for(n) if preset == "tiny" else get_workload(preset).replace(cp_size=n)
    return wl.replace(dtype=dtype) if dtype else wl


def _te_loss(wl, cp_options: dict | None = None):
    """``vdot(out, dout)`` of TE's ``fused_attn`` on ``wl``'s THD inputs, with CP when given."""
    return te_attention_loss(
        attention,
        scaling_factor=wl.scaling_factor,
        max_segments_per_seq=wl.max_segments_per_seq,
        window_size=wl.window,
        **(cp_options or {}),
    )


def _baselines(wl, q, k, v, dout, ids, pos, *, rank: int, uses_te: bool) -> dict:
    """The one-process runs, by rank 0 on its own device, broadcast to every rank (float64)."""
    names = ["reference"] + (["one_process_te"] if uses_te else [])
    if rank == 0:
        ref_out, ref_grads = self_attention_reference(
            q, k, v, dout, ids, pos, scale=wl.scaling_factor, window=wl.window, dense=True
        )
        baselines = {"reference": [np.asarray(x, np.float32) for x in (ref_out, *ref_grads)]}
        if uses_te:  # TE without CP: the one-process run TE's CP must reproduce
            desc1 = attention.SequenceDescriptor.from_segment_ids_and_pos(
                jnp.asarray(ids), jnp.asarray(pos)
            )
            (_, out1), grads1 = jax.jit(jax.value_and_grad(_te_loss(wl), has_aux=True))(
                (q, k, v), desc1, dout
            )
            baselines["one_process_te"] = [
                np.asarray(x, np.float32) for x in (out1, *grads1)
            ]  # bf16 -> f32: exact
    else:
        shapes = (q.shape[:-1] + v.shape[-1:], q.shape, k.shape, v.shape)  # out, dq, dk, dv
        baselines = {name: [np.zeros(s, np.float32) for s in shapes] for name in names}
    return {
        name: [np.asarray(x, np.float64) for x in arrays]
        for name, arrays in multihost_utils.broadcast_one_to_all(baselines).items()
    }


def _run_strategy(strategy: str, wl, mesh, x_sh, t_sh, host: dict, perm_np):
    """One strategy's ``(loss, out, (dq, dk, dv))`` on the global mesh, from the host inputs."""
    facade = strategy.startswith("te-")
    base = strategy[3:] if facade else strategy
    stripe = wl.stripe_for(base)

    def global_array(x, sharding):
        permuted = perm_np(x)
        return jax.make_array_from_callback(
            permuted.shape, sharding, lambda idx, permuted=permuted: permuted[idx]
        )

    def global_array_replicated(x):
        return jax.make_array_from_callback(
            x.shape, NamedSharding(mesh, P()), lambda idx, x=x: x[idx]
        )

    qkv = tuple(global_array(host[name], x_sh) for name in ("q", "k", "v"))
    dout_g = global_array(host["dout"], x_sh)
    ids_g, pos_g = global_array(host["ids"], t_sh), global_array(host["pos"], t_sh)
    if facade:
        desc = attention.SequenceDescriptor.from_segment_ids_and_pos(ids_g, pos_g)
        # TE's descriptor also holds small process-local leaves (e.g. empty seqlens): replicate
        # them on the mesh
        desc = jax.tree.map(
            lambda x: (
                x
                if isinstance(x, jax.Array) and not x.is_fully_addressable
                else global_array_replicated(np.asarray(x))
            ),
            desc,
        )
        desc_sh = jax.tree.map(lambda x: x.sharding, desc)
        loss = _te_loss(wl, te_cp_options(attention, base, stripe))
        fn = jax.jit(
            jax.value_and_grad(loss, has_aux=True),
            in_shardings=((x_sh,) * 3, desc_sh, x_sh),
            out_shardings=((None, x_sh), (x_sh,) * 3),
        )
        with jax.set_mesh(mesh), te.autocast(mesh_resource=te.MeshResource(cp_resource="cp")):
            (loss_v, out), grads = fn(qkv, desc, dout_g)
        return loss_v, out, grads
    loss = cp_attention_loss(mesh, wl, strategy=base, stripe_size=stripe)
    fn = jax.jit(
        jax.value_and_grad(loss, has_aux=True),
        in_shardings=((x_sh,) * 3, t_sh, t_sh, x_sh),
        out_shardings=((None, x_sh), (x_sh,) * 3),
    )
    (loss_v, out), grads = fn(qkv, ids_g, pos_g, dout_g)
    return loss_v, out, grads


def _local_errors(tensors: dict, expected: dict, tol: float) -> tuple[dict, float]:
    """Max ``|err|`` per tensor over this rank's shards, and the worst error over its bound."""
    errs, ratio = {}, 0.0
    for name, arr in tensors.items():
        err = 0.0
        for shard in arr.addressable_shards:
            want = expected[name][shard.index]
            diff = np.abs(np.asarray(shard.data, np.float64) - want)
            err = max(err, float(diff.max()))
            ratio = max(
                ratio, float(np.max(diff / (tol * (1.0 + np.abs(want)))))
            )  # allclose(rtol=atol=tol)
        errs[name] = err
    return errs, ratio


def run_demo(args: argparse.Namespace, info: dict) -> int:
    """Run the demo's strategies on this rank, after :func:`initialize` has returned ``info``.

    Args:
        args: ``launch``'s parsed options (``--preset``, ``--dtype``, ``--strategies``,
            ``--fail-rank``, ``--fail-at``, ``--out``).
        info: :func:`~tutorial_utils.cli.distributed_init.initialize`'s answer.

    Returns:
        0 when every strategy is within tolerance of both baselines on every rank, else 1.

    Raises:
        RuntimeError: The injected failure (``--fail-rank`` with ``--fail-at after``).
        ValueError: float32 with TE's code, which takes bf16 or fp16 only.
    """
    rank, nproc = info["process_id"], info["num_processes"]
    print(
        f"joined: process {rank} of {nproc}, local devices {info['local_devices']},"
        f" {len(info['global_devices'])} devices in total ({info['platform']}); backend:"
        f" {te.backend_name()}",
        flush=True,
    )
    if args.fail_rank is not None and args.fail_at == "after" and rank == args.fail_rank:
        raise RuntimeError(
            f"injected failure on rank {rank} after jax.distributed.initialize (--fail-rank"
            f" {args.fail_rank})"
        )

    n = jax.device_count()
    wl = demo_workload(args.preset, n, args.dtype)
    uses_te = any(s.startswith("te-") for s in args.strategies)
    if uses_te and te.using_te_code() and wl.dtype == "float32":
        raise ValueError(
            f"--dtype float32 with {te.backend_kind()!r}: TE's fused attention (cuDNN, and its CPU"
            " stand-in) takes bfloat16 or float16; use --dtype bfloat16, or --backend reference"
            " for fp32."
        )
    q, k, v, dout = make_qkv(wl, seed=31)
    ids, pos = workload_segments(wl)
    host = {"q": q, "k": k, "v": v, "dout": dout, "ids": ids, "pos": pos}
    baselines = _baselines(wl, q, k, v, dout, ids, pos, rank=rank, uses_te=uses_te)
    mesh, x_sh, t_sh = cp_mesh(jax.devices())
    tol = tolerance(wl.jnp_dtype)
    results, worst = [], 0.0  # worst: largest error / tolerance ratio over strategies and baselines

    for strategy in args.strategies:
        facade = strategy.startswith("te-")
        stripe = wl.stripe_for(strategy[3:] if facade else strategy)

        def perm_np(x, stripe=stripe):
            return np.asarray(
                reorder_causal_load_balancing(np.asarray(x), ReorderStrategy.Striped, n, 1, stripe)
            )

        loss_v, out, grads = _run_strategy(strategy, wl, mesh, x_sh, t_sh, host, perm_np)
        checksum = float(
            jax.jit(
                lambda x: jnp.sum(x.astype(jnp.float32)), out_shardings=NamedSharding(mesh, P())
            )(out)
        )
        against = ("reference", "one_process_te") if facade else ("reference",)
        local = {}  # baseline -> {tensor: max |err| on this rank's shards}
        stats = []
        for which in against:
            expected = dict(zip(OUTPUTS, (perm_np(x) for x in baselines[which])))
            errs, ratio = _local_errors(dict(zip(OUTPUTS, (out, *grads))), expected, tol)
            local[which] = errs
            stats += [max(errs.values()), ratio]
        gathered = np.max(
            np.reshape(multihost_utils.process_allgather(np.array(stats)), (-1, len(stats))), axis=0
        )
        all_ranks = {
            which: {
                "max_abs_err": float(gathered[2 * i]),
                "worst_ratio_to_tol": float(gathered[2 * i + 1]),
            }
            for i, which in enumerate(against)
        }
        global_ratio = max(v["worst_ratio_to_tol"] for v in all_ranks.values())
        worst = max(worst, global_ratio)
        row = {
            "rank": rank,
            "strategy": strategy,
            "cp": n,
            "stripe": stripe,
            "dtype": wl.dtype,
            "tolerance": tol,
            "backend": te.backend_kind(),
            "loss": float(loss_v),
            "reference_loss": float(
                np.vdot(baselines["reference"][0].astype(np.float64), np.asarray(dout, np.float64))
            ),
            "checksum": checksum,
            "reference_checksum": float(baselines["reference"][0].astype(np.float64).sum()),
            "max_abs_err_local": local,
            "max_abs_err_all_ranks": all_ranks["reference"]["max_abs_err"],
            "all_ranks": all_ranks,
            "worst_ratio_to_tol": global_ratio,
            "ok": global_ratio <= 1.0,
        }
        results.append(row)
        print("DEMO-RESULT " + json.dumps(row), flush=True)
        if rank == 0:
            vs = "; ".join(
                f"vs {w.replace('_', ' ')}: max|err|"
                f" {a['max_abs_err']:.2e} ({a['worst_ratio_to_tol']:.2f}x tol)"
                for w, a in all_ranks.items()
            )
            print(
                f"{'PASS' if row['ok'] else 'FAIL'} {strategy} (cp={n}, stripe {stripe},"
                f" {wl.dtype}): {vs}",
                flush=True,
            )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"demo-rank{rank}.json"), "w", encoding="utf-8") as fh:
            json.dump(
                {
                    "info": info,
                    "backend": te.backend_name(),
                    "workload": wl.as_dict(),
                    "results": results,
                    "tolerance": tol,
                },
                fh,
                indent=2,
                default=str,
            )
    ok = worst <= 1.0
    max_err = (
        max(max(a["max_abs_err"] for a in r["all_ranks"].values()) for r in results)
        if results
        else 0.0
    )
    print(
        f"{'PASS' if ok else 'FAIL'} demo on {nproc} processes x"
        f" {len(info['local_devices'])} device(s), {wl.dtype}: max |err| over all ranks, strategies"
        f" and baselines {max_err:.2e}, worst {worst:.2f}x of allclose(rtol=atol={tol:.3g})"
        f" ({te.backend_name()})",
        flush=True,
    )
    return 0 if ok else 1
