# Stand-in: the patch only checks that a setup.py exists next to csrc/kernels.
