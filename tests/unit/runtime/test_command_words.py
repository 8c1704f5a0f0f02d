"""Every runtime-API command line is spelled in runtime/protocol/, and nowhere else.

The scan reads the package's source (``agent/certagent``) as Python syntax and
looks at string constants only: docstrings and comments may name commands.  A
command is found either inside one string (``"show info"``, ``b"reload\\n"``) or
as consecutive string elements of a tuple, list or call (``("set", "table", ...)``,
``client.execute("show", "info")``).  The harness (``certagent.testing``) may ask
HAProxy in its own words, as an independent check of what the agent did.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "agent" / "certagent"
PROTOCOL = PACKAGE / "runtime" / "protocol"  # a package: one module per section
EXEMPT = (PROTOCOL, PACKAGE / "testing")

#: The runtime API's commands (HAProxy 2.6 management guide, section 9.3) the agent uses or
#: used, and their siblings; one-word commands are matched only as a whole string.
PHRASES = (
    "show info", "show proc", "show stat", "show sess", "show errors", "show servers",
    "show ssl cert", "new ssl cert", "set ssl cert", "commit ssl cert", "abort ssl cert",
    "del ssl cert", "show ssl crt-list", "add ssl crt-list", "del ssl crt-list",
    "set ssl ocsp-response", "show ssl ocsp-response", "update ssl ocsp-response",
    "set ssl tls-key", "show tls-keys", "show ssl ca-file", "set ssl ca-file",
    "set table", "clear table", "show table",
    "add map", "del map", "set map", "show map", "clear map", "get map",
    "add acl", "del acl", "show acl", "clear acl",
)  # fmt: skip
WORDS = ("prompt", "reload", "quit")

_PHRASE = re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(p) for p in PHRASES) + r")(?![\w-])")
_WORD = re.compile(r"\s*(?:" + "|".join(WORDS) + r")\s*")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                found.add(id(body[0].value))
    return found


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        value = node.value
        return value.decode("latin-1") if isinstance(value, bytes) else value
    return None


def spelled_commands(source: str, name: str = "<source>") -> list[tuple[int, str]]:
    """(line, text) of every command spelled in ``source``'s strings."""
    tree = ast.parse(source, name)
    skip = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        text = _text(node)
        named = text is not None and (_PHRASE.search(text) or _WORD.fullmatch(text))
        if named and id(node) not in skip:
            found.append((getattr(node, "lineno", 0), str(text)))
        elements: list[ast.expr] = []
        if isinstance(node, ast.Tuple | ast.List):
            elements = node.elts
        elif isinstance(node, ast.Call):
            elements = node.args
        run: list[str] = []
        for element in [*elements, None]:
            word = None if element is None else _text(element)
            if word is not None:
                run.append(word)
                continue
            joined = " ".join(run)
            if len(run) > 1 and _PHRASE.search(joined):
                found.append((getattr(node, "lineno", 0), joined))
            run = []
    return found


def _package_files() -> list[Path]:
    return sorted(
        p
        for p in PACKAGE.rglob("*.py")
        if not any(p == e or e in p.parents for e in EXEMPT)
    )


def test_no_command_is_spelled_outside_the_protocol_module() -> None:
    offences = [
        f"{path.relative_to(PACKAGE)}:{line}: {text[:60]!r}"
        for path in _package_files()
        for line, text in spelled_commands(path.read_text(), str(path))
    ]
    assert offences == [], "build these in certagent.runtime.protocol:\n" + "\n".join(offences)


@pytest.mark.parametrize(
    "source",
    [
        'Command(("set", "ssl", "cert", name), pem)',
        'client.execute("show", "info")',
        'await query(path, "show", "table", table, "data.gpt0", "gt", "0")',
        'writer.write(b"show info\\n")',
        'sock.sendall(b"reload\\n")',
        'await self.execute("prompt")',
        'x = [("del", "ssl", "crt-list", crtlist, slot)]',
        'reply = f"commit ssl cert {name}"',
    ],
)
def test_the_scan_finds_a_command_however_it_is_spelled(source: str) -> None:
    assert spelled_commands(source) != []


@pytest.mark.parametrize(
    "source",
    [
        'def f():\n    """Sends ``set ssl cert`` and ``show info``."""\n',
        "# set table fe_sni key host\nx = 1\n",
        'log.info("HAProxy was reloaded: re-loading its hosts")',
        'cert.add_parser("show", help="one certificate")',
        'p.add_argument("--config", help="the table")',
        'raise ConfigError("reloads are noticed from the Lua action")',
    ],
)
def test_prose_and_unrelated_words_pass(source: str) -> None:
    assert spelled_commands(source) == []


def test_the_protocol_module_spells_every_command_the_agent_sends() -> None:
    found = " | ".join(
        text for module in PROTOCOL.glob("*.py") for _, text in spelled_commands(module.read_text())
    )
    for phrase in ("show info", "set ssl cert", "commit ssl cert", "abort ssl cert",
                   "new ssl cert", "add ssl crt-list", "show ssl crt-list", "show ssl cert",
                   "set table", "clear table", "show table", "show tls-keys", "set ssl tls-key",
                   "set ssl ocsp-response", "add map", "del map"):  # fmt: skip
        assert phrase in found, phrase
