"""Building one matrix row as CI does (``job``): the build place, the pinned toolchain, the sources, the
reproducibility rules, the interpreter check, the compiler cache, the torch pin and SBOM, smoke tests, and
``rebuild`` (two builds compared)."""
