"""What SageMaker's GPU hosts run (``hosts.toml``) and whether an image of a given CUDA starts
on them: natively, by CUDA minor-version compatibility, by forward compatibility, or not at all.

A SageMaker GPU host's NVIDIA driver comes from its instance family's default host image, or from
the ``InferenceAmiVersion`` of CreateEndpointConfig's ProductionVariant. An image whose CUDA the
driver cannot run stops at start-up ("This container was built for NVIDIA Driver Release 575.51
or later, but version 470.256.02 was detected and compatibility mode is UNAVAILABLE",
aws/deep-learning-containers#4990), after a deploy of many minutes; ``check_host`` says so
before anything is created, and which ``InferenceAmiVersion`` to set instead::

    verdict = check_host("13.0.1", "ml.g5.2xlarge", None, image="release 25.09")
    verdict.ami      # 'al2023-ami-sagemaker-inference-gpu-4-1'
    verdict.line()   # 'host: al2023-ami-sagemaker-inference-gpu-4-1 (driver 580, CUDA 13.0): ...'

``python -m mme.hosts --instance-type ml.g5.2xlarge [--release 25.09] [--ami NAME]`` prints the
verdict. This module imports nothing heavy.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Sequence

from mme.errors import UsageError
from mme.instances import family_of
from mme.versions import release, sagemaker_releases

NATIVE = "native"
MINOR = "minor-version compatibility"
FORWARD = "forward compatibility"
CANNOT = "cannot start"
NO_GPU = "no NVIDIA GPU"
UNKNOWN = "unknown"
STARTS = (NATIVE, MINOR, FORWARD)
AMI_OPTION = "--inference-ami-version"


class HostDriverError(UsageError):
    """The image cannot start on the host's NVIDIA driver (or the AMI does not fit the instance)."""

    retryable = False


@dataclass(frozen=True)
class Host:
    """An NVIDIA host image: an InferenceAmiVersion, or a family's default (``ami`` None)."""

    ami: str | None
    driver: int  # the driver branch (535, not 535.54.03)
    cuda: str  # the CUDA the driver ships with (what nvidia-smi reports)
    forward_compat: bool = True  # whether forward compatibility is counted on it
    compat_mounting_disabled: bool | None = None
    family: str | None = None  # default hosts: the family they stand for
    note: str = ""
    unverified: tuple[str, ...] = ()

    @property
    def specs(self) -> str:
        return f"driver {self.driver}, CUDA {self.cuda}"

    def describe(self) -> str:
        where = self.ami or f"{self.family}'s default host"
        return f"{where} ({self.specs})"


@dataclass(frozen=True)
class Gpu:
    family: str
    gpu: str
    datacenter: bool  # forward compatibility applies only to data-centre GPUs
    min_driver: int | None = None  # the oldest driver branch that supports the GPU (None: not known)


@dataclass(frozen=True)
class Compat:
    """How an image of one CUDA runs on one host, with the reason in words."""

    how: str  # NATIVE | MINOR | FORWARD | CANNOT
    reason: str

    @property
    def starts(self) -> bool:
        return self.how in STARTS


@dataclass(frozen=True)
class HostVerdict:
    """Whether an image starts on an instance type's host, and which InferenceAmiVersion to set.

    ``starts``: True / False on the host the endpoint would get (the AMI given, the AMI chosen, or
    the family's default host); None when it cannot be checked (unknown CUDA, undocumented host).
    ``ami``: the InferenceAmiVersion to set (the one given, or the one chosen because the default
    host cannot start the image; None: leave it unset). ``alternative``: the oldest AMI that runs
    the image natively or by minor-version compatibility (None: none does). ``default``: what the
    family's default host does (only when no AMI was given)."""

    instance_type: str
    cuda: str | None
    starts: bool | None
    how: str
    reason: str
    host: Host | None = None
    ami: str | None = None
    chosen: bool = False
    alternative: str | None = None
    default: Compat | None = None

    def line(self) -> str:
        """One line for plans and dry runs: ``host: <where>: <why>``."""
        return f"host: {self.reason}"

    def fix(self, option: str = AMI_OPTION) -> str:
        """What would start instead: an AMI (``option`` names how to pass it), or a release."""
        if gpu_of(self.instance_type) is None:
            return f"leave {option} out: {self.instance_type} needs no NVIDIA host image"
        hints = []
        if self.alternative and self.alternative != self.ami:
            hints.append(f"pass {option} {self.alternative} ({_ami_host(self.alternative).specs})")
        if self.host is not None:
            names = releases_starting_on(self.host, gpu_of(self.instance_type))
            if names:
                hints.append(f"{'or ' if hints else ''}package for a release whose CUDA it runs (--triton-release {names[0]})")
        return " ".join(hints) if hints else "no SageMaker host image runs it: package for an older --triton-release"


