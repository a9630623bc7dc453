"""Build and install TransformerEngine's JAX extension on a GPU node, online or offline.

TE's JAX extension is an sdist compiled on the node against the JAX already there, with
headers from five packages, and TE's import then loads cuDNN, NVRTC, cuRAND and NCCL in an
order of its own. Each thing that goes wrong by hand is a subcommand here that can be
checked on a CPU: ``cuda``, ``cudnn``, ``cudnn-include``, ``library-path``, ``bundle`` (the files
of an offline install), ``preflight``, ``build-ext``, ``install``, ``gate`` and ``run`` (all of
them, each step under a time limit, with a log).

This module is the command line; the work is done in :mod:`~tutorial_utils.cli.gpu_bundle`
(the pins, the download, the manifest and checksums), :mod:`~tutorial_utils.cli.gpu_cuda`
(CUDA, cuDNN and the libraries as TE finds them), :mod:`~tutorial_utils.cli.gpu_install`
(preflight, build, install, import gate) and :mod:`~tutorial_utils.cli.gpu_run` (the steps
of a run), whose public names it re-exports. Like them it imports neither JAX nor TE at its
top: it runs before TE is installed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tutorial_utils.cli.gpu_bundle import (
    BASE,
    BUILD_ENV,
    BUILT,
    CORE,
    EXTRA,
    MANIFEST,
    MIN_CUDNN,
    TE_VERSION,
    Requirement,
    bundle,
    bundle_requirements,
    file_sha256,
    read_manifest,
    record_hash,
    run_echoed,
    sdist_link,
    shell_line,
    verify_bundle,
    verify_bundle_entry,
    verify_wheel_record,
    wheel_version,
    write_manifest,
)
from tutorial_utils.cli.gpu_cuda import (
    CORE_LIBRARIES,
    build_includes,
    check_core_libraries,
    check_cudnn,
    cuda_major,
    cudnn_include_dir,
    cudnn_version,
    installed_version,
    jax_cuda_majors,
    library_env,
    nvtx_include_dir,
    pip_library_dirs,
    te_library,
    te_loads_pip_runtime,
    te_nvcc,
)
from tutorial_utils.cli.gpu_install import (
    build_command,
    build_extension,
    import_gate,
    install,
    install_commands,
    preflight,
    version_satisfies,
)
from tutorial_utils.cli.gpu_run import STEP_SECONDS, run, run_commands, run_step
from tutorial_utils.gpu import nccl_library, preload_nccl

__all__ = [
    "TE_VERSION",
    "MIN_CUDNN",
    "MANIFEST",
    "BASE",
    "CORE",
    "EXTRA",
    "BUILT",
    "BUILD_ENV",
    "Requirement",
    "bundle_requirements",
    "cuda_major",
    "jax_cuda_majors",
    "te_nvcc",
    "te_library",
    "cudnn_version",
    "check_cudnn",
    "cudnn_include_dir",
    "nvtx_include_dir",
    "build_includes",
    "nccl_library",
    "preload_nccl",
    "CORE_LIBRARIES",
    "pip_library_dirs",
    "library_env",
    "te_loads_pip_runtime",
    "check_core_libraries",
    "installed_version",
    "file_sha256",
    "record_hash",
    "verify_wheel_record",
    "wheel_version",
    "read_manifest",
    "sdist_link",
    "bundle",
    "write_manifest",
    "verify_bundle",
    "verify_bundle_entry",
    "preflight",
    "build_command",
    "build_extension",
    "version_satisfies",
    "install_commands",
    "install",
    "import_gate",
    "STEP_SECONDS",
    "run_commands",
    "run_step",
    "run",
    "shell_line",
    "run_echoed",
    "build_parser",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m tutorial_utils.cli.gpu_setup``: one subcommand per step."""
    p = argparse.ArgumentParser(
        prog="python -m tutorial_utils.cli.gpu_setup", description=__doc__.split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser(
        "cudnn", help="print the cuDNN runtime TE would load; exit 1 if missing or < 9.12.0"
    )
    sub.add_parser("cuda", help="print the CUDA major version TE will be built for (JAX's)")
    sub.add_parser("cudnn-include", help="print the folder holding cudnn.h")
    sub.add_parser(
        "library-path",
        help="print LD_LIBRARY_PATH with pip's NCCL, cuBLAS and cudart folders, so that TE loads"
        " on a node with a system CUDA toolkit too",
    )
    sub.add_parser(
        "build-includes",
        help="print CPLUS_INCLUDE_PATH for TE's build: cudnn.h's and nvtx3's folders",
    )
    br = sub.add_parser(
        "build-requirements", help="print the pinned packages TE's build needs (for pip install)"
    )
    br.add_argument("--cuda", type=int, choices=(12, 13), required=True)
    b = sub.add_parser("bundle", help="download every file of an offline install into DIR")
    b.add_argument("dir", type=Path)
    b.add_argument("--cuda", type=int, choices=(12, 13), default=13)
    b.add_argument("--python-version", default="3.12", choices=("3.11", "3.12"))
    b.add_argument(
        "--clean", action="store_true", help="empty DIR first (only if it holds a bundle)"
    )
    b.add_argument("--dry-run", action="store_true")
    for name, helptext in (
        ("verify", "check every file of a bundle against its manifest"),
        ("preflight", "check the node against the bundle, in TE's own search order"),
        ("build-ext", "build TE's JAX extension wheel into DIR/built"),
        ("install", "install a bundle offline"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("dir", type=Path)
        if name in ("install", "build-ext"):
            s.add_argument("--dry-run", action="store_true")
        if name == "build-ext":
            s.add_argument(
                "--jobs",
                type=int,
                default=None,
                help="C++ files compiled at once (default: every core)",
            )
            s.add_argument("--cuda-archs", default="90", help="NVTE_CUDA_ARCHS (90 = Hopper)")
            s.add_argument(
                "--out",
                type=Path,
                default=None,
                help="also copy the wheel and its stamp to OUT/gpu-run/",
            )
    sub.add_parser(
        "gate",
        help="import TE and its extension, then require a GPU; exit 1 with the reason otherwise",
    )
    r = sub.add_parser(
        "run", help="every step: preflight, verify, build, install, gate, benchmarks, check"
    )
    r.add_argument("--bundle", type=Path, default=Path("gpu-bundle"))
    r.add_argument("--out", type=Path, default=Path("results"))
    r.add_argument("--dry-run", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand.

    Args:
        argv: the arguments after the program name (``sys.argv[1:]`` when ``None``).

    Returns:
        The exit status: 0, or 1 when a ``run`` (not a dry run) had a step fail.
    """
    args = build_parser().parse_args(argv)
    if args.cmd == "cudnn":
        print(check_cudnn())
    elif args.cmd == "cuda":
        print(cuda_major())
    elif args.cmd == "cudnn-include":
        print(cudnn_include_dir())
    elif args.cmd == "library-path":
        print(library_env().get("LD_LIBRARY_PATH", ""))
    elif args.cmd == "build-includes":
        print(build_includes())
    elif args.cmd == "build-requirements":
        print(" ".join(r.spec for r in bundle_requirements(args.cuda) if r.use == "build"))
    elif args.cmd == "bundle":
        for cmd in bundle(
            args.dir, args.cuda, args.python_version, dry_run=args.dry_run, clean=args.clean
        ):
            if args.dry_run:
                print("+", shell_line(cmd))
    elif args.cmd == "verify":
        print(f"verified {len(verify_bundle(args.dir))} files against {args.dir / MANIFEST}")
    elif args.cmd == "preflight":
        print("\n".join(preflight(args.dir)))
    elif args.cmd == "build-ext":
        print(
            build_extension(
                args.dir,
                jobs=args.jobs,
                cuda_archs=args.cuda_archs,
                out=args.out,
                dry_run=args.dry_run,
            )
        )
    elif args.cmd == "install":
        install(args.dir, dry_run=args.dry_run)
    elif args.cmd == "gate":
        print(import_gate())
    else:
        summary = run(args.bundle, args.out, dry_run=args.dry_run)
        return 0 if args.dry_run or summary.get("ok") else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
