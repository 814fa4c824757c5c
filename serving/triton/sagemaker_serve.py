"""SageMaker's Triton ``serve`` script, multi-model (MME) mode, ported to Python.

Source: github.com/triton-inference-server/server, ``docker/sagemaker/serve`` at commit
e1db8a603 (Triton 2.73, main). NVIDIA's images built with the SageMaker endpoint copy it to
``/usr/bin/serve`` and carry the label ``com.amazonaws.sagemaker.capabilities.multi-models=true``
(``build.py``, the ``if "sagemaker" in endpoints`` block). With ``SAGEMAKER_MULTI_MODEL=true``
it runs::

    tritonserver --allow-sagemaker=true --allow-http=false --model-control-mode=explicit $SAGEMAKER_ARGS

where ``$SAGEMAKER_ARGS`` is built from the ``SAGEMAKER_TRITON_*`` variables
(:func:`serve_arguments`). Quirks kept on purpose, because tritonserver sees them:

* ``SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING``'s *value* becomes ``--model-namespacing=<value>``.
* ``SAGEMAKER_TRITON_PING_MODE`` is assigned as a plain shell variable: tritonserver (which
  reads it, default ``ready``, src/sagemaker_server.h) sees ``live`` (or the override) only
  when the variable was already exported (:func:`server_environment`).
* ``$SAGEMAKER_ARGS`` is expanded unquoted, so every value is split on blanks (IFS); a
  ``SAGEMAKER_TRITON_ADDITIONAL_ARGS="--a=1 --b=2"`` gives two arguments. (Pathname
  expansion of words holding ``*?[`` is not reproduced.)
* ``--model-load-gpu-limit`` is repeated per line of ``nvidia-smi -L`` (``wc -l``).
* An invalid ``SAGEMAKER_TRITON_INFERENCE_TYPE`` stops it (here: UsageError).

The port takes the model repository as a parameter (serve's is ``/tmp/sagemaker``, an empty
placeholder in MME mode). :func:`config_arguments` and :func:`sagemaker_environment` say how a
``TritonServerConfig`` maps onto the script: its ports as settings, or as flags where no
setting exists (HTTP), inserted before the user's ``SAGEMAKER_TRITON_ADDITIONAL_ARGS``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from mme.errors import UsageError

if TYPE_CHECKING:
    from serving.triton.config import TritonServerConfig

SERVE_SOURCE = "triton-inference-server/server docker/sagemaker/serve @ e1db8a603"
SAGEMAKER_ENV_PREFIX = "SAGEMAKER_TRITON_"
MULTI, SINGLE = "multi", "single"  # serve's two modes: a multi-model endpoint, or a real-time one (one model)
MODES = (MULTI, SINGLE)
MULTI_MODEL_REPOSITORY = "/tmp/sagemaker"  # serve: SAGEMAKER_MULTI_MODEL_REPO
SINGLE_MODEL_REPOSITORY = "/opt/ml/model"  # serve: SAGEMAKER_SINGLE_MODEL_REPO (a real-time endpoint's model)
DEFAULT_MODEL_ENV = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"  # single-model mode: the model /invocations runs
SERVE_SCRIPT_PATH = Path("/usr/bin/serve")  # build.py: COPY docker/sagemaker/serve /usr/bin/.
SERVE_MARKER = "tritonserver --allow-sagemaker=true"  # how a Triton serve script is recognised
MULTI_MODEL_LABEL = "com.amazonaws.sagemaker.capabilities.multi-models"  # build.py: LABEL ...=true
RESERVED_KEYS = ("SAGEMAKER_MULTI_MODEL", "SAGEMAKER_BIND_TO_PORT")  # the endpoint sets these
SAFE_PORT_RANGE = "SAGEMAKER_SAFE_PORT_RANGE"
PING_MODE = "SAGEMAKER_TRITON_PING_MODE"
OVERRIDE_PING_MODE = "SAGEMAKER_TRITON_OVERRIDE_PING_MODE"
ADDITIONAL_ARGS = "SAGEMAKER_TRITON_ADDITIONAL_ARGS"
GPU_LIMIT = "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT"
INFERENCE_TYPES = ("infer", "generate", "generate_stream")  # serve: SAGEMAKER_TRITON_INFERENCE_TYPE check
LEADING_ARGS = ("--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit")
_IFS = re.compile(r"[ \t\n]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HELP_FLAG = re.compile(r"^\s+(--[A-Za-z0-9][A-Za-z0-9-]*)", re.MULTILINE)

# serve's optional `if [ -n "$VAR" ]; then SAGEMAKER_ARGS="... --flag=$VAR"` blocks, in script
# order: these four after --allow-metrics, the three log levels after --log-verbose.
_OPTIONAL_PORTS = (
    ("SAGEMAKER_TRITON_METRICS_PORT", "--metrics-port"),
    ("SAGEMAKER_TRITON_GRPC_PORT", "--grpc-port"),
    ("SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT", "--buffer-manager-thread-count"),
    ("SAGEMAKER_TRITON_THREAD_COUNT", "--sagemaker-thread-count"),
)
_OPTIONAL_LOG = (
    ("SAGEMAKER_TRITON_LOG_INFO", "--log-info"),
    ("SAGEMAKER_TRITON_LOG_WARNING", "--log-warning"),
    ("SAGEMAKER_TRITON_LOG_ERROR", "--log-error"),
)


def split_words(text: str) -> list[str]:
    """``text`` split as bash splits an unquoted expansion with the default IFS."""
    return [word for word in _IFS.split(text) if word]


def _given(env: Mapping[str, str], key: str) -> str | None:
    """``$key`` when ``[ -n "$key" ]`` holds (set and not empty), else None."""
    return env.get(key) or None


def serve_arguments(
    env: Mapping[str, str],
    *,
    model_repository: str = MULTI_MODEL_REPOSITORY,
    gpu_count: int = 0,
    extra: Sequence[str] = (),
    default_model: str | None = None,
) -> list[str]:
    """tritonserver's argv after the binary, as ``serve`` builds it with ``SAGEMAKER_MULTI_MODEL=true``,
    or, given ``default_model``, in single-model mode (serve's ``--load-model=$SAGEMAKER_TRITON_DEFAULT_MODEL_NAME``
    at the end of its arguments; the repository is then the model's, SageMaker's ``/opt/ml/model``).

    ``env`` is the environment the script sees; ``gpu_count`` stands for its ``nvidia-smi -L | wc -l``
    (see :func:`nvidia_smi_line_count`); ``extra`` (kept as given, never split) goes just before the
    words of ``SAGEMAKER_TRITON_ADDITIONAL_ARGS``, so the user's additional arguments still come last.
    Raises UsageError where the script exits 1 (an invalid ``SAGEMAKER_TRITON_INFERENCE_TYPE``).
    """
    inference_type = _given(env, "SAGEMAKER_TRITON_INFERENCE_TYPE")
    if inference_type is not None and inference_type not in INFERENCE_TYPES:
        raise UsageError(
            f"invalid SAGEMAKER_TRITON_INFERENCE_TYPE {inference_type!r} (SageMaker's serve script exits on it); "
            f"set it to one of: {', '.join(INFERENCE_TYPES)}"
        )
    pieces: list[str] = []  # each one word-split like the script's unquoted $SAGEMAKER_ARGS
    namespacing = _given(env, "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING") or "true"  # the value, as serve does
    pieces.append(f"--model-namespacing={namespacing}")
    if _given(env, "SAGEMAKER_BIND_TO_PORT"):
        pieces.append(f"--sagemaker-port={env['SAGEMAKER_BIND_TO_PORT']}")
    if _given(env, SAFE_PORT_RANGE):
        pieces.append(f"--sagemaker-safe-port-range={env[SAFE_PORT_RANGE]}")
    pieces.append(f"--allow-grpc={_given(env, 'SAGEMAKER_TRITON_ALLOW_GRPC') or 'false'}")
    pieces.append(f"--allow-metrics={_given(env, 'SAGEMAKER_TRITON_ALLOW_METRICS') or 'false'}")
    pieces += [f"{flag}={env[key]}" for key, flag in _OPTIONAL_PORTS if _given(env, key)]
    pieces.append(f"--log-verbose={_given(env, 'SAGEMAKER_TRITON_LOG_VERBOSE') or 'true'}")
    pieces += [f"{flag}={env[key]}" for key, flag in _OPTIONAL_LOG if _given(env, key)]
    shm_default = _given(env, "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE") or "16777216"  # 16 MiB
    shm_growth = _given(env, "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE") or "1048576"  # 1 MiB
    pieces.append(f"--backend-config=python,shm-default-byte-size={shm_default}")
    pieces.append(f"--backend-config=python,shm-growth-byte-size={shm_growth}")
    if _given(env, "SAGEMAKER_TRITON_TENSORFLOW_VERSION"):
        pieces.append(f"--backend-config=tensorflow,version={env['SAGEMAKER_TRITON_TENSORFLOW_VERSION']}")
    if _given(env, GPU_LIMIT):
        pieces += [f"--model-load-gpu-limit {i}:{env[GPU_LIMIT]}" for i in range(gpu_count)]
    if default_model is not None:
        pieces.append(f"--load-model={default_model}")
    words = [word for piece in pieces for word in split_words(piece)]
    additional = split_words(env.get(ADDITIONAL_ARGS, ""))
    return [*LEADING_ARGS, f"--model-repository={model_repository}", *words, *extra, *additional]


def server_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment tritonserver receives from ``serve`` (MME mode) started with ``env``.

    serve assigns ``SAGEMAKER_TRITON_PING_MODE`` (``live``, or ``$SAGEMAKER_TRITON_OVERRIDE_PING_MODE``)
    without ``export``: the new value reaches tritonserver only when the variable was already in
    the environment; otherwise tritonserver falls back to its default, ``ready``.
    """
    result = dict(env)
    if PING_MODE in result:
        result[PING_MODE] = _given(env, OVERRIDE_PING_MODE) or "live"
    return result