# --- the table --------------------------------------------------------------------------------


def _table() -> dict:
    return tomllib.loads(resources.files("mme").joinpath("hosts.toml").read_text())


def gpu_of(instance_type: str) -> Gpu | None:
    """The family's NVIDIA GPU; None when the family has none (CPU, Inferentia, Trainium, Gaudi)."""
    table = _table()
    family = family_of(instance_type)
    row = table["gpus"].get(family)
    if row is not None:
        return Gpu(family, str(row["gpu"]), bool(row["datacenter"]), row.get("min_driver"))
    if family.startswith(tuple(table["gpu_families"]["nvidia_prefixes"])):
        return Gpu(family, "an NVIDIA GPU not in mme/hosts.toml", True, None)
    return None


def amis() -> dict[str, dict]:
    """Every InferenceAmiVersion of hosts.toml, name -> its row."""
    return dict(_table()["amis"])


def _ami_host(name: str) -> Host:
    row = _table()["amis"][name]
    return Host(ami=name, driver=int(row["driver"]), cuda=str(row["cuda"]),
                compat_mounting_disabled=bool(row.get("compat_mounting_disabled")))


def nvidia_amis() -> list[Host]:
    """The NVIDIA AMIs in mme's order of preference: oldest driver first; for the same driver,
    the one with CUDA-compat mounting disabled (the toolkit behaviour AWS recommends)."""
    hosts = [_ami_host(name) for name, row in _table()["amis"].items() if row.get("accelerator") == "nvidia"]
    return sorted(hosts, key=lambda h: (h.driver, not h.compat_mounting_disabled))


def default_host(instance_type: str) -> Host | None:
    """The host a family gets without InferenceAmiVersion; None when AWS documents none."""
    family = family_of(instance_type)
    for row in _table()["default_hosts"]:
        if family in row["families"]:
            return Host(ami=None, driver=int(row["driver"]), cuda=str(row["cuda"]),
                        forward_compat=bool(row.get("forward_compat", False)), family=family,
                        note=str(row.get("note", "")), unverified=tuple(row.get("unverified", ())))
    return None


# --- the rules --------------------------------------------------------------------------------


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.strip().split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise UsageError(f"CUDA version {version!r} is not of the form MAJOR.MINOR[.PATCH]") from None


def compat(cuda: str, host: Host, gpu: Gpu | None, *, entrypoint: bool = True, image: str = "the image") -> Compat:
    """How an image built with ``cuda`` runs on ``host`` (NVIDIA's rules, hosts.toml ``[cuda]``).

    native: the host's driver ships that CUDA major.minor or newer; minor-version compatibility:
    same CUDA major family, driver at or above the major's minimum; forward compatibility: a
    data-centre GPU, a driver branch the image's cuda-compat package supports, the image's
    entrypoint loading it (``entrypoint``), and a host where it is counted."""
    rules = _table()["cuda"]
    want, have = _major_minor(cuda), _major_minor(host.cuda)
    needs = f"{image} needs CUDA {cuda}"
    if gpu is not None and gpu.min_driver is not None and host.driver < gpu.min_driver:
        return Compat(CANNOT, f"driver {host.driver} does not support {gpu.family}'s {gpu.gpu} (R{gpu.min_driver} or later)")
    if want <= have:
        return Compat(NATIVE, f"{needs}, which driver {host.driver} runs natively")
    major = str(want[0])
    floor = rules["minor_version_min_driver"].get(major)
    if floor is not None and host.driver >= int(floor):
        return Compat(MINOR, f"{needs}, which driver {host.driver} runs by minor-version compatibility "
                             f"(CUDA {major}.x from driver {floor})")
    why = f"CUDA {major}.x needs driver {floor} or later" if floor is not None else f"no driver rule for CUDA {major}.x"
    branches = [int(b) for b in rules["forward_compat_branches"].get(major, ())]
    if host.driver not in branches:
        forward = f"forward compatibility does not cover driver {host.driver}"
    elif gpu is not None and not gpu.datacenter:
        forward = f"forward compatibility needs a data-centre GPU ({gpu.family}'s {gpu.gpu} is not one)"
    elif not host.forward_compat:
        forward = host.note or f"forward compatibility is not counted on {host.describe()}"
    elif not entrypoint:
        forward = "forward compatibility needs NVIDIA's entrypoint, which this container replaces"
    else:
        unverified = f"forward_compat_branches.{major}" in rules.get("unverified", ())
        return Compat(FORWARD, f"{needs}, which driver {host.driver} runs only by forward compatibility (the image's "
                               f"cuda-compat libraries, loaded by NVIDIA's entrypoint{'; unverified for this branch' if unverified else ''})")
    return Compat(CANNOT, f"{needs}, which driver {host.driver} cannot run ({why}; {forward})")


