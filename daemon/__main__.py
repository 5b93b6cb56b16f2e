# The `crawld` command. Each subcommand is a thin shell over the daemon's modules so that what a
# user runs by hand is what systemd runs.
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

import trio

from daemon import __version__, settings
from daemon.logs import get_logger, setup_logging

if TYPE_CHECKING:
    from daemon.cluster import Offers

log = get_logger("main")
DEFAULT_CONFIG = "config.toml"
DEFAULT_URL = "http://127.0.0.1:8700"


def _cmd_run(args: argparse.Namespace) -> int:
    from daemon.app import run_daemon
    from daemon.store.errors import StoreUnavailable

    try:
        cfg = settings.load(args.config)
    except settings.ConfigError as exc:
        setup_logging("info")
        log.error("cannot start: invalid configuration", error=str(exc))
        return 2
    setup_logging(cfg.daemon.log_level)
    try:
        return trio.run(run_daemon, cfg)
    except settings.ConfigError as exc:
        log.error("cannot start", error=str(exc))
        return 2
    except StoreUnavailable as exc:
        log.error("cannot start", error=str(exc))
        return 1


def _cmd_check_config(args: argparse.Namespace) -> int:
    try:
        cfg = settings.load(args.path)
        from daemon.app import check_secrets

        if args.secrets:
            check_secrets(cfg)
    except settings.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tasks = len(cfg.collector.tasks)
    print(f"{args.path}: ok ({tasks} collector task{'s' if tasks != 1 else ''})")
    if args.secrets and cfg.store.kind == "postgres":
        return _check_postgres(cfg)
    return 0


def _check_postgres(cfg: settings.Config) -> int:
    """Connect to the configured PostgreSQL and say what is there (or exactly what is wrong)."""
    from daemon.store.errors import StoreUnavailable
    from daemon.store.postgres import inspect

    assert cfg.store.dsn_env is not None
    try:
        info = inspect(
            os.environ[cfg.store.dsn_env], cfg.store.schema, timeout=cfg.store.connect_timeout
        )
    except StoreUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if info.schema_version is None:
        state = f"schema {info.schema} does not exist yet (the first start creates it)"
    else:
        state = f"schema {info.schema} at version {info.schema_version}"
    print(
        f"store: postgres {info.server_version} at {info.host} as {info.user}; {state};"
        f" this crawld writes version {info.latest}"
    )
    problems = []
    if info.schema_version is not None and info.schema_version > info.latest:
        problems.append(
            f"the schema is newer than this crawld ({info.schema_version} > {info.latest})"
        )
    if not info.can_create:
        what = "the database" if info.schema_version is None else f"schema {info.schema}"
        problems.append(f"{info.user} may not CREATE in {what} (GRANT CREATE ON ...)")
    for problem in problems:
        print(f"error: store: {problem}", file=sys.stderr)
    if problems:
        return 2
    return _check_cluster(cfg, os.environ[cfg.store.dsn_env]) if info.schema_version else 0


def _check_cluster(cfg: settings.Config, dsn: str) -> int:
    """List the members of the store's cluster and what this config would disagree on with
    the live ones (a different lease is an error, the rest warnings)."""
    import psycopg

    from daemon.cluster import store as cs
    from daemon.cluster.component import offers_for
    from daemon.store.errors import StoreUnavailable
    from daemon.store.postgres import PgConn, connect

    try:
        conn = connect(dsn, cfg.store.schema, timeout=cfg.store.connect_timeout)
        try:
            members = cs.members(PgConn(conn))
        finally:
            conn.close()
    except psycopg.errors.UndefinedTable:
        return 0  # a schema from before cluster mode: nothing to compare with
    except (StoreUnavailable, psycopg.Error) as exc:
        print(f"error: cluster: cannot read the members: {exc}", file=sys.stderr)
        return 2
    lines, warnings, errors = cluster_report(members, offers_for(cfg), settings.instance_name(cfg))
    for line in lines:
        print(line)
    for warning in warnings:
        print(f"warning: cluster: {warning}", file=sys.stderr)
    for error in errors:
        print(f"error: cluster: {error}", file=sys.stderr)
    return 2 if errors else 0


