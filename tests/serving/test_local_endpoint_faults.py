"""Faults around the local MME: a model that cannot load, Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import boto3
import psutil
import pytest
import requests

from mme.fsutil import deterministic_tar_gz
from mme.progress import Reporter
from serving.local_endpoint import LocalEndpoint, LocalEndpointOptions

BROKEN_CONFIG = 'backend: "python"\nmax_batch_size: 1\ninput { name: "X" data_type: TYPE_FP32 dims: [1] }\n' \
                'output { name: "Y" data_type: TYPE_FP32 dims: [1] }\ninstance_group { kind: KIND_CPU }\n'


@pytest.fixture(scope="module")
def models_with_a_broken_one(packaged_test_resnet, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    model = tmp_path_factory.mktemp("src") / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(BROKEN_CONFIG)
    (model / "1" / "model.py").write_text("class TritonPythonModel:\n    def initialize(self, args):\n"
                                          "        raise RuntimeError('weights file is missing')\n")
    deterministic_tar_gz(model, "broken", root / "broken.tar.gz")
    (root / "test_resnet.tar.gz").write_bytes(packaged_test_resnet.tarball.read_bytes())
    return root


def test_a_model_that_fails_to_load_fails_only_its_requests(models_with_a_broken_one, packaged_test_resnet):
    options = LocalEndpointOptions(models=str(models_with_a_broken_one), port=0, server_kind="local")
    body = packaged_test_resnet.sample("json")
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        sm = boto3.client("sagemaker-runtime", endpoint_url=ep.url, region_name="us-east-1",
                          aws_access_key_id="t", aws_secret_access_key="t")
        with pytest.raises(sm.exceptions.ModelError) as info:
            sm.invoke_endpoint(EndpointName="local", TargetModel="broken.tar.gz", ContentType="application/json",
                               Body=b'{"inputs":[{"name":"X","shape":[1,1],"datatype":"FP32","data":[1]}]}')
        assert "weights file is missing" in info.value.response["OriginalMessage"]
        reply = sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet.tar.gz",
                                   ContentType="application/json", Body=body)
        assert reply["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert [m["target"] for m in ep.endpoint.loaded_models()] == ["test_resnet.tar.gz"]


def test_ctrl_c_stops_everything(packaged_test_resnet, tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "mme", "serve", "--models", str(packaged_test_resnet.directory),
                             "--port", str(port), "--server", "local", "--copies", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/ping", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        sm = boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="t", aws_secret_access_key="t")
        sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz", ContentType="application/json",
                           Body=packaged_test_resnet.sample("json"))
        descendants = psutil.Process(proc.pid).children(recursive=True)
        assert any("tritonserver" in p.name() for p in descendants)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output
        assert "Traceback" not in output
    finally:
        if proc.poll() is None:  # a failed assertion must not leave a server running
            tree = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
            proc.communicate(timeout=30)
            for child in tree:
                child.kill()
    gone, alive = psutil.wait_procs(descendants, timeout=10)
    assert not alive, f"orphans left: {[p.pid for p in alive]}"
