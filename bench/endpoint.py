"""Where the endpoint is and how to reach it: the runtime URL, credentials from botocore's
usual chain, and the pre-run reachability check. No Locust or gevent here: ``mme bench`` runs
these checks in its own process before the run starts."""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from mme.errors import MmeError, UsageError

SIGNING_SERVICE = "sagemaker"  # SigV4 signing name of the SageMaker runtime
PLACEHOLDER_KEY = "mme-local-placeholder"


@dataclass(frozen=True)
class EndpointAddress:
    name: str  # EndpointName
    url: str  # runtime base URL, no trailing slash
    region: str
    custom_url: bool  # --endpoint-url was given (local endpoint, proxy, VPC endpoint...)

    @property
    def invocations_path(self) -> str:
        return f"/endpoints/{quote(self.name, safe='')}/invocations"

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def is_local(self) -> bool:
        host = self.host
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    @property
    def is_aws(self) -> bool:
        return self.host.endswith(".amazonaws.com") or self.host.endswith(".amazonaws.com.cn")


def default_region() -> str:
    import botocore.session

    return botocore.session.get_session().get_config_variable("region") or "us-east-1"


def configured_runtime_url(region: str) -> str | None:
    """The SageMaker Runtime address boto3 itself would use when configuration moves it
    (``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``, ``AWS_ENDPOINT_URL`` or a profile's ``services``
    section: ``mme cloud``, a VPC endpoint), else None (AWS's own for the region)."""
    import botocore.session

    client = botocore.session.get_session().create_client(
        "sagemaker-runtime", region_name=region, aws_access_key_id="unused", aws_secret_access_key="unused")
    url = client.meta.endpoint_url
    return None if urlsplit(url).hostname.endswith((".amazonaws.com", ".amazonaws.com.cn")) else url


def resolve_address(name: str, endpoint_url: str | None, region: str | None) -> EndpointAddress:
    if not name or "/" in name:
        raise UsageError(f"--endpoint must be an endpoint name (got {name!r})")
    region = region or default_region()
    endpoint_url = endpoint_url or configured_runtime_url(region)
    if endpoint_url is None:
        suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
        return EndpointAddress(name, f"https://runtime.sagemaker.{region}.{suffix}", region, False)
    parts = urlsplit(endpoint_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--endpoint-url must look like http://HOST:PORT (got {endpoint_url!r})")
    if parts.path not in ("", "/") or parts.query:
        raise UsageError(f"--endpoint-url is the runtime's base URL without a path (got {endpoint_url!r})")
    try:
        _ = parts.port  # urlsplit checks the port only when it is read
    except ValueError:
        raise UsageError(f"--endpoint-url has an invalid port (got {endpoint_url!r})") from None
    return EndpointAddress(name, endpoint_url.rstrip("/"), region, True)


def resolve_credentials(address: EndpointAddress):
    """botocore's credential chain (environment, shared files, SSO, instance role...). A
    non-AWS endpoint URL (the local endpoint, which checks no signature) gets placeholder
    credentials when the chain finds none. Returns (credentials, description); the
    description never contains secrets."""
    import botocore.session
    from botocore.credentials import Credentials
    from botocore.exceptions import BotoCoreError

    try:
        credentials = botocore.session.get_session().get_credentials()
    except BotoCoreError as exc:
        raise MmeError(f"cannot load AWS credentials ({exc})") from None
    if credentials is not None:
        return credentials, f"botocore chain ({credentials.method})"
    if address.custom_url and not address.is_aws:
        return Credentials(PLACEHOLDER_KEY, PLACEHOLDER_KEY), "placeholder (no credentials found; non-AWS endpoint URL)"
    raise MmeError("no AWS credentials found (botocore looks at AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                   "AWS_PROFILE, ~/.aws/credentials, SSO and instance roles); configure one of them")


def check_reachable(address: EndpointAddress, timeout_s: float = 5.0) -> None:
    """Before the run: a local endpoint must answer ``GET /ping``; any other must accept a TCP connection."""
    where = f"endpoint {address.url}"
    try:
        if address.is_local and address.url.startswith("http://"):
            connection = http.client.HTTPConnection(address.host, address.port, timeout=timeout_s)
            try:
                connection.request("GET", "/ping")
                connection.getresponse().read()
            finally:
                connection.close()
        else:
            with socket.create_connection((address.host, address.port), timeout=timeout_s):
                pass
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        hint = " (start it with 'mme serve', or check --endpoint-url)" if address.is_local else ""
        raise MmeError(f"{where} is unreachable: {reason}{hint}") from None


def _get_json(base_url: str, path: str, timeout_s: float) -> object | None:
    """``GET {base_url}{path}`` as JSON; None when it does not answer 200 with JSON."""
    parts = urlsplit(base_url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = cls(parts.hostname or "localhost", parts.port, timeout=timeout_s)
    try:
        connection.request("GET", path, headers={"Accept": "application/json"})
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return None
        return json.loads(body)
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()


def fetch_metrics(base_url: str, timeout_s: float = 5.0) -> dict | None:
    """``GET {endpoint_url}/metrics.json`` (our local endpoint's snapshot); None when absent."""
    data = _get_json(base_url, "/metrics.json", timeout_s)
    return data if isinstance(data, dict) else None


def fetch_mode(base_url: str, timeout_s: float = 10.0) -> str | None:
    """"multi" or "single" for a local endpoint (``mme serve --mode``, from ``GET /targets``);
    None where the endpoint does not say (SageMaker, other servers)."""
    data = _get_json(base_url, "/targets", timeout_s)
    mode = data.get("mode") if isinstance(data, dict) else None
    return mode if mode in ("multi", "single") else None


def fetch_targets(base_url: str, timeout_s: float = 10.0) -> tuple[str, ...] | None:
    """``GET {endpoint_url}/targets``: every TargetModel a local endpoint (``mme serve``)
    answers for; None where the endpoint does not list them (SageMaker, other servers)."""
    data = _get_json(base_url, "/targets", timeout_s)
    names = data.get("targets") if isinstance(data, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return tuple(names)