def cluster_report(
    members: list[dict[str, Any]], mine: Offers, instance: str
) -> tuple[list[str], list[str], list[str]]:
    """What `check-config --secrets` says of the cluster, from its member rows (as
    daemon.cluster.store.members returns them): lines listing the members, warnings (settings
    that differ from a live member's, this instance name in use) and errors (a lease that
    differs: the members would not agree on when work moves)."""
    import msgspec

    from daemon.cluster import Offers, rules

    lines = [f"cluster: {len(members)} member{'s' if len(members) != 1 else ''} in the store"]
    others: list[tuple[str, Offers]] = []
    warnings: list[str] = []
    for m in members:
        alive = rules.alive(m["expires_ms"], m["now_ms"])
        ago = (m["now_ms"] - m["heartbeat_ms"]) / 1000
        lines.append(
            f"  {m['instance']}: {'alive' if alive else 'gone'}, last heartbeat {ago:.1f}s ago"
            f" (host {m['host']}, pid {m['pid']}, http {m['http'] or '-'})"
        )
        if not alive:
            continue
        if m["instance"] == instance:
            warnings.append(
                f"$.cluster.instance: {instance!r} is the name of a live member (pid {m['pid']}"
                f" on {m['host']}): a second process of this name would be refused"
            )
        try:
            others.append((m["instance"], msgspec.json.decode(m["offers"], type=Offers)))
        except (msgspec.DecodeError, msgspec.ValidationError):
            warnings.append(f"cannot read what member {m['instance']} offers")
    errors: list[str] = []
    for found in rules.disagreements(mine, instance, others):
        (errors if found.startswith("$.cluster.lease") else warnings).append(found)
    return lines, warnings, errors


def _cmd_store_copy(args: argparse.Namespace) -> int:
    from daemon.store import backend_for
    from daemon.store.copy import CopyRefused, copy_store
    from daemon.store.errors import StoreUnavailable

    try:
        configs = [settings.load(args.from_config), settings.load(args.to_config)]
        for cfg in configs:
            settings.resolve_secret(cfg.store.dsn_env, "$.store.dsn_env")
        source, target = (backend_for(cfg) for cfg in configs)
        if source.location == target.location:
            raise CopyRefused(f"both configs name the same store ({source.location})")
        if source.name == "sqlite" and not os.path.exists(source.location):
            raise CopyRefused(f"there is no store at {source.location} (the source's state dir)")
        print(f"copying {source.name} {source.location} -> {target.name} {target.location}")
        counts = copy_store(
            source, target, progress=lambda table, n: print(f"  {table}: {n} rows", flush=True)
        )
    except (settings.ConfigError, CopyRefused, StoreUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = sum(c.target for c in counts)
    print(f"done: {rows} rows in {len(counts)} tables, every count verified")
    return 0


def status_request(config_path: str | None, url: str | None) -> tuple[str, dict[str, str]]:
    """The /status URL and headers for `crawld status`: the address and the first API key come
    from the config file when one is given, else `url` and $CRAWLD_API_KEY."""
    base = url or DEFAULT_URL
    key = os.environ.get("CRAWLD_API_KEY")
    if config_path is not None:
        cfg = settings.load(config_path)
        if url is None:
            base = cfg.http.public_url or f"http://{cfg.http.bind}"
        if cfg.http.api_key_env is not None:
            key = settings.resolve_secret(cfg.http.api_key_env, "$.http.api_key_env")
    first = next((k.strip() for k in (key or "").split(",") if k.strip()), None)
    headers = {"Authorization": f"Bearer {first}"} if first else {}
    return base.rstrip("/") + "/status", headers


def _cmd_status(args: argparse.Namespace) -> int:
    import httpx

    try:
        url, headers = status_request(args.config, args.url)
    except settings.ConfigError as exc:
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
    store = sub.add_parser("store", help="store maintenance (store copy --help)")
    store_sub = store.add_subparsers(dest="store_command", required=True)
    copy = store_sub.add_parser(
        "copy",
        help="copy the store of a stopped deployment into the empty store of another config;"
        " exit 2 with the reason when it cannot",
    )
    copy.add_argument("from_config", help="the config of the deployment to copy (stopped)")
    copy.add_argument("to_config", help="the config whose store receives it (empty)")
    copy.set_defaults(fn=_cmd_store_copy)
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
