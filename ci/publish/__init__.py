"""From checked wheels to what users install: releases, provenance and its signature, verify-wheel, the index
and its pages, and which-wheel (one standard-library file the site serves)."""
