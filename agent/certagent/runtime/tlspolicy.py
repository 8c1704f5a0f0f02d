"""The TLS settings of the generated haproxy.cfg: a profile of Mozilla's guideline, or your lists.

Pure rendering of ``global`` lines (``ssl-default-bind-*``), used by
``certagent init --tls``.  docs/haproxy.md ("TLS settings") says what each
profile excludes and why.

- ``intermediate`` (the default): TLS 1.2 and 1.3; in TLS 1.2 only ECDHE key
  exchange with AEAD ciphers (AES-GCM, ChaCha20-Poly1305: no CBC, no RSA key
  exchange, and none of the guideline's DHE suites); the client's cipher order
  wins (the guideline's ``server_preferred_order: false``).
- ``modern``: TLS 1.3 only.

Both limit the key exchange groups to X25519, P-256 and P-384, with the
post-quantum hybrid X25519MLKEM768 first where HAProxy runs on OpenSSL 3.5 or
later.  That choice is made by HAProxy when it reads the file
(``.if openssl_version_atleast(3.5.0)``, a predicate HAProxy has had since 2.5
though documented only from 3.3): OpenSSL 3.0 refuses the name, so one file
serves Debian 12's HAProxy 2.6 and Debian 13's 3.0 alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROFILES = ("intermediate", "modern")

#: TLS 1.2 suites: ECDHE + AEAD, ECDSA before RSA at each strength (Mozilla's order).
INTERMEDIATE_CIPHERS = ":".join(
    [
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    ]
)
#: TLS 1.3 suites: all three of TLS 1.3's (the 8-byte-tag CCM ones are left out).
CIPHERSUITES = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
CURVES = "X25519:prime256v1:secp384r1"
PQ_CURVES = "X25519MLKEM768:" + CURVES
#: OpenSSL accepts these lists; no space, quote, '#' or '$' reaches haproxy.cfg.
_LIST = re.compile(r"[A-Za-z0-9_+!@=.?*/-]+(:[A-Za-z0-9_+!@=.?*/-]+)*")


@dataclass(frozen=True)
class TlsPolicy:
    """``profile`` and, each replacing the profile's own, the operator's lists."""

    profile: str = "intermediate"
    ciphers: str | None = None  # TLS 1.2 cipher suites (OpenSSL's cipher list syntax)
    ciphersuites: str | None = None  # TLS 1.3 suites
    curves: str | None = None  # key exchange groups, used as given on every version

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"TLS profile {self.profile!r}: use one of {', '.join(PROFILES)}")
        for what, value in (
            ("ciphers", self.ciphers),
            ("ciphersuites", self.ciphersuites),
            ("curves", self.curves),
        ):
            if value is not None and not _LIST.fullmatch(value):
                raise ValueError(
                    f"TLS {what} {value!r}: expected names separated by ':' (OpenSSL's syntax,"
                    " e.g. ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256)"
                )
        if self.profile == "modern" and self.ciphers is not None:
            raise ValueError(
                "TLS ciphers are TLS 1.2 suites; the modern profile allows TLS 1.3 only"
                " (choose TLS 1.3 suites with ciphersuites)"
            )


def tls_lines(policy: TlsPolicy) -> str:
    """The ``global`` lines for ``policy``, comments included, indented as in the template."""
    lines = [
        f"    # TLS: Mozilla's \"{policy.profile}\" guideline (certagent init --tls;"
        " docs/haproxy.md#tls-settings)",
    ]
    if policy.profile == "modern":
        lines.append("    ssl-default-bind-options ssl-min-ver TLSv1.3 prefer-client-ciphers")
    else:
        lines += [
            "    # TLS 1.2 with ECDHE and AEAD ciphers only; the client's order wins",
            "    ssl-default-bind-options ssl-min-ver TLSv1.2 prefer-client-ciphers",
            f"    ssl-default-bind-ciphers {policy.ciphers or INTERMEDIATE_CIPHERS}",
        ]
    lines.append(f"    ssl-default-bind-ciphersuites {policy.ciphersuites or CIPHERSUITES}")
    if policy.curves is not None:
        lines.append(f"    ssl-default-bind-curves {policy.curves}")
    else:
        lines += [
            "    # X25519MLKEM768 (post-quantum hybrid) first where the TLS library has it;",
            "    # OpenSSL before 3.5 (Debian 12's HAProxy 2.6) would refuse its name",
            ".if openssl_version_atleast(3.5.0)",
            f"    ssl-default-bind-curves {PQ_CURVES}",
            ".else",
            f"    ssl-default-bind-curves {CURVES}",
            ".endif",
        ]
    return "\n".join(lines)


#: The default: Mozilla's "intermediate", with the profile's own lists.
INTERMEDIATE = TlsPolicy()
