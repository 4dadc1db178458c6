"""`python -m loopscope.cli`: how agents start probes and helpers."""

from loopscope.cli import main

main()
