"""The command-line tools: ``python -m tutorial_utils.cli.<tool>``.

``plan`` (the CP advisor), ``bench`` (timings and records), ``check`` (the installation against
the reference), ``check_layout`` (your own packed batch), ``launch`` (one process per device),
``gpu_setup`` (TE on a GPU node, online or offline) and ``support_matrix``. ``argtypes`` holds
the argument types and output-file checks they share.
"""
