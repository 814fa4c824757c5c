"""mme/hosts.py and hosts.toml: which SageMaker host image (InferenceAmiVersion, or an instance
family's default host) starts which release's image, by NVIDIA's rules, and what mme sets or
refuses. Pure logic: the table is checked against botocore's own SageMaker model, and every
AMI x release verdict on ml.g5 is pinned."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from mme import hosts, versions
from mme.hosts import CANNOT, FORWARD, MINOR, NATIVE, NO_GPU, UNKNOWN, HostDriverError, check_host
from tests.docker.conftest import REPO

G2, G21, G31, G41 = ("al2-ami-sagemaker-inference-gpu-2", "al2-ami-sagemaker-inference-gpu-2-1",
                     "al2-ami-sagemaker-inference-gpu-3-1", "al2023-ami-sagemaker-inference-gpu-4-1")
NEURON = "al2-ami-sagemaker-inference-neuron-2"


def sagemaker_model():
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


# -- the table against its sources -------------------------------------------------------------

def test_every_inference_ami_botocore_knows_is_in_the_table_with_its_documented_driver_and_cuda():
    model = sagemaker_model()
    assert set(hosts.amis()) == set(model.shape_for("ProductionVariantInferenceAmiVersion").enum)
    doc = model.shape_for("ProductionVariant").members["InferenceAmiVersion"].documentation
    # the member documentation: <dt>NAME</dt> <dd> ... </dd>, one entry per AMI
    entries = dict(re.findall(r"<dt>([\w.-]+)</dt>\s*<dd>(.*?)</dd>", doc, flags=re.S))
    for name, row in hosts.amis().items():
        text = re.sub(r"<[^>]+>", " ", entries[name])
        if row["accelerator"] == "neuron":
            assert "Inferentia" in text and "NVIDIA" not in text
            continue
        assert re.search(rf"NVIDIA driver version:\s*{row['driver']}\b", text), name
        assert re.search(rf"CUDA version:\s*{re.escape(row['cuda'])}\b", text), name
        assert ("disabled CUDA-compat mounting" in text) is row["compat_mounting_disabled"], name


def test_families_in_the_table_are_instance_families_sagemaker_knows_and_match_the_instance_catalogue():
    model = sagemaker_model()
    known = {t.rsplit(".", 1)[0] for shape in ("ProductionVariantInstanceType", "TrainingInstanceType")
             for t in model.shape_for(shape).enum}
    table = tomllib.loads((REPO / "mme" / "hosts.toml").read_text())
    families = set(table["gpus"]) | {f for row in table["default_hosts"] for f in row["families"]}
    assert families <= known, sorted(families - known)
    serving = tomllib.loads((REPO / "mme" / "instances.toml").read_text())["families"]
    for family, row in serving.items():
        assert table["gpus"][family]["gpu"] == row["gpu"], family


def test_the_rules_are_nvidias_minor_version_table():
    rules = tomllib.loads((REPO / "mme" / "hosts.toml").read_text())["cuda"]
    assert rules["minor_version_min_driver"] == {"11": 450, "12": 525, "13": 580}
    assert "forward_compat_branches.13" in rules["unverified"]


# -- every AMI x release on ml.g5 -------------------------------------------------------------

# release -> {InferenceAmiVersion or None (the default host): (how, the AMI mme sets)}
ON_G5 = {
    "26.05": {None: (MINOR, G41), G2: (FORWARD, G2), G21: (FORWARD, G21), G31: (FORWARD, G31), G41: (MINOR, G41)},
    "26.04": {None: (MINOR, G41), G2: (FORWARD, G2), G21: (FORWARD, G21), G31: (FORWARD, G31), G41: (MINOR, G41)},
    "25.09": {None: (NATIVE, G41), G2: (FORWARD, G2), G21: (FORWARD, G21), G31: (FORWARD, G31), G41: (NATIVE, G41)},
    "25.04": {None: (MINOR, G21), G2: (MINOR, G2), G21: (MINOR, G21), G31: (MINOR, G31), G41: (NATIVE, G41)},
    "24.09": {None: (MINOR, G21), G2: (MINOR, G2), G21: (MINOR, G21), G31: (MINOR, G31), G41: (NATIVE, G41)},
    "22.10": {None: (MINOR, None), G2: (NATIVE, G2), G21: (NATIVE, G21), G31: (NATIVE, G31), G41: (NATIVE, G41)},
}


def test_the_matrix_covers_every_sagemaker_release_and_every_nvidia_ami():
    assert set(ON_G5) == {r.name for r in versions.sagemaker_releases()}
    assert all(set(row) == {None, *(h.ami for h in hosts.nvidia_amis())} for row in ON_G5.values())


@pytest.mark.parametrize(("name", "ami"), [(name, ami) for name, row in ON_G5.items() for ami in row],
                         ids=lambda v: str(v))
def test_every_ami_and_release_verdict_on_ml_g5(name, ami):
    rel = versions.release(name)
    verdict = check_host(rel.cuda, "ml.g5.2xlarge", ami, image=f"release {name}")
    how, sets = ON_G5[name][ami]
    assert (verdict.starts, verdict.how, verdict.ami) == (True, how, sets)
    assert verdict.chosen is (ami is None and sets is not None)
    assert verdict.line().startswith(f"host: {sets or 'ml.g5'}") and "\n" not in verdict.line()
    assert f"release {name} needs CUDA {rel.cuda}" in verdict.reason


def test_the_470_default_host_refuses_25_04_as_in_deep_learning_containers_4990():
    """'This container was built for NVIDIA Driver Release 575.51 or later, but version 470.256.02 was
    detected and compatibility mode is UNAVAILABLE' (25.04 on a multi-model GPU endpoint)."""
    default = hosts.default_host("ml.g5.2xlarge")
    assert (default.driver, default.cuda, default.ami) == (470, "11.4", None)
    on_default = hosts.compat("12.9.0", default, hosts.gpu_of("ml.g5.2xlarge"), image="release 25.04")
    assert on_default.how == CANNOT and not on_default.starts
    assert "CUDA 12.x needs driver 525 or later" in on_default.reason
    assert "forward compatibility from driver 470 fails there: aws/deep-learning-containers#4990" in on_default.reason
    verdict = check_host("12.9.0", "ml.g5.2xlarge", None, image="release 25.04")
    assert verdict.default == on_default and verdict.ami == G21  # mme sets an AMI instead
    assert "InferenceAmiVersion set because ml.g5's default host (driver 470, CUDA 11.4) cannot start it" in verdict.reason
    # the same on every family AWS gives driver 470
    for family in ("ml.g4dn.xlarge", "ml.p4d.24xlarge", "ml.p3.2xlarge"):
        assert check_host("12.9.0", family, None).default.how == CANNOT


