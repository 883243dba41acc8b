"""A chaos soak outside CI: ``python -m tests.chaos --transport rabbitmq --duration 600``.
Prints the report; exits 1 on violations, 2 when a service it needs is missing."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .faults import Timing
from .harness import ChaosConfig, Unavailable
from .own_broker import run_chaos_own_broker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--transport", choices=["postgres", "rabbitmq"], default="postgres")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load and faults")
    parser.add_argument("--executors", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=40.0, help="executions requested per second")
    parser.add_argument("--webhook-rate", type=float, default=4.0, help="signed webhook deliveries POSTed per second")
    parser.add_argument("--event-rate", type=float, default=4.0, help="custom events emitted per second")
    parser.add_argument("--concurrency", type=int, default=8, help="executions each worker runs at once")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--pg-restart-mode", choices=["fast", "immediate"], default="fast")
    parser.add_argument("--kill-every", type=float, nargs=2, default=(1.5, 4.0), metavar=("MIN", "MAX"))
    parser.add_argument("--restart-after", type=float, nargs=2, default=(0.2, 3.0), metavar=("MIN", "MAX"))
    parser.add_argument("--no-failpoints", action="store_true")
    parser.add_argument("--settle-timeout", type=float, default=180.0)
    parser.add_argument("--log-dir", type=Path, default=None, help="default: a new folder under /tmp")
    args = parser.parse_args(argv)
    if args.executors < 2 or args.workers < 3:
        parser.error("run at least 2 executors and 3 workers: one of each may be down at any time")
    config = ChaosConfig(
        transport=args.transport,
        duration=args.duration,
        executors=args.executors,
        workers=args.workers,
        rate=args.rate,
        webhook_rate=args.webhook_rate,
        event_rate=args.event_rate,
        concurrency=args.concurrency,
        seed=args.seed,
        pg_restart_mode=args.pg_restart_mode,
        failpoints=not args.no_failpoints,
        settle_timeout=args.settle_timeout,
        timing=Timing(tuple(args.kill_every), tuple(args.restart_after)),
        log_dir=args.log_dir,
    )
    try:
        result = run_chaos_own_broker(config, progress=lambda text: print(text, file=sys.stderr, flush=True))
    except Unavailable as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    print(result.report, flush=True)
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
