"""``certagent cert import LINEAGE``: one certbot lineage, as certbot's deploy hook passes it.

certbot runs a deploy hook after each issuance and renewal with
``$RENEWED_LINEAGE`` set to ``/etc/letsencrypt/live/NAME``.  Importing that
directory either adds its certificate or, for a renewal, **rotates** the record
that held the previous one (same id, version + 1), so every agent watching the
store swaps it into its slot in place.  Running it again changes nothing.

The record to rotate is one whose names are all among the new certificate's
(the same names, or fewer: certbot ``--expand``) with a key of the same kind
(ECDSA or RSA, so an ECDSA + RSA pair for a name stays a pair).  If several
fit, the one with the most names, then the latest notAfter, is rotated.  A
record that also serves names the new certificate lacks is never rotated (its
other names would stop being served): the new certificate is added and that
record named in a note.  Cost: one store listing per name of the certificate,
then one write.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from certagent.certs.pem import LeafInfo, parse_leaf
from certagent.cli._import_work import read_file, read_key
from certagent.cli.backends import Backend, Record

__all__ = ["LineageResult", "deploy_lineage", "is_lineage"]

ADDED, ROTATED, UNCHANGED = "added", "rotated", "unchanged"


@dataclass(frozen=True)
class LineageResult:
    action: str  # ADDED, ROTATED or UNCHANGED
    record: Record  # as stored now
    others: tuple[Record, ...]  # other records that serve some of the same names

    def summary(self) -> str:
        r = self.record
        names = " ".join(r["names"])
        if self.action == UNCHANGED:
            return f"already stored as {r['id']} (version {r['version']}) for {names}: unchanged"
        if self.action == ROTATED:
            return (
                f"rotated {r['id']} to version {r['version']} for {names}"
                f" (valid until {r['not_after']}); the agents swap it in live"
            )
        return f"added {r['id']} for {names} (valid until {r['not_after']})"

    def notes(self) -> list[str]:
        return [
            f"note: {o['id']} ({o['key_type']}, valid until {o['not_after']}) also serves"
            f" {' '.join(sorted(set(o['names']) & set(self.record['names'])))};"
            f" if this certificate replaces it: certagent cert rm {o['id']}"
            for o in self.others
        ]


def is_lineage(path: Path) -> bool:
    """``path`` is one certbot lineage (``live/NAME/``): it holds ``fullchain.pem`` itself."""
    return (path / "fullchain.pem").is_file()


async def deploy_lineage(backend: Backend, lineage: Path) -> LineageResult:
    """Add the lineage's certificate, or rotate the record of its previous version.

    Raises an AgentError (unreadable or invalid files, the store or API
    unavailable); the upload is validated as ``cert add`` validates it.
    """
    chain = read_file(lineage / "fullchain.pem")
    key = read_key(lineage / "privkey.pem")
    leaf = parse_leaf(chain)
    records = await _records_for(backend, leaf.names)
    for record in records:
        if record["fingerprint_sha256"] == leaf.fingerprint_sha256:
            return LineageResult(UNCHANGED, record, _others(records, record))
    target = _previous(records, leaf)
    if target is None:
        added = await backend.add(chain, key)
        return LineageResult(ADDED, added, _others(records, added))
    rotated = await backend.replace(target["id"], chain, key)
    return LineageResult(ROTATED, rotated, _others(records, rotated))


async def _records_for(backend: Backend, names: tuple[str, ...]) -> list[Record]:
    """Every record listing one of ``names``, each once, by id."""
    found: dict[str, Record] = {}
    for name in names:
        cursor: str | None = None
        while True:
            page, cursor = await backend.page(name, None, cursor)
            found.update((record["id"], record) for record in page)
            if cursor is None:
                break
    return [found[cert_id] for cert_id in sorted(found)]


def _previous(records: list[Record], leaf: LeafInfo) -> Record | None:
    """The record the new certificate renews, if one fits (see the module's docstring)."""
    names = set(leaf.names)
    kind = _kind(leaf.key_type)
    fits = [r for r in records if set(r["names"]) <= names and _kind(r["key_type"]) == kind]
    if not fits:
        return None
    return max(fits, key=lambda r: (len(r["names"]), r["not_after"], r["id"]))


def _kind(key_type: str) -> str:
    """``ECDSA-P256`` -> ``ECDSA``, ``RSA-2048`` -> ``RSA``."""
    return key_type.split("-", 1)[0]


def _others(records: list[Record], kept: Record) -> tuple[Record, ...]:
    return tuple(r for r in records if r["id"] != kept["id"])
