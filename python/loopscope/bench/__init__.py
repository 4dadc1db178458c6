"""Benchmarks: loopscope measured against its floor and its peers in one run.

Each module runs loopscope and the baseline back to back, repeats, and
reports medians with their spread and the ratios the targets are stated in.
Figures are never asserted in tests; they go into docs/benchmarks.md with the
command that produced them.
"""
