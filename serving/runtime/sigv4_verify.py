"""Verify the SigV4 signature of an InvokeEndpoint request against one configured key pair.

``mme serve --require-signature`` answers only requests signed with the access key and secret
it was given, as SageMaker Runtime answers only requests signed by a known AWS key. The
Authorization header (``AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request,
SignedHeaders=..., Signature=...``) is parsed; the key must be the configured one; X-Amz-Date
within 15 minutes of now (as AWS checks); then the canonical request is rebuilt from what was
received (method, the path and query exactly as sent, the signed headers' values, the payload
hash) and signed again with botocore's own SigV4 code (``SigV4Auth``) for the scope the client
declared, compared in constant time. Presigned (query-string) requests are refused.

:func:`check_header` runs before the body is read; :func:`check_signature` after. Each returns
a :class:`Rejection` (None: accepted) that serving/runtime/errors_sagemaker.py turns into AWS's 403.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

# where `mme serve` reads the key pair from by default (the secret stays off the command line)
ACCESS_KEY_ENV = "MME_SERVE_ACCESS_KEY_ID"
SECRET_KEY_ENV = "MME_SERVE_SECRET_ACCESS_KEY"
ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = dt.timedelta(minutes=15)  # AWS's limit either side of now
TIMESTAMP = "%Y%m%dT%H%M%SZ"
_FIELD = re.compile(r"\s*(Credential|SignedHeaders|Signature)=([^,\s]*)\s*")

INVALID_TOKEN = "The security token included in the request is invalid."
SIGNATURE_MISMATCH = ("The request signature we calculated does not match the signature you provided. Check your AWS "
                      "Secret Access Key and signing method. Consult the service documentation for details.")


@dataclass(frozen=True)
class Credentials:
    """The one key pair ``mme serve`` accepts (the secret is never printed)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)


@dataclass(frozen=True)
class Rejection:
    """Why a request is refused: AWS's error code (403) and message."""

    code: str  # UnrecognizedClientException, InvalidSignatureException, IncompleteSignatureException
    message: str


@dataclass(frozen=True)
class Authorization:
    """The parsed Authorization header."""

    access_key_id: str
    date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str


def _incomplete(message: str) -> Rejection:
    return Rejection("IncompleteSignatureException", message)


def parse_authorization(header: str) -> Authorization | Rejection:
    """The fields of an ``AWS4-HMAC-SHA256`` Authorization header, or why it is malformed."""
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        return _incomplete(f"Unsupported signing algorithm {algorithm!r}; sign with {ALGORITHM} (SigV4).")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        match = _FIELD.fullmatch(part)
        if match is None:
            return _incomplete(f"Authorization header has a malformed part {part.strip()!r}; expected "
                               "Credential=..., SignedHeaders=..., Signature=...")
        fields[match.group(1)] = match.group(2)
    for name in ("Credential", "SignedHeaders", "Signature"):
        if not fields.get(name):
            return _incomplete(f"Authorization header requires '{name}' parameter. Authorization={header}")
    scope = fields["Credential"].split("/")
    if len(scope) != 5 or scope[4] != "aws4_request" or not all(scope):
        return _incomplete(f"Credential should be KEY/YYYYMMDD/REGION/SERVICE/aws4_request, not {fields['Credential']!r}.")
    signed = tuple(fields["SignedHeaders"].split(";"))
    return Authorization(scope[0], scope[1], scope[2], scope[3], signed, fields["Signature"])


