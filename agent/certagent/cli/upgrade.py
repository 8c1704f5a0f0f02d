"""``certagent init DIR --upgrade``: an existing setup's haproxy.cfg and Lua brought up to date.

For a release whose haproxy.cfg or Lua action changed.  Reads ``DIR/certagent.toml``
(left as it is: its settings are the operator's, and new settings take their defaults)
and ``DIR/haproxy.cfg``; renders this release's haproxy.cfg for the same setup and
merges it with the existing one (:mod:`certagent.runtime.cfgmerge`: only what certagent
owns is rewritten); replaces ``DIR/certagent.lua`` (certagent's whole).  The result is
checked with ``haproxy -c`` first (the ``haproxy`` on PATH) and nothing is written if it
fails; the files replaced are kept beside as ``*.bak-<time>``.  HAProxy picks the new
files up at its next reload, at the operator's moment: the Lua action and the agent of
adjacent releases answer each other (docs/operations.md, Upgrading a fleet).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from certagent import config
from certagent.errors import ConfigError
from certagent.runtime.cfgmerge import Merged, facts, merge
from certagent.runtime.haproxycfg import HAProxyLayout, lua_source, render_haproxy_cfg
from certagent.runtime.tlspolicy import INTERMEDIATE, TlsPolicy

__all__ = ["Upgraded", "run_upgrade", "upgrade"]

_CHECK_SECONDS = 30


@dataclass
class Upgraded:
    """What ``--upgrade`` did: files written (their backups beside), the merge, notes."""

    written: list[Path] = field(default_factory=list)
    backups: list[Path] = field(default_factory=list)
    merged: Merged | None = None
    diff: str = ""
    lua_changed: bool = False
    notes: list[str] = field(default_factory=list)


def upgrade(
    directory: Path,
    *,
    tls: TlsPolicy = INTERMEDIATE,
    dry_run: bool = False,
    haproxy: str | None = None,
) -> Upgraded:
    """Bring ``directory``'s haproxy.cfg and certagent.lua up to this release (see above);
    ``haproxy``: the binary that checks the result (default: the first on PATH)."""
    directory = directory.absolute()
    toml, cfg, lua = (directory / n for n in ("certagent.toml", "haproxy.cfg", "certagent.lua"))
    for path in (toml, cfg):
        if not path.is_file():
            raise ConfigError(
                f"{path} is missing: --upgrade works on a directory an earlier"
                " `certagent init` wrote (without --upgrade to make a new one)"
            )
    settings = config.load(toml, environ={})
    old = cfg.read_text()
    seen = facts(old)
    if not seen.binds:
        raise ConfigError(
            f"{cfg} has no `bind` line in `frontend fe_sni`: not a haproxy.cfg certagent init"
            " wrote (or fe_sni was renamed); nothing was changed"
        )
    layout = HAProxyLayout(
        cfg_path=cfg,
        lua_path=lua,
        run_dir=Path(settings.haproxy_socket).parent,
        crt_list=settings.crt_list,
        agent_socket=settings.agent_socket,
        default_cert=Path(seen.default_cert or directory / "default.pem"),
        bind=seen.binds[0].split()[1],
        capacity=settings.capacity,
        usage_expire_ms=settings.usage_expire_ms,
        fallback=settings.fallback,
        backend=None,  # be_app is the operator's: kept as it is
        bufsize=settings.haproxy_bufsize,
        hold=settings.hold,
        log_target=seen.log_target or "stdout format raw",
        user=seen.user,
        tls_keys=Path(settings.tls_keys_file) if settings.tls_keys_file else None,
        tls=tls,
        http_bind=seen.http_binds[0].split()[1] if seen.http_binds else _http_bind(seen.binds),
        challenge_map=Path(settings.challenge_map) if settings.challenge_map else None,
        acme_alpn=settings.acme_directory != "" and settings.acme_challenge == "tls-alpn-01",
        http3_max_age=settings.http3_max_age if settings.http3 else None,
    )
    merged = merge(old, render_haproxy_cfg(layout))
    new_lua = lua_source()
    result = Upgraded(merged=merged, diff=merged.diff(old, str(cfg)))
    result.lua_changed = not lua.is_file() or lua.read_text() != new_lua
    if merged.text == old and not result.lua_changed:
        result.notes.append(f"{directory}: haproxy.cfg and certagent.lua are up to date")
        return result
    result.notes.append(_check(merged.text, new_lua, lua, haproxy))
    if dry_run:
        return result
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for path, text, changed in (
        (cfg, merged.text, merged.text != old),
        (lua, new_lua, result.lua_changed),
    ):
        if not changed:
            continue
        if path.exists():
            backup = path.with_name(f"{path.name}.bak-{stamp}")
            shutil.copy2(path, backup)
            result.backups.append(backup)
        _replace(path, text)
        result.written.append(path)
    return result


def run_upgrade(args: argparse.Namespace, tls: TlsPolicy) -> int:
    """``certagent init DIR --upgrade``: :func:`upgrade`, and what it did on stdout."""
    ignored = [
        flag
        for flag, value in (
            ("--bind", args.bind),
            ("--store", args.store),
            ("--data-key", args.data_key),
            ("--acme-directory", args.acme_directory),
            ("--systemd", args.systemd),
            ("--http3", getattr(args, "http3", False)),
            ("--api-tls-cert", getattr(args, "api_tls_cert", None)),
            ("--api-client-ca", getattr(args, "api_client_ca", None)),
        )
        if value
    ]
    if ignored:
        raise ConfigError(
            f"--upgrade keeps the setup of DIR as it is: {', '.join(ignored)} cannot change it"
            " (edit certagent.toml, e.g. `http3 = true`, then --upgrade renders haproxy.cfg for"
            " it; or run init into a new directory)"
        )
    binary = getattr(args, "haproxy", None)
    done = upgrade(args.directory, tls=tls, dry_run=args.dry_run, haproxy=binary)
    if done.diff:
        print(done.diff, end="")
    merged = done.merged
    if merged is not None and (merged.rewritten or merged.added):
        print(f"haproxy.cfg: rewritten {', '.join(merged.rewritten) or 'nothing'};"
              f" added {', '.join(merged.added) or 'nothing'};"
              f" kept as they were {', '.join(merged.kept) or 'nothing'}")  # fmt: skip
        for line in merged.operator_lines:
            print(f"  kept your line in {line}")
    if done.lua_changed:
        print("certagent.lua: replaced by this release's")
    for path in done.backups:
        print(f"backup {path}")
    for path in done.written:
        print(f"wrote  {path}")
    for note in done.notes:
        print(note)
    if done.written:
        print("HAProxy uses the new files from its next reload (systemctl reload haproxy,"
              " or SIGUSR2 to its master); the running agent answers both")  # fmt: skip
    elif args.dry_run and (done.diff or done.lua_changed):
        print("--dry-run: nothing was written")
    return 0


def _http_bind(binds: tuple[str, ...]) -> str:
    """Port 80 on the address of fe_sni's first bind, as init's default."""
    host = binds[0].split()[1].rpartition(":")[0]
    return f"{host}:80"


def _check(cfg_text: str, lua_text: str, lua_path: Path, binary: str | None) -> str:
    """``haproxy -c`` on the upgraded files (the Lua in a scratch copy); ConfigError with
    HAProxy's words if it refuses them.  A note saying how it was checked."""
    haproxy = shutil.which(binary or "haproxy")
    if haproxy is None:
        if binary:
            raise ConfigError(f"--haproxy {binary}: no such program")
        return "not checked: no haproxy on PATH (check with `haproxy -c -f DIR/haproxy.cfg`)"
    with tempfile.TemporaryDirectory(prefix="certagent-upgrade-") as scratch:
        lua = Path(scratch) / lua_path.name
        lua.write_text(lua_text)
        cfg = Path(scratch) / "haproxy.cfg"
        cfg.write_text(cfg_text.replace(f" {lua_path}\n", f" {lua}\n"))
        try:
            done = subprocess.run(
                [haproxy, "-c", "-f", str(cfg)],
                capture_output=True,
                text=True,
                timeout=_CHECK_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"could not run {haproxy} -c on the upgraded file: {exc}") from exc
    if done.returncode != 0:
        raise ConfigError(
            f"{haproxy} -c refuses the upgraded haproxy.cfg, so nothing was written:"
            f" {(done.stdout + done.stderr).strip()[-1500:]}"
        )
    return f"checked with {haproxy} -c"


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    if path.exists():
        shutil.copymode(path, tmp)
    tmp.replace(path)