def test_the_dry_run_line_for_the_default_release_on_ml_g5_2xlarge():
    rel = versions.release()
    verdict = check_host(rel.cuda, "ml.g5.2xlarge", None, image=f"release {rel.name}")
    assert verdict.line() == (
        "host: al2023-ami-sagemaker-inference-gpu-4-1 (driver 580, CUDA 13.0): release 25.09 needs CUDA 13.0.1, which "
        "driver 580 runs natively; InferenceAmiVersion set because ml.g5's default host (driver 470, CUDA 11.4) "
        "cannot start it")


def test_a_default_host_that_runs_the_image_needs_no_ami():
    verdict = check_host("12.6.1", "ml.g6.2xlarge", None, image="release 24.09")
    assert (verdict.starts, verdict.how, verdict.ami, verdict.chosen) == (True, MINOR, None, False)
    assert verdict.line() == ("host: ml.g6's default host (driver 535, CUDA 12.2): release 24.09 needs CUDA 12.6.1, which "
                              "driver 535 runs by minor-version compatibility (CUDA 12.x from driver 525); no "
                              "InferenceAmiVersion needed")
    # the same release needs one on the 470 hosts, and a CUDA 13 release everywhere but the 580 AMI
    assert check_host("12.6.1", "ml.g5.xlarge", None).ami == G21
    assert check_host("13.0.1", "ml.p5e.48xlarge", None).ami == G41


# -- forward compatibility and refusals --------------------------------------------------------

def test_forward_compatibility_needs_nvidias_entrypoint_and_refusal_names_the_ami_that_works():
    kept = check_host("13.0.1", "ml.g5.2xlarge", G31, image="release 25.09")
    assert kept.how == FORWARD and kept.starts and kept.alternative == G41
    replaced = check_host("13.0.1", "ml.g5.2xlarge", G31, image="release 25.09", entrypoint=False)
    assert replaced.starts is False and "needs NVIDIA's entrypoint" in replaced.reason
    with pytest.raises(HostDriverError) as info:
        hosts.require_starts(replaced)
    message = str(info.value)
    assert "\n" not in message and message.startswith("al2-ami-sagemaker-inference-gpu-3-1 (driver 550, CUDA 12.4): ")
    assert f"pass --inference-ami-version {G41} (driver 580, CUDA 13.0)" in message
    assert "or package for a release whose CUDA it runs (--triton-release 25.04)" in message


