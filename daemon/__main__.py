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
DEFAULT_URL = "http://127.0.0.1:8700"


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


def status_request(config_path: str | None, url: str | None) -> tuple[str, dict[str, str]]:
    """The /status URL and headers for `crawld status`: the address and the first API key come
    from the config file when one is given, else `url` and $CRAWLD_API_KEY."""
    base = url or DEFAULT_URL
    key = os.environ.get("CRAWLD_API_KEY")
    if config_path is not None:
        cfg = config.load(config_path)
        if url is None:
            base = cfg.http.public_url or f"http://{cfg.http.bind}"
        if cfg.http.api_key_env is not None:
            key = config.resolve_secret(cfg.http.api_key_env, "$.http.api_key_env")
    first = next((k.strip() for k in (key or "").split(",") if k.strip()), None)
    headers = {"Authorization": f"Bearer {first}"} if first else {}
    return base.rstrip("/") + "/status", headers


def _cmd_status(args: argparse.Namespace) -> int:
    import httpx

    try:
        url, headers = status_request(args.config, args.url)
    except config.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        response = httpx.get(url, headers=headers, timeout=5, trust_env=False)
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
    status.add_argument(
        "--url",
        default=None,
        help=f"the daemon's address (default: from --config, or {DEFAULT_URL})",
    )
    status.add_argument(
        "--config",
        default=os.environ.get("CRAWLD_CONFIG"),
        help="read the address and the API key variable from this file (default: $CRAWLD_CONFIG);"
        " without it the key comes from $CRAWLD_API_KEY",
    )
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