def best_ami(cuda: str, gpu: Gpu | None) -> Host | None:
    """The oldest AMI (in :func:`nvidia_amis` order) that runs ``cuda`` natively or by
    minor-version compatibility on ``gpu``; None when none does."""
    for host in nvidia_amis():
        if compat(cuda, host, gpu).how in (NATIVE, MINOR):
            return host
    return None


def releases_starting_on(host: Host, gpu: Gpu | None) -> list[str]:
    """SageMaker releases (newest first) whose CUDA ``host`` runs natively or by minor-version compatibility."""
    return [r.name for r in sagemaker_releases() if r.cuda and compat(r.cuda, host, gpu).how in (NATIVE, MINOR)]


def check_host(cuda: str | None, instance_type: str, ami: str | None, *, image: str = "the image",
               entrypoint: bool = True) -> HostVerdict:
    """Whether an image of ``cuda`` (None: unknown, e.g. the user's own image) starts on
    ``instance_type`` with InferenceAmiVersion ``ami`` (None: the family's default host), how, and
    which AMI to set. With no AMI given, one is chosen when the default host cannot run the image
    natively or by minor-version compatibility: the oldest that can. ``image`` names it in the reason."""
    gpu = gpu_of(instance_type)
    table_amis = _table()["amis"]
    if gpu is None:
        if ami is not None and table_amis.get(ami, {}).get("accelerator") == "nvidia":
            return HostVerdict(instance_type, cuda, False, CANNOT, f"{ami} is an NVIDIA GPU host image but {instance_type} "
                               "has no NVIDIA GPU", ami=ami)
        return HostVerdict(instance_type, cuda, True, NO_GPU, f"{instance_type} has no NVIDIA GPU: no driver to check", ami=ami)
    if ami is not None:
        return _check_ami(cuda, instance_type, ami, gpu, image, entrypoint)
    default = default_host(instance_type)
    if cuda is None:
        where = default.describe() if default else f"AWS documents no default driver for {gpu.family}"
        return HostVerdict(instance_type, None, None, UNKNOWN, f"{where}: the CUDA of {image} is unknown, so mme cannot "
                           "check it", host=default)
    on_default = compat(cuda, default, gpu, entrypoint=entrypoint, image=image) if default else None
    if default is not None and on_default is not None and on_default.how in (NATIVE, MINOR):
        return HostVerdict(instance_type, cuda, True, on_default.how,
                           f"{default.describe()}: {on_default.reason}; no InferenceAmiVersion needed",
                           host=default, default=on_default, alternative=_name(best_ami(cuda, gpu)))
    chosen = best_ami(cuda, gpu)
    because = (f"{default.describe()} cannot start it" if default is not None
               else f"AWS documents no default driver for {gpu.family}")
    if chosen is None:
        newest = nvidia_amis()[-1]
        first = on_default.reason if on_default is not None else f"{image} needs CUDA {cuda}"
        where = default.describe() if default is not None else gpu.family
        return HostVerdict(instance_type, cuda, False, CANNOT,
                           f"{where}: {first}, and no InferenceAmiVersion runs it natively or by minor-version "
                           f"compatibility (newest: {newest.describe()})", host=default, default=on_default)
    how = compat(cuda, chosen, gpu, entrypoint=entrypoint, image=image)
    return HostVerdict(instance_type, cuda, True, how.how,
                       f"{chosen.describe()}: {how.reason}; InferenceAmiVersion set because {because}",
                       host=chosen, ami=chosen.ami, chosen=True, alternative=chosen.ami, default=on_default)


def _name(host: Host | None) -> str | None:
    return host.ami if host is not None else None


