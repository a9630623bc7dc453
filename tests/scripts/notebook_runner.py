"""Execute one chapter with N simulated CPU devices and print its text outputs as JSON.

Run as a script (``python tests/scripts/notebook_runner.py N 04_striped_load_balancing``) so that
the device count is fixed before JAX starts in the kernel, whatever the calling process did. A
name with a folder (``docs/te_cp_rules``) is a page outside ``notebooks/``.
"""

import json
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main(devices: int, name: str) -> None:
    import jupytext
    import nbclient
    from docs_execute import ipc_kernel  # devtools/, on the run's path

    source = ROOT / (f"{name}.md" if "/" in name else f"notebooks/{name}.md")
    nb = jupytext.read(source)
    with ipc_kernel() as config:
        nbclient.NotebookClient(
            nb,
            timeout=900,
            kernel_name="python3",
            resources={"metadata": {"path": str(source.parent)}},
            config=config,
        ).execute()
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            texts.append(
                out.get("text")
                or out.get("data", {}).get("text/markdown", "")
                or out.get("data", {}).get("text/plain", "")
            )
    print(json.dumps({"devices": devices, "chapter": name, "outputs": texts}))


if __name__ == "__main__":
    n = int(sys.argv[1])
    # the site build's flags (conf.py), with this run's device count
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={n} --xla_backend_optimization_level=0"
    )
    os.environ["JAX_PLATFORMS"] = "cpu"
    main(n, sys.argv[2])
