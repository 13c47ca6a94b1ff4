"""The model: versions.yaml loaded and checked, its matrix rows, names and tags, the build record and
manifest, the build-input fingerprint, the environment and credentials rules, shard specs and the
flashinfer-jit-cache's module lists and providers."""