def _check_ami(cuda: str | None, instance_type: str, ami: str, gpu: Gpu, image: str, entrypoint: bool) -> HostVerdict:
    row = _table()["amis"].get(ami)
    if row is None:
        return HostVerdict(instance_type, cuda, None, UNKNOWN, f"{ami} is not in mme/hosts.toml: its driver is unknown, "
                           f"so mme cannot check {image} against it", ami=ami)
    if row.get("accelerator") != "nvidia":
        return HostVerdict(instance_type, cuda, False, CANNOT, f"{ami} is a host image for {row.get('accelerator')} "
                           f"accelerators (Inferentia, Trainium), but {instance_type} has an NVIDIA GPU", ami=ami,
                           alternative=_name(best_ami(cuda, gpu)) if cuda else None)
    host = _ami_host(ami)
    if cuda is None:
        return HostVerdict(instance_type, None, None, UNKNOWN, f"{host.describe()}: the CUDA of {image} is unknown, so "
                           "mme cannot check it", host=host, ami=ami)
    how = compat(cuda, host, gpu, entrypoint=entrypoint, image=image)
    return HostVerdict(instance_type, cuda, how.starts, how.how, f"{host.describe()}: {how.reason}", host=host, ami=ami,
                       alternative=_name(best_ami(cuda, gpu)))


def require_starts(verdict: HostVerdict, option: str = AMI_OPTION) -> HostVerdict:
    """Refuse (one line, with the fix) an image that cannot start; return the verdict otherwise."""
    if verdict.starts is False:
        raise HostDriverError(f"{verdict.reason}; {verdict.fix(option)}")
    return verdict


def check_training_host(cuda: str | None, instance_type: str, *, image: str = "the image") -> HostVerdict:
    """A SageMaker training job's host: AWS documents no NVIDIA driver for training hosts and
    CreateTrainingJob takes no AMI, so nothing is refused. ``starts`` is None (not known) on a
    GPU; the verdict's ``default`` says what the family's *inference* default host would do,
    as a hint of risk (:func:`training_warning`)."""
    gpu = gpu_of(instance_type)
    if gpu is None:
        return HostVerdict(instance_type, cuda, True, NO_GPU, f"{instance_type} has no NVIDIA GPU: no driver to check")
    rules = _table()["cuda"]
    if cuda is None:
        return HostVerdict(instance_type, None, None, UNKNOWN, f"training host of {gpu.family}: AWS documents no NVIDIA "
                           f"driver for training hosts and the CUDA of {image} is unknown: not checked")
    major = str(_major_minor(cuda)[0])
    floor = rules["minor_version_min_driver"].get(major)
    branches = ", ".join(str(b) for b in rules["forward_compat_branches"].get(major, ())) or "none"
    default = default_host(instance_type)
    on_default = compat(cuda, default, gpu, image=image) if default is not None else None
    return HostVerdict(instance_type, cuda, None, UNKNOWN,
                       f"training host of {gpu.family}: AWS documents no NVIDIA driver for training hosts; {image} needs "
                       f"CUDA {cuda}: driver {floor} or later (minor-version compatibility), or a data-centre GPU on "
                       f"branch {branches} (forward compatibility through NVIDIA's entrypoint, which the job keeps)",
                       default=on_default)


def training_warning(verdict: HostVerdict) -> str | None:
    """A warning when a training job may not start: the CUDA is unknown, or the family's inference
    default host (the oldest driver AWS documents for it) would not run it; None otherwise."""
    if verdict.how == NO_GPU:
        return None
    if verdict.cuda is None:
        return f"{verdict.reason}; if the job fails with 'CUDA driver version is insufficient', use an image of an older CUDA"
    if verdict.default is not None and verdict.default.how in (NATIVE, MINOR):
        return None
    default = default_host(verdict.instance_type)
    inference = (f"{default.describe()} for inference could not run it" if default is not None
                 else f"AWS documents no default driver for {family_of(verdict.instance_type)} either")
    return (f"{verdict.reason}; {inference}. If the job stops with 'CUDA driver version is insufficient' or "
            "'compatibility mode is UNAVAILABLE', compile for an older --triton-release")


# --- command line ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mme.hosts", description="Does a release's image start on a SageMaker host?")
    parser.add_argument("--instance-type", required=True, help="e.g. ml.g5.2xlarge")
    parser.add_argument("--release", help="a release of mme/versions.toml (default: its `default`)")
    parser.add_argument("--ami", help="an InferenceAmiVersion (default: the family's default host)")
    parser.add_argument("--all", action="store_true", help="every AMI and the default host, for every SageMaker release")
    args = parser.parse_args(argv)

    try:
        rels = sagemaker_releases() if args.all else [release(args.release)]
        hosts: list[str | None] = [None, *[h.ami for h in nvidia_amis()]] if args.all else [args.ami]
        for rel in rels:
            for ami in hosts:
                verdict = check_host(rel.cuda, args.instance_type, ami, image=f"release {rel.name}")
                state = {True: "starts", False: "REFUSED", None: "unchecked"}[verdict.starts]
                print(f"{rel.name} on {ami or 'default'}: {state} ({verdict.how}) - {verdict.line()}")
    except UsageError as exc:
        print(f"mme.hosts: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
