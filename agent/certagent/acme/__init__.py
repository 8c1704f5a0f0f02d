"""ACME (RFC 8555, 8737, 9773): a small async client on aiohttp and its sans-IO core."""

from certagent.acme.ari import RenewalInfo, cert_id, next_check, renewal_time
from certagent.acme.challenges import (
    ACME_TLS_ALPN,
    HTTP01_PREFIX,
    ChallengeCertificate,
    http01_path,
    key_authorization,
    tls_alpn01_certificate,
)
from certagent.acme.client import AcmeClient
from certagent.acme.csr import CertKeyType, key_types, make_csr, new_key
from certagent.acme.errors import (
    AccountDoesNotExist,
    AcmeDeadline,
    AcmeError,
    AcmeProblem,
    AcmeProtocolError,
    CaUnavailable,
    ChallengeFailed,
    ExternalAccountRequired,
    OrderFailed,
    ProfileNotOffered,
    RateLimited,
    UserActionRequired,
)
from certagent.acme.issue import ChallengeSolver, IssuedCertificate, obtain_certificate
from certagent.acme.jws import AccountKey, ExternalAccountBinding
from certagent.acme.messages import validate_token
from certagent.acme.resources import (
    DNS_01,
    HTTP_01,
    TLS_ALPN_01,
    Account,
    Authorization,
    Challenge,
    Directory,
    Identifier,
    Order,
    Problem,
)
from certagent.acme.timing import Clock

__all__ = [
    "ACME_TLS_ALPN",
    "DNS_01",
    "HTTP01_PREFIX",
    "HTTP_01",
    "TLS_ALPN_01",
    "Account",
    "AccountDoesNotExist",
    "AccountKey",
    "AcmeClient",
    "AcmeDeadline",
    "AcmeError",
    "AcmeProblem",
    "AcmeProtocolError",
    "Authorization",
    "CaUnavailable",
    "CertKeyType",
    "Challenge",
    "ChallengeCertificate",
    "ChallengeFailed",
    "ChallengeSolver",
    "Clock",
    "Directory",
    "ExternalAccountBinding",
    "ExternalAccountRequired",
    "Identifier",
    "IssuedCertificate",
    "Order",
    "OrderFailed",
    "Problem",
    "ProfileNotOffered",
    "RateLimited",
    "RenewalInfo",
    "UserActionRequired",
    "cert_id",
    "http01_path",
    "key_authorization",
    "key_types",
    "make_csr",
    "new_key",
    "next_check",
    "obtain_certificate",
    "renewal_time",
    "tls_alpn01_certificate",
    "validate_token",
]
