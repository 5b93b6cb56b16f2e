# The `crawld` command. Each subcommand is a thin shell over the daemon's modules so that what a
# user runs by hand is what systemd runs.
from __future__ import annotations

import argparse
import os
import sys

import trio

from daemon import __version__, config
from daemon.logs import get_logger, setup_logging

log = get_logger("main")
DEFAULT_CONFIG = "config.toml"


def _cmd_run(args: argparse.Namespace) -> int:
    from daemon.app import run_daemon

    try:
        cfg = config.load(args.config)
    except config.ConfigError as exc:
        setup_logging("info")
        log.error("cannot start: invalid configuration", error=str(exc))
        return 2
    setup_logging(cfg.daemon.log_level)
    try:
        return trio.run(run_daemon, cfg)
    except config.ConfigError as exc:
        log.error("cannot start", error=str(exc))
        return 2


def _cmd_check_config(args: argparse.Namespace) -> int:
    try:
        cfg = config.load(args.path)
        from daemon.app import check_secrets

        if args.secrets:
            check_secrets(cfg)
    except config.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tasks = len(cfg.collector.tasks)
    print(f"{args.path}: ok ({tasks} collector task{'s' if tasks != 1 else ''})")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import httpx

    url = args.url.rstrip("/") + "/status"
    try:
        response = httpx.get(url, timeout=5)
    except httpx.HTTPError as exc:
        print(f"error: cannot reach crawld at {url}: {exc}", file=sys.stderr)
        return 1
    print(response.text)
    return 0 if response.status_code == 200 else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crawld", description="crawld daemon")
    parser.add_argument("--version", action="version", version=f"crawld {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument(
        "--config",
        default=os.environ.get("CRAWLD_CONFIG", DEFAULT_CONFIG),
        help="config file (default: $CRAWLD_CONFIG or ./config.toml)",
    )
    run.set_defaults(fn=_cmd_run)
    check = sub.add_parser("check-config", help="validate a config file; exit 2 on error")
    check.add_argument("path")
    check.add_argument(
        "--secrets", action="store_true", help="also check that named environment variables are set"
    )
    check.set_defaults(fn=_cmd_check_config)
    status = sub.add_parser("status", help="print a running daemon's /status")
    status.add_argument("--url", default="http://127.0.0.1:8700")
    status.set_defaults(fn=_cmd_status)
    sub.add_parser(
        "demo",
        help="the daemon with bundled simulators: see rows and webhooks move (demo --help)",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:  # its options are the demo's own (crawld demo --help)
        from daemon import demo

        return demo.main(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