def additional_args(env: Mapping[str, str], before: Sequence[str], after: Sequence[str] = ()) -> str:
    """A ``SAGEMAKER_TRITON_ADDITIONAL_ARGS`` value carrying ``before``, the words of ``env``'s own,
    then ``after``. serve splits it on blanks, so an argument holding one is refused."""
    for arg in [*before, *after]:
        if split_words(arg) != [arg]:
            raise UsageError(f"cannot pass {arg!r} through SageMaker's serve script (it splits "
                             f"{ADDITIONAL_ARGS} on blanks); use paths and values without spaces")
    return " ".join([*before, *split_words(env.get(ADDITIONAL_ARGS, "")), *after])


# -- how a TritonServerConfig maps onto serve ------------------------------------------------

def config_arguments(config: TritonServerConfig, bind_host: str | None) -> list[str]:
    """Flags for what ``config`` asks that serve's variables cannot say: Triton's HTTP endpoint
    (serve passes ``--allow-http=false``), with ``bind_host`` the addresses to bind (Triton's
    default: 0.0.0.0), and ``--log-verbose`` when the config sets it."""
    args = [] if config.http_port is None else ["--allow-http=true", f"--http-port={config.http_port}"]
    for port, flag in ((config.http_port, "--http-address"), (config.grpc_port, "--grpc-address"),
                       (config.metrics_port, "--metrics-address")):
        if bind_host and port is not None:
            args.append(f"{flag}={bind_host}")
    if config.log_verbose is not None:
        args.append(f"--log-verbose={config.log_verbose}")
    return args


