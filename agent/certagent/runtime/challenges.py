"""HAProxy answering ACME challenges: fe_http's map (HTTP-01), challenge slots (TLS-ALPN-01).

Written through the loader's connection (the one writer of the runtime socket):

* **HTTP-01**: ``fe_http`` returns ``map(<challenge map>)`` of the token in
  ``/.well-known/acme-challenge/<token>``; an answer is one ``add map``, its
  removal one ``del map``.  No file is written: entries live in the worker (a
  reload starts with the empty map file, and :meth:`ChallengeSlots.setup` runs
  again on the new session, after which the responder answers every live
  challenge again).
* **TLS-ALPN-01**: ``fe_sni`` sends a ClientHello offering only ``acme-tls/1``
  straight to ``fe_tls`` (no Lua action).  There, ``challenges`` crt-list lines
  ``/certagent/chal-N.pem [alpn acme-tls/1]`` (added once per HAProxy session,
  with no SNI filter, so HAProxy takes the names from the certificate) hold either
  a placeholder or one name's challenge certificate, re-pointed with
  ``set``/``commit`` like any slot.  While a line holds a name, every client of
  that name gets the challenge certificate (HAProxy picks by SNI, not ALPN), so a
  slot holds it only for the seconds of a validation, and only for a name no
  real slot holds (first issuance: the name has no certificate yet).

Costs: one runtime command per answer or removal; at each new HAProxy session
O(challenge slots) commands.  Nothing grows with the number of certificates.
"""

from __future__ import annotations

import logging

from certagent.certs import pem
from certagent.certs.selfsigned import self_signed
from certagent.errors import AgentError, CommandFailed
from certagent.runtime import protocol, txn
from certagent.runtime.client import RuntimeClient
from certagent.runtime.loader import Loader

log = logging.getLogger(__name__)

#: Names of the challenge slots: ``/certagent/chal-1.pem`` ... (never a load slot's prefix).
CHALLENGE_PREFIX = "/certagent/chal-"
ALPN_OPTIONS = "[alpn acme-tls/1]"
#: How long an answer may wait for the runtime socket (loads go first at most this long).
DEADLINE = 5.0


class ChallengeSlots:
    """This node's HAProxy side of ACME challenges (see the module docstring).

    Implements :class:`certagent.service.challenges.ChallengeAnswerer`.
    """

    def __init__(
        self,
        loader: Loader,
        *,
        map_file: str,
        crt_list: str,
        slots: int,
        prefix: str = CHALLENGE_PREFIX,
        deadline: float = DEADLINE,
    ) -> None:
        self.loader = loader
        self.map_file = map_file
        self.crt_list = crt_list
        self.names = tuple(f"{prefix}{i}.pem" for i in range(1, slots + 1))
        self.deadline = deadline
        self._placeholders = {
            slot: pem.normalise_pem(self_signed(_placeholder_name(i), (_placeholder_name(i),)))
            for i, slot in enumerate(self.names, 1)
        }
        self._holding: dict[str, str] = {}  # name being validated -> its challenge slot
        self.ready = False  # the slots exist in this HAProxy session

    # --- every new HAProxy session (the loader's session hook) --------------------------------

    async def setup(self, client: RuntimeClient) -> None:
        """Make every challenge slot exist, hold its placeholder and be in the crt-list.

        Called with the writer's session (the loader's lock is held): O(slots).
        """
        self._holding.clear()
        self.ready = False
        certs = protocol.parse_show_ssl_cert(await client.execute(protocol.show_certs()))
        listing = await client.execute(protocol.show_crtlist(self.crt_list))
        existing, listed = set(certs.names), set(protocol.parse_show_crtlist(listing))
        for slot in self.names:
            if slot not in existing:
                protocol.check_new_cert(slot, await client.execute(protocol.new_cert(slot)))
            await txn.commit(client, protocol.Transaction(slot, self._placeholders[slot]))
            if slot not in listed:
                reply = await client.execute(
                    protocol.add_crtlist_line(self.crt_list, slot, ALPN_OPTIONS)
                )
                protocol.check_add_crtlist(self.crt_list, slot, reply)
        self.ready = True

    # --- HTTP-01 ------------------------------------------------------------------------------

    async def answer_http01(self, token: str, key_authorization: str) -> None:
        async def add(client: RuntimeClient) -> None:
            command = protocol.add_map(self.map_file, token, key_authorization)
            protocol.check_empty(str(command), await client.execute(command))

        await self.loader.exclusive(add, self.deadline, "an HTTP-01 answer")

    async def forget_http01(self, token: str) -> None:
        async def delete(client: RuntimeClient) -> None:
            command = protocol.del_map(self.map_file, token)
            # a new worker (reload) never had it: "Key not found." is fine
            protocol.check_del_map(str(command), await client.execute(command))

        await self.loader.exclusive(delete, self.deadline, "removing an HTTP-01 answer")

    # --- TLS-ALPN-01 ----------------------------------------------------------------------------

    async def answer_tls_alpn01(self, name: str, pem_bundle: bytes) -> None:
        """Serve ``pem_bundle`` (challenge certificate + key) to clients of ``name``."""
        if self.loader.pool.is_marked(name):
            raise AgentError(
                f"{name} is loaded in a slot: a TLS-ALPN-01 answer would replace its certificate"
                " for every client during the validation; use http-01 for names already served"
            )

        async def put(client: RuntimeClient) -> None:
            if not self.ready:
                await self.setup(client)
            slot = self._holding.get(name) or self._free_slot()
            await txn.commit(client, protocol.Transaction(slot, pem.normalise_pem(pem_bundle)))
            self._holding[name] = slot

        await self.loader.exclusive(put, self.deadline, f"a TLS-ALPN-01 answer for {name}")

    async def forget_tls_alpn01(self, name: str) -> None:
        async def reset(client: RuntimeClient) -> None:
            slot = self._holding.pop(name, None)
            if slot is not None:
                await txn.commit(client, protocol.Transaction(slot, self._placeholders[slot]))

        what = f"removing the TLS-ALPN-01 answer for {name}"
        await self.loader.exclusive(reset, self.deadline, what)

    def _free_slot(self) -> str:
        busy = set(self._holding.values())
        for slot in self.names:
            if slot not in busy:
                return slot
        raise CommandFailed(
            "TLS-ALPN-01 answer",
            f"all {len(self.names)} challenge slots are answering validations; raise"
            " challenge_slots (or acme_concurrency lower)",
        )


def _placeholder_name(number: int) -> str:
    return f"chal-slot-{number}.certagent.invalid"
