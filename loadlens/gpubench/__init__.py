"""``loadlens gpu-bench``: the guide's chapter 3 measured on the user's GPU with PyTorch and random data
(docs/gpu-bench.md).

Modules: ``cli.py`` (the command), ``model_shape.py`` (shapes from a model profile or a ``config.json``),
``plan.py`` (the cases to run), ``counts.py`` (FLOP and byte counts, shares of peak, rows from timings: pure,
tested with recorded figures), ``measure.py`` (the timed kernels: SDPA backends, flash_attn, GEMM, copy),
``graph_step.py`` (the eager and CUDA-graph decode step), ``console.py`` (the tables as text),
``profile_writer.py`` (a sim GPU profile from the measured efficiencies).
"""
