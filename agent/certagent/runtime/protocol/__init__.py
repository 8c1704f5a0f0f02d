"""HAProxy runtime-API protocol, sans I/O: every command the agent sends, and its reply.

Everything here turns values into bytes or bytes into typed values; nothing
touches a socket.  The client in :mod:`certagent.runtime.client` moves the bytes.
No other module of the agent spells a command: each one is built by a function
here (returning a :class:`Command`), next to the check or parser of its reply
(a unit test keeps it so).

The connection runs in ``prompt`` mode: every reply ends with ``"\\n> "`` and
each line of a ``<<`` payload is acknowledged with a ``"+ "`` continuation
prompt before the reply itself.

The public API, by section:

* framing: :class:`Command` (``.encode()``), :func:`encode`, :class:`ReplySplitter`,
  :func:`shown` (a command fit for a log), ``PROMPT``, ``DEFAULT_BUFSIZE``, ``LOCKED``;
* session: :func:`prompt`; :func:`show_info` -> :func:`parse_show_info`,
  :func:`parse_identity` (:class:`Identity`); :func:`show_build` (parsed in
  :mod:`certagent.runtime.build`); :func:`master_reload` (the master CLI);
* certificates: :func:`show_certs` -> :func:`parse_show_ssl_cert` (:class:`CertList`);
  :func:`show_cert` -> :func:`parse_cert_details` (:class:`CertDetails`);
  :func:`new_cert` -> :func:`check_new_cert`; :func:`set_cert`, :func:`set_cert_ocsp`
  -> :func:`check_set_cert`; :func:`commit_cert` -> :func:`check_commit_cert`;
  :func:`abort_cert` -> :func:`check_abort_cert`; :func:`set_ocsp_response` ->
  :func:`check_set_ocsp`; :class:`Transaction` (set [+ OCSP], commit, abort, and the
  judgement of their replies: the one implementation of a certificate transaction);
* crt-lists: :func:`show_crtlists` -> :func:`parse_show_crtlists`; :func:`show_crtlist`
  -> :func:`parse_show_crtlist`; :func:`add_crtlist` -> :func:`check_add_crtlist`;
* the usage table's marks (fe_sni's stick table: ``gpt0`` = the slot of a loaded host):
  :func:`set_mark` -> :func:`check_set_mark`; :func:`unmark` -> :func:`check_unmark`;
  :func:`clear_entry` -> :func:`check_clear_table`; :func:`show_entry`,
  :func:`show_marked` -> :func:`parse_show_table` (:class:`TableEntry`), :func:`is_table_dump`;
* ticket keys: :func:`show_tls_keys` -> :func:`parse_show_tls_keys`; :func:`set_tls_key`
  -> :func:`check_set_tls_key`;
* maps (``fe_http``'s HTTP-01 answers): :func:`add_map` -> :func:`check_empty`;
  :func:`del_map` -> :func:`check_del_map`; :func:`parse_show_map`;
* statistics (fe_tls's QUIC listeners): :func:`show_frontend_stats` ->
  :func:`parse_quic_counters` (:class:`QuicCounters`).

One module per section (``_framing``, ``_session``, ``_certs``, ``_crtlist``,
``_table``, ``_tickets``, ``_maps``, ``_stats``); import from this package, not from them.
"""

from __future__ import annotations

from certagent.runtime.protocol._certs import (
    CertDetails,
    CertList,
    Transaction,
    abort_cert,
    check_abort_cert,
    check_commit_cert,
    check_new_cert,
    check_set_cert,
    check_set_ocsp,
    commit_cert,
    new_cert,
    parse_cert_details,
    parse_show_ssl_cert,
    set_cert,
    set_cert_ocsp,
    set_ocsp_response,
    show_cert,
    show_certs,
)
from certagent.runtime.protocol._crtlist import (
    add_crtlist,
    add_crtlist_line,
    check_add_crtlist,
    parse_show_crtlist,
    parse_show_crtlists,
    show_crtlist,
    show_crtlists,
)
from certagent.runtime.protocol._framing import (
    DEFAULT_BUFSIZE,
    LOCKED,
    PROMPT,
    Command,
    ReplySplitter,
    check_empty,
    encode,
    shown,
)
from certagent.runtime.protocol._maps import (
    add_map,
    check_del_map,
    del_map,
    parse_show_map,
)
from certagent.runtime.protocol._session import (
    Identity,
    master_reload,
    parse_identity,
    parse_show_info,
    prompt,
    show_build,
    show_info,
)
from certagent.runtime.protocol._stats import (
    QuicCounters,
    parse_quic_counters,
    show_frontend_stats,
)
from certagent.runtime.protocol._table import (
    IN_USE,
    TableEntry,
    check_clear_table,
    check_set_mark,
    check_unmark,
    clear_entry,
    is_table_dump,
    parse_show_table,
    set_mark,
    show_entry,
    show_marked,
    unmark,
)
from certagent.runtime.protocol._tickets import (
    NO_TLS_KEYS_FILE,
    check_set_tls_key,
    parse_show_tls_keys,
    set_tls_key,
    show_tls_keys,
)

__all__ = [
    "DEFAULT_BUFSIZE",
    "IN_USE",
    "LOCKED",
    "NO_TLS_KEYS_FILE",
    "PROMPT",
    "CertDetails",
    "CertList",
    "Command",
    "Identity",
    "QuicCounters",
    "ReplySplitter",
    "TableEntry",
    "Transaction",
    "abort_cert",
    "add_crtlist",
    "add_crtlist_line",
    "add_map",
    "check_abort_cert",
    "check_add_crtlist",
    "check_clear_table",
    "check_commit_cert",
    "check_del_map",
    "check_empty",
    "check_new_cert",
    "check_set_cert",
    "check_set_mark",
    "check_set_ocsp",
    "check_set_tls_key",
    "check_unmark",
    "clear_entry",
    "commit_cert",
    "del_map",
    "encode",
    "is_table_dump",
    "master_reload",
    "new_cert",
    "parse_cert_details",
    "parse_identity",
    "parse_quic_counters",
    "parse_show_crtlist",
    "parse_show_crtlists",
    "parse_show_info",
    "parse_show_map",
    "parse_show_ssl_cert",
    "parse_show_table",
    "parse_show_tls_keys",
    "prompt",
    "set_cert",
    "set_cert_ocsp",
    "set_mark",
    "set_ocsp_response",
    "set_tls_key",
    "show_build",
    "show_cert",
    "show_certs",
    "show_crtlist",
    "show_crtlists",
    "show_entry",
    "show_frontend_stats",
    "show_info",
    "show_marked",
    "show_tls_keys",
    "shown",
    "unmark",
]