def check_header(authorization: str, amz_date: str | None, query: Mapping[str, str], credentials: Credentials,
                 now: dt.datetime | None = None) -> Authorization | Rejection:
    """What can be checked before the body is read: the header's form, the key and the time."""
    if "X-Amz-Signature" in query:
        return _incomplete("This endpoint (mme serve --require-signature) does not accept presigned query-string "
                           "requests; sign the Authorization header, as boto3 does.")
    parsed = parse_authorization(authorization)
    if isinstance(parsed, Rejection):
        return parsed
    if not hmac.compare_digest(parsed.access_key_id.encode(), credentials.access_key_id.encode()):
        return Rejection("UnrecognizedClientException", INVALID_TOKEN)
    if amz_date is None:
        return _incomplete("Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header. "
                           "(mme serve reads X-Amz-Date, which boto3 sends.)")
    try:
        signed_at = dt.datetime.strptime(amz_date, TIMESTAMP).replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return _incomplete(f"X-Amz-Date {amz_date!r} is not an ISO-8601 basic timestamp such as 20240101T000000Z.")
    if parsed.date != amz_date[:8]:
        return Rejection("InvalidSignatureException", f"Date in Credential scope does not match YYYYMMDD from "
                         f"ISO-8601 version of date from HTTP: '{parsed.date}' != '{amz_date[:8]}', from '{amz_date}'.")
    now = now or dt.datetime.now(dt.timezone.utc)
    if signed_at < now - MAX_SKEW:
        return Rejection("InvalidSignatureException", f"Signature expired: {amz_date} is now earlier than "
                         f"{(now - MAX_SKEW).strftime(TIMESTAMP)} ({now.strftime(TIMESTAMP)} - 15 min.)")
    if signed_at > now + MAX_SKEW:
        return Rejection("InvalidSignatureException", f"Signature not yet current: {amz_date} is still later than "
                         f"{(now + MAX_SKEW).strftime(TIMESTAMP)} ({now.strftime(TIMESTAMP)} + 15 min.)")
    return parsed


def expected_signature(auth: Authorization, credentials: Credentials, *, method: str, raw_path: str,
                       headers: Iterable[tuple[str, str]], body: bytes, amz_date: str) -> str:
    """The signature the client should have sent: botocore's SigV4 over the request as received.

    ``raw_path`` is the path and query exactly as sent (not re-quoted); ``headers`` all received
    (name, value) pairs, of which only the signed ones count. The payload hash is
    X-Amz-Content-Sha256 when that header is signed, else the body's SHA-256, as botocore signs it."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.compat import HTTPHeaders
    from botocore.credentials import Credentials as BotoCredentials

    signed = set(auth.signed_headers)
    received = HTTPHeaders()
    for name, value in headers:
        if name.lower() in signed:
            received[name.lower()] = value

    class _AsReceived(SigV4Auth):
        def headers_to_sign(self, request):  # exactly the headers the client named, none left out
            return received

    request = AWSRequest(method=method, url=f"http://{received.get('host', 'localhost')}{raw_path}",
                         headers=dict(received.items()), data=body)
    request.context["timestamp"] = amz_date
    signer = _AsReceived(BotoCredentials(credentials.access_key_id, credentials.secret_access_key),
                         auth.service, auth.region)
    canonical = signer.canonical_request(request)  # over http botocore always hashes the body
    return signer.signature(signer.string_to_sign(request, canonical), request)


def check_signature(auth: Authorization, credentials: Credentials, *, method: str, raw_path: str,
                    headers: Iterable[tuple[str, str]], body: bytes, amz_date: str) -> Rejection | None:
    """None when the request carries the signature the configured secret gives it."""
    pairs = list(headers)
    names = {name.lower() for name, _ in pairs}
    if "host" not in auth.signed_headers or not set(auth.signed_headers) <= names:
        missing = sorted(set(auth.signed_headers) - names) or ["host (it must be signed)"]
        return _incomplete(f"Signed header(s) {', '.join(missing)} missing from the request.")
    for name, value in pairs:
        if name.lower() == "x-amz-content-sha256" and value != hashlib.sha256(body).hexdigest():
            return Rejection("InvalidSignatureException",
                             "The provided 'x-amz-content-sha256' header does not match what was computed.")
    expected = expected_signature(auth, credentials, method=method, raw_path=raw_path, headers=pairs, body=body,
                                  amz_date=amz_date)
    if not hmac.compare_digest(expected.encode(), auth.signature.encode()):
        return Rejection("InvalidSignatureException", SIGNATURE_MISMATCH)
    return None
