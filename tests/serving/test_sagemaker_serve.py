"""serving/triton/sagemaker_serve.py against the real ``serve`` script, and every server kind
started the way it starts Triton.

The reference is a verbatim copy of github.com/triton-inference-server/server
``docker/sagemaker/serve`` at commit e1db8a603 (tests/serving/data/sagemaker_serve), run with
bash, a fake ``tritonserver`` that records its argv and ``SAGEMAKER_TRITON_PING_MODE``, and a
fake ``nvidia-smi`` printing N GPU lines.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from mme.errors import UsageError
from serving.triton import sagemaker_serve as ss

SERVE = Path(__file__).parent / "data" / "sagemaker_serve"
UNSET = "<unset>"

FAKE_TRITONSERVER = """#!/bin/sh
: > "$FAKE_OUT"
for arg in "$@"; do printf '%s\\n' "$arg" >> "$FAKE_OUT"; done
printf '%s\\n' "${SAGEMAKER_TRITON_PING_MODE-<unset>}" > "$FAKE_OUT.ping"
"""
FAKE_NVIDIA_SMI = """#!/bin/sh
i=0
while [ "$i" -lt "${FAKE_GPUS:-0}" ]; do echo "GPU $i: NVIDIA H200 (UUID: GPU-0000000$i)"; i=$((i+1)); done
"""

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


@dataclass(frozen=True)
class ScriptRun:
    code: int
    argv: list[str] | None  # None: tritonserver was not run
    ping_mode: str | None
    output: str


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("fake-bin")
    for name, text in (("tritonserver", FAKE_TRITONSERVER), ("nvidia-smi", FAKE_NVIDIA_SMI)):
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    return directory


def run_serve(fake_bin: Path, tmp_path: Path, env: dict[str, str], gpus: int = 0) -> ScriptRun:
    """The real script in MME mode with exactly ``env`` (plus PATH and the fakes' settings)."""
    out = tmp_path / "argv.txt"
    out.unlink(missing_ok=True)
    full = {"PATH": f"{fake_bin}:/usr/bin:/bin", "FAKE_OUT": str(out), "FAKE_GPUS": str(gpus),
            "SAGEMAKER_MULTI_MODEL": "true", **env}
    done = subprocess.run(["bash", str(SERVE)], env=full, capture_output=True, text=True, timeout=30, check=False)
    if not out.exists():
        return ScriptRun(done.returncode, None, None, done.stdout + done.stderr)
    ping = Path(f"{out}.ping").read_text().rstrip("\n")
    return ScriptRun(done.returncode, out.read_text().splitlines(), ping, done.stdout + done.stderr)


def ported(env: dict[str, str], gpus: int = 0, extra: tuple[str, ...] = ()) -> tuple[list[str], str]:
    full = {"SAGEMAKER_MULTI_MODEL": "true", **env}
    argv = ss.serve_arguments(full, gpu_count=gpus, extra=extra)
    return argv, ss.server_environment(full).get(ss.PING_MODE, UNSET)


EVERY_VARIABLE = {
    "SAGEMAKER_BIND_TO_PORT": "8080",
    "SAGEMAKER_SAFE_PORT_RANGE": "20000-20999",
    "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": "false",
    "SAGEMAKER_TRITON_ALLOW_GRPC": "true",
    "SAGEMAKER_TRITON_ALLOW_METRICS": "true",
    "SAGEMAKER_TRITON_METRICS_PORT": "8002",
    "SAGEMAKER_TRITON_GRPC_PORT": "8001",
    "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT": "4",
    "SAGEMAKER_TRITON_THREAD_COUNT": "16",
    "SAGEMAKER_TRITON_LOG_VERBOSE": "false",
    "SAGEMAKER_TRITON_LOG_INFO": "true",
    "SAGEMAKER_TRITON_LOG_WARNING": "false",
    "SAGEMAKER_TRITON_LOG_ERROR": "true",
    "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "33554432",
    "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "2097152",
    "SAGEMAKER_TRITON_TENSORFLOW_VERSION": "2",
    "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.8",
    "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--exit-timeout-secs=5",
    "SAGEMAKER_TRITON_INFERENCE_TYPE": "generate",
    "SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "ready",
    "SAGEMAKER_TRITON_PING_MODE": "whatever",
}

CASES = {
    "defaults": ({}, 0),
    "every variable set": (EVERY_VARIABLE, 1),
    "disable-namespacing's value is passed as is": ({"SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": "true"}, 0),
    "ping override without the variable exported": ({"SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "ready"}, 0),
    "ping mode exported (empty)": ({"SAGEMAKER_TRITON_PING_MODE": ""}, 0),
    "ping mode exported, override set": ({"SAGEMAKER_TRITON_PING_MODE": "ready",
                                          "SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "live"}, 0),
    "additional args, two words, odd blanks": (
        {"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "  --exit-timeout-secs=5 \t --log-format=ISO8601\n"}, 0),
    "gpu limit with 2 GPUs": ({"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.5"}, 2),
    "gpu limit without GPUs": ({"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.5"}, 0),
    "empty values count as unset": ({"SAGEMAKER_TRITON_ALLOW_GRPC": "", "SAGEMAKER_TRITON_LOG_VERBOSE": "",
                                     "SAGEMAKER_BIND_TO_PORT": ""}, 0),
    "values are word-split": ({"SAGEMAKER_TRITON_LOG_VERBOSE": "1 --log-info=false"}, 0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_port_gives_tritonserver_what_the_script_gives_it(fake_bin, tmp_path, case):
    """Source: docker/sagemaker/serve @ e1db8a603 (the SAGEMAKER_ARGS lines and the final
    tritonserver line; PING_MODE assignments): same argv, same ping mode in the environment."""
    env, gpus = CASES[case]
    script = run_serve(fake_bin, tmp_path, env, gpus)
    assert script.code == 0 and script.argv is not None, script.output
    assert ported(env, gpus) == (script.argv, script.ping_mode)


def test_the_reference_is_the_scripts_mme_line_and_its_defaults(fake_bin, tmp_path):
    """Source: docker/sagemaker/serve @ e1db8a603: the MME defaults, spelled out once."""
    script = run_serve(fake_bin, tmp_path, {"SAGEMAKER_BIND_TO_PORT": "8080"})
    assert script.argv == [
        "--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit",
        "--model-repository=/tmp/sagemaker", "--model-namespacing=true", "--sagemaker-port=8080",
        "--allow-grpc=false", "--allow-metrics=false", "--log-verbose=true",
        "--backend-config=python,shm-default-byte-size=16777216",
        "--backend-config=python,shm-growth-byte-size=1048576",
    ]
    assert script.ping_mode == UNSET  # "live" is never exported: tritonserver pings in its default mode
    assert '"live"' in script.output


def test_quirks_are_reproduced(fake_bin, tmp_path):
    """Source: docker/sagemaker/serve @ e1db8a603 (DISABLE_MODEL_NAMESPACING, PING_MODE, nvidia-smi -L | wc -l)."""
    quirks = {"SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": "true", "SAGEMAKER_TRITON_PING_MODE": "ready",
              "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.5"}
    script = run_serve(fake_bin, tmp_path, quirks, gpus=2)
    assert "--model-namespacing=true" in script.argv  # "disable" = true keeps namespacing on
    assert script.ping_mode == "live"  # exported beforehand: the script's value reaches tritonserver
    assert script.argv[-4:] == ["--model-load-gpu-limit", "0:0.5", "--model-load-gpu-limit", "1:0.5"]
    assert ported(quirks, gpus=2) == (script.argv, script.ping_mode)


def test_extra_goes_where_a_kind_puts_it_in_additional_args(fake_bin, tmp_path):
    """Source: docker/sagemaker/serve @ e1db8a603: a kind's flags prepended to
    SAGEMAKER_TRITON_ADDITIONAL_ARGS (system/docker kinds) land where ``extra`` puts them."""
    extra = ("--backend-directory=/opt/b", "--backend-config=python,shm-region-prefix-name=p_")
    user = {"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--exit-timeout-secs=5 --backend-directory=/user/wins"}
    script = run_serve(fake_bin, tmp_path, {ss.ADDITIONAL_ARGS: ss.additional_args(user, extra, ("--id=x",))})
    argv, _ = ported(user, extra=extra)
    assert script.argv == [*argv, "--id=x"]
    assert argv[-2:] == ["--exit-timeout-secs=5", "--backend-directory=/user/wins"]  # the user's come last
    with pytest.raises(UsageError, match="without spaces"):
        ss.additional_args({}, ["--backend-directory=/a b"])


def test_an_invalid_inference_type_stops_both(fake_bin, tmp_path):
    """Source: docker/sagemaker/serve @ e1db8a603 (the SAGEMAKER_TRITON_INFERENCE_TYPE check exits 1)."""
    env = {"SAGEMAKER_TRITON_INFERENCE_TYPE": "stream"}
    script = run_serve(fake_bin, tmp_path, env)
    assert script.code == 1 and script.argv is None and "Invalid SAGEMAKER_TRITON_INFERENCE_TYPE" in script.output
    with pytest.raises(UsageError, match="infer, generate, generate_stream"):
        ported(env)


def test_nvidia_smi_lines_are_counted_like_wc_l(fake_bin):
    """Source: docker/sagemaker/serve @ e1db8a603: num_gpus=$(nvidia-smi -L | wc -l)."""
    env = {"PATH": str(fake_bin), "FAKE_GPUS": "3"}
    assert ss.nvidia_smi_line_count(env) == 3
    assert ss.script_gpu_count(env) == 0  # consulted only with the limit set
    assert ss.script_gpu_count({**env, ss.GPU_LIMIT: "0.5"}) == 3
    assert ss.nvidia_smi_line_count({"PATH": "/nonexistent"}) == 0


# -- the CLI's --env and the process environment ---------------------------------------------

def test_env_assignments():
    assert ss.parse_env_assignments(["SAGEMAKER_TRITON_LOG_VERBOSE=false", "X=a=b", "Y=", "X=c"]) == {
        "SAGEMAKER_TRITON_LOG_VERBOSE": "false", "X": "c", "Y": ""}
    for item, fix in (("NOEQUALS", "KEY=VALUE"), ("=v", "empty name"), ("A-B=1", "letters, digits"),
                      ("SAGEMAKER_MULTI_MODEL=false", "drop that --env"), ("SAGEMAKER_BIND_TO_PORT=1", "endpoint")):
        with pytest.raises(UsageError, match=fix) as info:
            ss.parse_env_assignments([item])
        assert "\n" not in str(info.value)


def test_settings_from_the_process_environment():
    environ = {"SAGEMAKER_TRITON_LOG_INFO": "true", "SAGEMAKER_SAFE_PORT_RANGE": "1-2", "SAGEMAKER_OTHER": "x",
               "PATH": "/bin", "SAGEMAKER_BIND_TO_PORT": "9"}
    assert ss.sagemaker_settings_from_environ(environ) == {"SAGEMAKER_TRITON_LOG_INFO": "true",
                                                           "SAGEMAKER_SAFE_PORT_RANGE": "1-2"}


# -- flags a tritonserver lacks -----------------------------------------------------------------

def test_drop_unsupported_drops_a_flag_with_its_separate_value():
    supported = frozenset({"--a", "--model-load-gpu-limit"})
    args = ["--a=1", "--b=2", "--model-load-gpu-limit", "0:0.5", "--c", "3", "--a", "4", "--d"]
    assert ss.drop_unsupported(args, supported) == (["--a=1", "--model-load-gpu-limit", "0:0.5", "--a", "4"],
                                                    ["--b=2", "--c", "3", "--d"])
    assert ss.drop_unsupported(["--x", "1", "--y", "2"], frozenset({"--x"}))[1] == ["--y", "2"]
    assert ss.drop_unsupported(args, frozenset()) == (args, [])  # unknown: keep everything
    assert ss.dropped_flags(["--b=2", "--c", "3", "--c=4"]) == ["--b", "--c"]


def test_supported_flags_come_from_help_once(tmp_path):
    from serving.triton.local import find_distribution

    dist = find_distribution()
    flags = ss.supported_flags(dist.binary, os.environ)
    assert {"--allow-sagemaker", "--model-namespacing", "--sagemaker-safe-port-range", "--model-load-gpu-limit",
            "--backend-config", "--log-verbose"} <= flags
    counter = tmp_path / "calls"
    fake = tmp_path / "tritonserver"
    fake.write_text(f"#!/bin/sh\necho x >> {counter}\necho 'Usage:'\necho '  --only-this <int>'\nexit 1\n")
    fake.chmod(0o755)
    assert ss.supported_flags(fake, {}) == {"--only-this"}
    assert ss.supported_flags(fake, {}) == {"--only-this"}
    assert counter.read_text().count("x") == 1
    assert ss.supported_flags(tmp_path / "missing", {}) == frozenset()


def test_serve_scripts_are_recognised(tmp_path, monkeypatch):
    assert ss.is_serve_script(SERVE)
    other = tmp_path / "serve"
    other.write_text("#!/bin/sh\nnpx serve\n")
    assert not ss.is_serve_script(other) and not ss.is_serve_script(tmp_path / "none")
    monkeypatch.setattr(ss, "SERVE_SCRIPT_PATH", tmp_path / "absent")
    assert ss.find_serve_script(str(tmp_path)) is None
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "serve").write_text(SERVE.read_text())
    (tmp_path / "bin" / "serve").chmod(0o755)
    assert ss.find_serve_script(str(tmp_path / "bin")) == tmp_path / "bin" / "serve"


# -- real Triton: the wheel's tritonserver, started by each path -----------------------------

OFFSET_MODEL_PY = '''\
import numpy as np
import triton_python_backend_utils as pb_utils

OFFSET = {offset!r}


class TritonPythonModel:
    def execute(self, requests):
        replies = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            replies.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x + OFFSET).astype(np.float32))]))
        return replies
'''


def write_config(path: Path, config) -> None:
    from google.protobuf import text_format

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.pbtxt").write_text(text_format.MessageToString(config))


def io_config(**fields):
    from tritonclient.grpc import model_config_pb2 as mc

    config = mc.ModelConfig(max_batch_size=0, **fields)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[-1])
    config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[-1])
    return config


def write_offset_model(directory: Path, name: str, offset: float) -> Path:
    """``directory/name``: a python-backend model answering INPUT0 + offset."""
    from tritonclient.grpc import model_config_pb2 as mc

    config = io_config(backend="python")
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    write_config(directory / name, config)
    (directory / name / "1").mkdir(exist_ok=True)
    (directory / name / "1" / "model.py").write_text(OFFSET_MODEL_PY.format(offset=offset))
    return directory


def write_ensemble(url: Path, offset: float) -> Path:
    """A SageMaker model directory: an ensemble (named by the target at load) whose one step is
    a model called ``step``, as two targets' archives may both have."""
    config = io_config(platform="ensemble")
    step = config.ensemble_scheduling.step.add(model_name="step", model_version=-1)
    step.input_map["INPUT0"] = "INPUT0"
    step.output_map["OUTPUT0"] = "OUTPUT0"
    write_config(url / "ensemble", config)
    (url / "ensemble" / "1").mkdir(exist_ok=True)
    return write_offset_model(url, "step", offset)


def invoke_value(client, name: str, target: str) -> list[float]:
    import json

    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]})
    result = client.invoke(name, body.encode(), "application/json", target=target)
    assert result.status == 200, result.body[:300]
    return result.json()["outputs"][0]["data"]


@pytest.fixture(scope="module")
def wheel():
    from serving.triton.local import TritonNotInstalledError, check_libpython, find_distribution, prepare_backends

    try:
        dist = find_distribution()
        check_libpython()
        return dist, prepare_backends(dist)
    except TritonNotInstalledError as exc:
        pytest.skip(str(exc))


def quiet_config(**overrides):
    from serving.triton.config import TritonServerConfig

    fields = dict(sagemaker_port=0, http_port=None, grpc_port=None, metrics_port=None, startup_timeout_s=60.0)
    return TritonServerConfig(**{**fields, **overrides})


def test_local_kind_passes_the_settings_and_drops_what_2_51_lacks(wheel, tmp_path):
    """Source: docker/sagemaker/serve @ e1db8a603 (SHM_DEFAULT_BYTE_SIZE, LOG_VERBOSE, ADDITIONAL_ARGS, PING_MODE)."""
    import psutil

    from serving.triton.container import ContainerClient
    from serving.triton.container import ping_status
    from serving.triton.config import TritonServerError
    from serving.triton.local import LocalTritonServer

    settings = {"SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": str(3 << 20), "SAGEMAKER_TRITON_LOG_VERBOSE": "false",
                "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--exit-timeout-secs=3 --some-flag-2-51-lacks=1",
                "SAGEMAKER_TRITON_PING_MODE": "ready"}
    server = LocalTritonServer(quiet_config(sagemaker_env=settings))
    server.start()
    try:
        argv = psutil.Process(server.pid).cmdline()
        assert argv == server.command(server._workdir / "model-repository")
        for flag in ("--allow-http=false", f"--backend-config=python,shm-default-byte-size={3 << 20}",
                     "--log-verbose=false", "--exit-timeout-secs=3", "--model-namespacing=true"):
            assert flag in argv
        assert argv[-1] == "--exit-timeout-secs=3" and not any("some-flag" in a for a in argv)
        assert server.notices == ["tritonserver 2.51 (nvidia-pytriton 0.7.0) lacks --some-flag-2-51-lacks; "
                                  "started without it (SageMaker's image would pass it)"]
        assert psutil.Process(server.pid).environ()["SAGEMAKER_TRITON_PING_MODE"] == "live"
        assert ping_status(server.sagemaker_url) == 200
        with pytest.raises(TritonServerError, match="http_port=0"):
            _ = server.kserve_url
        # The python backend sizes each model's shared-memory region as configured.
        with ContainerClient(server.sagemaker_url) as client:
            client.load("m", str(write_offset_model(tmp_path / "m", "m", 1.0)), target="m.tar.gz")
            assert invoke_value(client, "m", "m.tar.gz") == [2.0, 3.0]
        sizes = {p.stat().st_size for p in Path("/dev/shm").glob(f"{server.shm_prefix}*")}
        assert 3 << 20 in sizes, sizes
        server.restart()
        assert len(server.notices) == 1  # reported once per server, not per start
    finally:
        server.stop()


def test_system_kind_runs_the_serve_script_end_to_end(wheel, tmp_path):
    """Source: docker/sagemaker/serve @ e1db8a603, run by bash as SageMaker runs it: the wheel's
    tritonserver found on PATH as ``tritonserver``, our flags in SAGEMAKER_TRITON_ADDITIONAL_ARGS."""
    import psutil

    from serving.triton.container import ContainerClient
    from serving.triton.container import ping_status
    from serving.triton.system import SystemTritonServer

    dist, backends = wheel
    library_path = os.pathsep.join(str(p) for p in dist.library_path())
    config = quiet_config(env={"LD_LIBRARY_PATH": library_path},
                          sagemaker_env={"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--exit-timeout-secs=3"},
                          extra_args=("--id=mme-test",))
    server = SystemTritonServer(config, binary=dist.binary, backend_directory=backends, serve_script=SERVE)
    server.start()
    try:
        assert server.command(Path("unused")) == ["bash", str(SERVE)]
        bash = psutil.Process(server.pid)
        (triton,) = bash.children()
        assert Path(triton.exe()).resolve() == dist.binary.resolve()
        kind_args = [*ss.config_arguments(server.config, server.config.host), *server._kind_args()]
        expected = ss.serve_arguments(server._serve_environment(), gpu_count=0, extra=kind_args)
        assert triton.cmdline()[1:] == [*expected, "--id=mme-test"]
        assert triton.cmdline()[-2:] == ["--exit-timeout-secs=3", "--id=mme-test"]
        assert ping_status(server.sagemaker_url) == 200
        with ContainerClient(server.sagemaker_url) as client:
            client.load("m", str(write_offset_model(tmp_path / "m", "m", 5.0)), target="m.tar.gz")
            assert invoke_value(client, "m", "m.tar.gz") == [6.0, 7.0]
        pids = server.pids()
        assert {bash.pid, triton.pid} < set(pids) and len(pids) == 3  # + the model's stub
        path_dir = server._path_dir
        assert path_dir is not None and (path_dir / "tritonserver").is_symlink()
    finally:
        server.stop()
    assert server.pids() == [] and not [p for p in pids if psutil.pid_exists(p)]
    assert not path_dir.exists()


@pytest.mark.parametrize("namespacing", ["true", "false"])
def test_namespacing_lets_two_ensembles_share_a_step_name(wheel, tmp_path, namespacing):
    """Source: docker/sagemaker/serve @ e1db8a603 (--model-namespacing=true unless
    SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING): two targets whose ensembles both call a step
    ``step`` load side by side, each with its own step; without namespacing they cannot."""
    from serving.triton.container import ContainerClient, ModelLoadFailed
    from serving.triton.local import LocalTritonServer

    settings = {"SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": namespacing, "SAGEMAKER_TRITON_LOG_VERBOSE": "false"}
    server = LocalTritonServer(quiet_config(sagemaker_env=settings))
    server.start()
    try:
        with ContainerClient(server.sagemaker_url) as client:
            client.load("a", str(write_ensemble(tmp_path / "a", 10.0)), target="a.tar.gz")
            assert invoke_value(client, "a", "a.tar.gz") == [11.0, 12.0]
            if namespacing == "true":
                client.load("b", str(write_ensemble(tmp_path / "b", 20.0)), target="b.tar.gz")
                assert invoke_value(client, "b", "b.tar.gz") == [21.0, 22.0]
                assert invoke_value(client, "a", "a.tar.gz") == [11.0, 12.0]
            else:
                with pytest.raises(ModelLoadFailed) as info:
                    client.load("b", str(write_ensemble(tmp_path / "b", 20.0)), target="b.tar.gz")
                assert "failed to poll" in info.value.message
                assert "failed to poll model 'step': not unique across all model repositories" in \
                    server.log_path.read_text()
    finally:
        server.stop()
