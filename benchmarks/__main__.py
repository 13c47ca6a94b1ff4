"""``python -m benchmarks [--quick] [--only NAME,...]``: run the benchmarks, rewrite RESULTS.md."""

from benchmarks.runner import main

raise SystemExit(main())