def test_an_ami_whose_driver_is_older_than_the_gpu_is_refused_and_never_chosen():
    verdict = check_host("12.9.0", "ml.p6-b200.48xlarge", G21)
    assert verdict.starts is False and "driver 535 does not support ml.p6-b200's B200 (R570 or later)" in verdict.reason
    chosen = check_host("12.9.0", "ml.p6-b200.48xlarge", None)  # no documented default host: mme sets one
    assert chosen.ami == G41 and "AWS documents no default driver for ml.p6-b200" in chosen.reason


def test_forward_compatibility_is_not_counted_off_data_centre_gpus():
    gpu = hosts.Gpu("ml.x", "a workstation GPU", datacenter=False, min_driver=None)
    result = hosts.compat("13.0.1", hosts.nvidia_amis()[2], gpu)
    assert result.how == CANNOT and "needs a data-centre GPU" in result.reason


def test_a_cuda_no_sagemaker_host_runs_is_refused_with_a_release_that_runs():
    verdict = check_host("14.0.0", "ml.g5.2xlarge", None, image="a CUDA 14 image")
    assert verdict.starts is False and verdict.ami is None
    assert "no InferenceAmiVersion runs it natively or by minor-version compatibility (newest: " \
           "al2023-ami-sagemaker-inference-gpu-4-1 (driver 580, CUDA 13.0))" in verdict.reason
    with pytest.raises(HostDriverError, match=r"\(--triton-release 22.10\)$"):
        hosts.require_starts(verdict)


def test_cpu_and_neuron_instances_are_not_checked_and_amis_must_fit_the_accelerator():
    for instance in ("ml.m5.xlarge", "ml.c5.2xlarge", "ml.inf2.xlarge", "ml.trn1.2xlarge"):
        verdict = check_host("13.0.1", instance, None)
        assert (verdict.starts, verdict.how, verdict.ami) == (True, NO_GPU, None)
        assert verdict.line() == f"host: {instance} has no NVIDIA GPU: no driver to check"
    assert check_host("13.0.1", "ml.inf2.xlarge", NEURON).ami == NEURON
    with pytest.raises(HostDriverError) as info:
        hosts.require_starts(check_host("13.0.1", "ml.m5.xlarge", G41))
    assert str(info.value) == (f"{G41} is an NVIDIA GPU host image but ml.m5.xlarge has no NVIDIA GPU; leave "
                               "--inference-ami-version out: ml.m5.xlarge needs no NVIDIA host image")
    wrong = check_host("13.0.1", "ml.g5.2xlarge", NEURON)
    assert wrong.starts is False and "Inferentia" in wrong.reason and wrong.alternative == G41


def test_an_image_of_unknown_cuda_is_not_refused():
    verdict = check_host(None, "ml.g5.2xlarge", None, image="your image x")
    assert (verdict.starts, verdict.how, verdict.ami) == (None, UNKNOWN, None)
    assert "the CUDA of your image x is unknown" in verdict.reason
    hosts.require_starts(verdict)  # no error: warned about, not refused
    assert check_host(None, "ml.g5.2xlarge", G41).ami == G41


def test_training_hosts_are_not_refused_and_warn_when_the_family_s_inference_host_would_not_run_it():
    risky = hosts.check_training_host("13.0.1", "ml.g5.2xlarge", image="release 25.09")
    assert risky.starts is None and "AWS documents no NVIDIA driver for training hosts" in risky.reason
    warning = hosts.training_warning(risky)
    assert warning and "ml.g5's default host (driver 470, CUDA 11.4) for inference could not run it" in warning
    assert hosts.training_warning(hosts.check_training_host("11.8.0", "ml.g5.2xlarge")) is None
    assert hosts.training_warning(hosts.check_training_host("13.0.1", "ml.c5.xlarge")) is None


def test_the_module_prints_verdicts_and_imports_nothing_heavy():
    done = subprocess.run([sys.executable, "-m", "mme.hosts", "--instance-type", "ml.g5.2xlarge", "--release", "25.04"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.startswith("25.04 on default: starts (minor-version compatibility) - host: "
                                  "al2-ami-sagemaker-inference-gpu-2-1")
    probe = "import sys, mme.hosts; print(sorted(m for m in ('torch', 'numpy', 'botocore') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
