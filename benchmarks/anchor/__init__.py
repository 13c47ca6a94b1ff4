"""The anchor's approaches (verl-wheelhouse, see shared/reference/verl-wheelhouse.md), reproduced as
measuring sticks for the benchmarks. Not product code: each module says which anchor file and
behaviour it reproduces, and where it has to differ (no gh binary, no network)."""
