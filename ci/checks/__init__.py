"""What a wheel must satisfy before it ships, one module per check (``check`` runs them all): torch's ABI,
Python coverage, contents, build paths, the torch pin, auditwheel, CUDA-library skew; ``toolkit`` finds the
CUDA toolkit a check or a build uses."""