def sagemaker_environment(config: TritonServerConfig) -> dict[str, str]:
    """The variables serve reads for ``config``: ``sagemaker_env``, the config's gRPC/metrics
    ports (each variable unless ``sagemaker_env`` or ``env`` sets it), and the two the endpoint owns."""
    user = {**config.env, **config.sagemaker_env}
    settings = dict(config.sagemaker_env)
    for port, name in ((config.grpc_port, "GRPC"), (config.metrics_port, "METRICS")):
        if port is not None:
            for key, value in ((f"SAGEMAKER_TRITON_ALLOW_{name}", "true"), (f"SAGEMAKER_TRITON_{name}_PORT", str(port))):
                if key not in user:
                    settings[key] = value
    if config.default_model is None:
        settings["SAGEMAKER_MULTI_MODEL"] = "true"
    else:  # serve exports it; tritonserver's /invocations runs this model (src/sagemaker_server.cc)
        settings[DEFAULT_MODEL_ENV] = config.default_model
    settings["SAGEMAKER_BIND_TO_PORT"] = str(config.sagemaker_port)
    return settings


def nvidia_smi_line_count(env: Mapping[str, str] | None = None) -> int:
    """serve's ``num_gpus=$(nvidia-smi -L | wc -l)``: lines printed (MIG devices included); 0 without nvidia-smi."""
    env = dict(os.environ if env is None else env)
    program = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if program is None:
        return 0
    try:
        done = subprocess.run([program, "-L"], capture_output=True, text=True, timeout=30, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return done.stdout.count("\n")


def script_gpu_count(env: Mapping[str, str]) -> int:
    """The GPU count serve would use for ``env``: nvidia-smi is consulted only when the limit is set."""
    return nvidia_smi_line_count(env) if _given(env, GPU_LIMIT) else 0


def parse_env_assignments(items: Sequence[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a dict (a later KEY wins)."""
    settings: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env {item!r} has no '='; write it as KEY=VALUE, e.g. --env SAGEMAKER_TRITON_LOG_VERBOSE=false")
        if not key:
            raise UsageError(f"--env {item!r} has an empty name; write it as KEY=VALUE")
        if not _ENV_NAME.match(key):
            raise UsageError(f"--env {item!r}: {key!r} is not a variable name; use letters, digits and _ only")
        if key in RESERVED_KEYS:
            raise UsageError(f"--env {key} is set by the endpoint itself (as SageMaker does); drop that --env")
        settings[key] = value
    return settings


def sagemaker_settings_from_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that serve reads: ``SAGEMAKER_TRITON_*`` and ``SAGEMAKER_SAFE_PORT_RANGE``."""
    return {k: v for k, v in environ.items() if k.startswith(SAGEMAKER_ENV_PREFIX) or k == SAFE_PORT_RANGE}


def is_serve_script(path: str | os.PathLike) -> bool:
    """True for a readable file holding serve's tritonserver line."""
    try:
        with open(path, "rb") as fh:
            return SERVE_MARKER.encode() in fh.read(1 << 20)
    except OSError:
        return False


def find_serve_script(path_env: str | None = None) -> Path | None:
    """``/usr/bin/serve``, else ``serve`` on PATH, when it is Triton's; else None."""
    candidates = [SERVE_SCRIPT_PATH, shutil.which("serve", path=path_env)]
    return next((Path(c) for c in candidates if c and is_serve_script(c)), None)


@functools.lru_cache(maxsize=32)
def _help_flags(binary: str, ld_library_path: str, path: str) -> frozenset[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": ld_library_path, "PATH": path}
    try:
        done = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(_HELP_FLAG.findall(done.stdout + done.stderr))  # tritonserver --help exits 1


def supported_flags(binary: str | os.PathLike, env: Mapping[str, str]) -> frozenset[str]:
    """The ``--flags`` ``binary --help`` lists (run once per binary); empty when unknown: keep everything."""
    return _help_flags(str(binary), env.get("LD_LIBRARY_PATH", ""), env.get("PATH", os.defpath))


def flag_name(arg: str) -> str:
    """``--name=value`` -> ``--name``."""
    return arg.split("=", 1)[0]


def drop_unsupported(args: Sequence[str], supported: frozenset[str] | None) -> tuple[list[str], list[str]]:
    """(kept, dropped): ``args`` without the flags ``supported`` lacks. A flag written without ``=``
    takes the next word as its value (``--model-load-gpu-limit 0:0.5``) and is dropped with it.
    An empty or None ``supported`` means unknown: everything is kept."""
    if not supported:
        return list(args), []
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        step = 1
        if arg.startswith("--") and "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("--"):
            step = 2
        if arg.startswith("--") and flag_name(arg) not in supported:
            dropped += args[i:i + step]
        else:
            kept += args[i:i + step]
        i += step
    return kept, dropped


def dropped_flags(dropped: Sequence[str]) -> list[str]:
    """The flag names in a ``dropped`` list, once each, in order."""
    return list(dict.fromkeys(flag_name(a) for a in dropped if a.startswith("--")))
