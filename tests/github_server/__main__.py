"""Run the test server as a process: ``python -m tests.github_server --port 8000``."""

from __future__ import annotations

import argparse
import signal
import threading

from .server import FaultConfig, GitHubTestServer


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.github_server", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="API port")
    ap.add_argument("--uploads-port", type=int, default=0, help="uploads port (default: any free port)")
    ap.add_argument("--token", default="test-token")
    ap.add_argument("--repo", default="o/r")
    ap.add_argument("--seed-bulk", default="", help="NxM: N releases with M synthetic assets each")
    ap.add_argument("--rate-limit", type=int, default=5000, help="primary rate limit per hour (GitHub: 5000 for a PAT)")
    ap.add_argument("--fault-rate", type=float, default=0.0)
    ap.add_argument("--fault-seed", type=int, default=0)
    args = ap.parse_args()
    faults = FaultConfig(rate=args.fault_rate, seed=args.fault_seed) if args.fault_rate > 0 else None
    gh = GitHubTestServer(token=args.token, host=args.host, api_port=args.port, uploads_port=args.uploads_port,
                          faults=faults, keep_log=False, rate_limit=args.rate_limit)
    gh.start()
    if args.seed_bulk:
        n, m = (int(x) for x in args.seed_bulk.lower().split("x"))
        gh.seed_bulk(n, m, repo=args.repo)
    print(f"api_url={gh.api_url} uploads_url={gh.uploads_url} repo={args.repo}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        gh.stop()


if __name__ == "__main__":
    main()
