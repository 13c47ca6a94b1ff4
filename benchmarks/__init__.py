"""Benchmarks: side-by-side measurements of our approach against the anchor's (not tests).

Run ``invoke bench [--quick] [--only NAME,...]`` (or ``python -m benchmarks``); the runner rewrites
``benchmarks/RESULTS.md``. Each figure module exposes ``NAME``, ``TITLE`` and ``run(ctx) -> Figure``;
the anchor's approaches, reproduced as measuring sticks, live in :mod:`benchmarks.anchor`.
"""
