"""docker/: real linters (hadolint, yamllint, kubernetes-validate against the bundled Kubernetes
schemas) and structure checks that tie the files to the code: pinned bases and packages, the
cache variables equal to ``cache env``, the wheel name equal to the project's version, the
Kubernetes probes and budgets consistent with the sidecar's options; and the sidecar running
with nothing but the packages its image installs."""

from __future__ import annotations

import os
import json
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILES = ("Dockerfile.runtime", "Dockerfile.sidecar")
DEPLOYMENT = DOCKER / "k8s" / "deployment.yaml"
BIN = Path(sys.executable).parent

sys.path.insert(0, str(REPO / "tests" / "warmup" / "sidecar_support"))


def tool(name: str) -> str:
    """A linter installed by scripts/test.sh; CI must have it, elsewhere the test is skipped."""
    path = shutil.which(name) or (str(BIN / name) if (BIN / name).exists() else None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (scripts/test.sh installs it)")
        pytest.skip(f"{name} is not installed (scripts/test.sh installs it)")
    return path


# --- a small Dockerfile reader ---------------------------------------------------------------------
def instructions(name: str) -> list[tuple[str, str, str]]:
    """(stage, INSTRUCTION, arguments) per instruction, continuation lines joined."""
    out: list[tuple[str, str, str]] = []
    stage = ""
    pending = ""
    for raw in (DOCKER / name).read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = " ".join((pending + line).split()), ""
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            m = re.search(r"\bAS\s+(\S+)$", rest, re.I)
            stage = m.group(1) if m else ""
        out.append((stage, word, rest.strip()))
    return out


def arg_defaults(name: str) -> dict[str, str]:
    return {k: v for _, w, a in instructions(name) if w == "ARG" and "=" in a
            for k, v in [a.split("=", 1)]}


def stages(name: str) -> list[str]:
    return [s for s, w, _ in instructions(name) if w == "FROM"]


# --- real linters -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name):
    r = subprocess.run([tool("hadolint"), "--no-color", str(DOCKER / name)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr


def test_yamllint_finds_nothing():
    r = subprocess.run([tool("yamllint"), "-s", "-c", str(DOCKER / "yamllint.yaml"),
                        str(DEPLOYMENT), str(DOCKER / "k8s" / "podmonitor.yaml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_kubernetes_schemas_accept_the_manifest_strictly(version):
    r = subprocess.run([tool("kubernetes-validate"), "--strict", "-k", version, str(DEPLOYMENT)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("passed") == 2  # the Deployment and the Service


# --- Dockerfiles ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_images_are_build_args_with_pinned_tags(name):
    froms = [a.split()[0] for _, w, a in instructions(name) if w == "FROM"]
    defaults = arg_defaults(name)
    for ref in froms:
        m = re.fullmatch(r"\$\{(\w+)\}", ref)
        if m is None:  # a previous stage
            assert ref in stages(name), ref
            continue
        assert _pinned(defaults[m.group(1)], version=True), defaults[m.group(1)]
    text = (DOCKER / name).read_text()
    assert "latest" not in text


def test_runtime_image_restores_the_archive_and_sets_the_cache_variables():
    from cache_tools import locations, render

    ins = instructions("Dockerfile.runtime")
    assert stages("Dockerfile.runtime") == ["wheel", "base", "restore", "runtime"]
    assert [a for s, w, a in ins if w == "FROM"][1] == "${SGLANG_IMAGE} AS base"
    restore_runs = [a for s, w, a in ins if s == "restore" and w == "RUN"]
    assert restore_runs == ["sglang-warmup cache restore /tmp/sglang-cache.tar --dest "
                            "/opt/sglang-cache && sglang-warmup cache ls --root /opt/sglang-cache"]
    assert ("restore", "COPY", "${CACHE_ARCHIVE} /tmp/sglang-cache.tar") in ins
    assert ("runtime", "COPY", "--from=restore --chown=${CACHE_OWNER} /opt/sglang-cache "
                               "/opt/sglang-cache") in ins
    # the archive itself never reaches the final image
    assert not [a for s, w, a in ins if s == "runtime" and "CACHE_ARCHIVE" in a]
    env = [f"ENV {a}" for s, w, a in ins if s == "runtime" and w == "ENV"]
    expected = [line for line in render.env_text(locations.exports("/opt/sglang-cache"),
                                                  "dockerfile").splitlines()
                if line.startswith("ENV ")]
    # the cache variables exactly as `cache env --format dockerfile` prints them, then the
    # non-root user's home (caches a library resolves from $HOME land where it may write), then
    # the steps record prebake wrote beside the archive, for serve
    assert env == expected + ["ENV HOME=/home/sglang",
                              "ENV WARMUP_STEPS=/opt/sglang-warmup/steps.json"]
    assert ("runtime", "COPY", "${STEPS_RECORD} /opt/sglang-warmup/steps.json") in ins
    assert arg_defaults("Dockerfile.runtime")["STEPS_RECORD"] == \
        arg_defaults("Dockerfile.runtime")["CACHE_ARCHIVE"] + ".steps.json"


def test_the_wheel_name_follows_the_project_version():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name in DOCKERFILES:
        wheels = set(re.findall(r"sglang_warmup-[^ ]+\.whl", (DOCKER / name).read_text()))
        assert wheels == {f"sglang_warmup-{version}-py3-none-any.whl"}, name


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copied_files_exist_and_are_in_the_build_context(name):
    allowed = [line[1:].rstrip("/") for line in
               (DOCKER / f"{name}.dockerignore").read_text().splitlines() if line.startswith("!")]
    for _, word, args in instructions(name):
        if word != "COPY" or args.startswith("--from"):
            continue
        sources = args.split()[:-1]
        for src in sources:
            if src.startswith("${"):
                assert src in ("${CACHE_ARCHIVE}", "${STEPS_RECORD}")
                src = arg_defaults(name)[src[2:-1]]
            else:
                assert (REPO / src).exists(), src
            assert any(src == a or src.startswith(a + "/") for a in allowed), \
                f"{src} is excluded by {name}.dockerignore"


def test_sidecar_image_runs_the_sidecar_as_a_non_root_user():
    ins = instructions("Dockerfile.sidecar")
    final = [(w, a) for s, w, a in ins if s == "sidecar"]
    from warmup.sidecar.config import DEFAULT_PORT

    assert ("ENTRYPOINT", '["sglang-warmup", "sidecar"]') in final
    assert ("EXPOSE", str(DEFAULT_PORT)) in final
    assert ("USER", "10001") in final
    installs = [a for w, a in final if w == "RUN" and "pip install" in a]
    assert installs[0].startswith("pip install --no-cache-dir --no-deps -r "
                                  "/tmp/requirements-sidecar.txt")
    assert "--no-deps" in installs[1]
    assert not {"torch", "triton", "sglang"} & set(requirements("requirements-sidecar.txt"))


# --- pinned requirements -------------------------------------------------------------------------
def requirements(name: str) -> dict[str, str]:
    pins = {}
    for line in (DOCKER / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.+-]*)", line)
        assert m, f"{name}: not pinned: {line}"
        pins[_norm(m.group(1))] = m.group(2)
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots: list[str]) -> dict[str, list]:
    """Distribution -> its unconditional requirements, for everything ``roots`` pull in."""
    from packaging.requirements import Requirement

    seen: dict[str, list] = {}
    todo = list(roots)
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        reqs = []
        for raw in metadata.requires(name) or []:
            r = Requirement(raw)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                reqs.append(r)
        seen[name] = reqs
        todo.extend(r.name for r in reqs)
    return seen


@pytest.mark.parametrize("name", ["requirements-sidecar.txt", "requirements-runtime.txt",
                                  "requirements-build.txt"])
def test_requirements_are_pinned(name):
    assert requirements(name)


def test_the_sidecar_lock_is_the_whole_closure_and_consistent():
    pins = requirements("requirements-sidecar.txt")
    project = [r for r in metadata.requires("sglang-warmup") if "extra ==" not in r]
    roots = [re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in project]
    assert sorted(_norm(r) for r in roots) == ["prometheus-client", "pyyaml", "typer"]
    closure = _closure(roots)
    assert set(pins) == set(closure)
    for dist, reqs in closure.items():  # every pin satisfies what its dependents ask for
        for r in reqs:
            assert r.specifier.contains(pins[_norm(r.name)], prereleases=True), (dist, str(r))


def test_the_sidecar_runs_with_only_the_packages_of_its_image(tmp_path):
    """A Python with no site-packages, only the distributions of requirements-sidecar.txt and
    this repository on its path: the sidecar warms the stand-in and /ready turns 200."""
    from harness import PLAN, free_port, get, start_standin, wait_until

    deps = tmp_path / "site"
    deps.mkdir()
    for dist in requirements("requirements-sidecar.txt"):
        files = metadata.distribution(dist).files or []
        tops = {f.parts[0] for f in files if not f.parts[0].endswith((".dist-info", ".data"))
                and f.parts[0] not in ("..", "bin")}
        for top in tops:
            src = Path(metadata.distribution(dist).locate_file(top))
            if src.exists() and not (deps / top).exists():
                (deps / top).symlink_to(src)
    server = start_standin()
    port = free_port()
    code = ("import sys; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]; "
            "from warmup.cli import main; main(sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", code, str(deps), str(REPO),
                             "sidecar", "--plan", str(PLAN), "--url", server.url, "--port",
                             str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        try:
            wait_until(lambda: get(f"http://127.0.0.1:{port}/ready")[0] == 200 or
                       proc.poll() is not None, 60, "ready")
        except AssertionError:
            pass
        assert proc.poll() is None, proc.stdout.read()
        assert get(f"http://127.0.0.1:{port}/ready")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        server.kill()


# --- Kubernetes ---------------------------------------------------------------------------------
def _docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(DEPLOYMENT.read_text()) if d]


def _containers() -> dict[str, dict]:
    dep = next(d for d in _docs() if d["kind"] == "Deployment")
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def _sidecar_options() -> dict:
    """The sidecar container's args, parsed by the real ``sglang-warmup sidecar`` command."""
    import typer.main

    from warmup.cli import app

    command = typer.main.get_command(app).get_command(None, "sidecar")  # built on demand
    ctx = command.make_context("sidecar", list(_containers()["warmup"]["args"]))
    return ctx.params


def _budget(probe: dict) -> int:
    return probe["periodSeconds"] * probe["failureThreshold"]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _pinned(image: str, *, version: bool = False) -> bool:
    """A digest (``name@sha256:<64 hex>``), or a tag that is not ``latest`` (with a version
    number when ``version``)."""
    if "@" in image:
        return re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", image) is not None
    repo, _, tag = image.rpartition(":")
    return bool(repo and tag and tag != "latest"
                and re.search(r"\d+\.\d+" if version else r"\d", tag))


def test_image_references_may_be_digests_or_versioned_tags():
    assert _pinned("lmsysorg/sglang@sha256:" + "0" * 64)
    assert _pinned("python:3.11.14-slim-bookworm", version=True)
    assert not _pinned("lmsysorg/sglang:latest") and not _pinned("lmsysorg/sglang@sha256:abc")


def test_k8s_images_are_pinned():
    for c in _containers().values():
        assert _pinned(c["image"]), c["image"]


def test_k8s_sidecar_probes_ports_and_budgets_fit_the_warmup():
    opts = _sidecar_options()
    c = _containers()
    side, sglang = c["warmup"], c["sglang"]
    port = {p["name"]: p["containerPort"] for p in side["ports"]}["warmup"]
    assert opts["port"] == port
    for probe, path in (("readinessProbe", "/ready"), ("startupProbe", "/ready"),
                        ("livenessProbe", "/live")):
        assert side[probe]["httpGet"] == {"path": path, "port": "warmup"}, probe
    # the kubelet probes the pod's address, and the sidecar listens on loopback by default:
    # the manifest binds the pod's IP from the downward API
    assert opts["host"] == "$(POD_IP)"
    pod_ip = next(e for e in side["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # the sidecar talks to the SGLang container's port over the pod's loopback
    sglang_port = {p["name"]: p["containerPort"] for p in sglang["ports"]}["http"]
    assert opts["url"] == f"http://127.0.0.1:{sglang_port}"
    assert _arg(sglang["args"], "--port") == str(sglang_port)
    # budgets: SGLang's own start fits the sidecar's wait, and the sidecar's startup probe is
    # the budget its projection is logged against, leaving room for the plan
    assert _budget(sglang["startupProbe"]) <= opts["deadline"]
    assert _budget(side["startupProbe"]) == opts["startup_budget"]
    assert opts["startup_budget"] - opts["deadline"] >= 300
    # readiness: one slow answer (a timeout) does not take a ready pod out of the Service,
    # a sidecar that says 503 does within half a minute
    ready = side["readinessProbe"]
    assert ready["failureThreshold"] >= 2 and _budget(ready) <= 30
    # the plan ships in the wheel the sidecar image installs: named, not copied in
    from warmup.plan import shipped

    assert shipped.path(str(opts["plan"])) is not None


def test_k8s_shares_the_state_and_metrics_directories():
    opts = _sidecar_options()
    c = _containers()
    side, sglang = c["warmup"], c["sglang"]
    dep = next(d for d in _docs() if d["kind"] == "Deployment")
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    mounts = {name: {m["name"]: m["mountPath"] for m in c[name]["volumeMounts"]} for name in c}
    for vol in ("warmup-state", "warmup-metrics"):
        assert "emptyDir" in volumes[vol]
        assert mounts["sglang"][vol] == mounts["warmup"][vol]
    env_s, env_w = _env(sglang), _env(side)
    assert env_s["WARMUP_ENABLE"] == "1"
    assert env_s["WARMUP_STATE_DIR"] == mounts["sglang"]["warmup-state"] == str(opts["state_dir"])
    assert opts["second_pass"] is True  # verifiable: the state directory is shared
    assert (env_s["PROMETHEUS_MULTIPROC_DIR"] == env_w["PROMETHEUS_MULTIPROC_DIR"]
            == mounts["sglang"]["warmup-metrics"])
    assert "--enable-metrics" in sglang["args"]
    # the API key comes from a Secret, never from the args
    key = next(e for e in side["env"] if e["name"] == "WARMUP_API_KEY")
    assert key["valueFrom"]["secretKeyRef"]["optional"] is True
    assert not any("key" in a.lower() for a in side["args"])


def test_k8s_service_selects_the_pod_and_the_sidecar_runs_unprivileged():
    svc = next(d for d in _docs() if d["kind"] == "Service")
    dep = next(d for d in _docs() if d["kind"] == "Deployment")
    assert svc["spec"]["selector"] == dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    sec = _containers()["warmup"]["securityContext"]
    assert sec["runAsNonRoot"] is True and sec["runAsUser"] == 10001
    assert sec["readOnlyRootFilesystem"] is True


def test_k8s_pod_meets_the_restricted_pod_security_standard():
    """What a namespace enforcing "restricted" checks: non-root, no privilege escalation, all
    capabilities dropped, the runtime's default seccomp profile; plus requests and limits."""
    spec = next(d for d in _docs() if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["initContainers"] + spec["containers"]:
        sec = c["securityContext"]
        assert sec["allowPrivilegeEscalation"] is False, c["name"]
        assert sec["capabilities"]["drop"] == ["ALL"], c["name"]
        res = c["resources"]
        assert {"cpu", "memory"} <= set(res["requests"]), c["name"]
        assert "memory" in res["limits"], c["name"]
    sglang = _containers()["sglang"]["resources"]
    assert sglang["requests"]["nvidia.com/gpu"] == sglang["limits"]["nvidia.com/gpu"] == 1
    # the runtime image runs SGLang as that user
    runtime = (DOCKER / "Dockerfile.runtime").read_text()
    assert "USER 10001" in runtime and "ARG CACHE_OWNER=10001:10001" in runtime


def test_k8s_init_container_pulls_the_cache_from_a_registry():
    """The initContainer runs the real `cache pull` arguments (parsed by the command) from an
    oci:// reference, into the volume SGLang sees where the image's cache variables point,
    downloading beside (never under) the destination, with Docker's login from a Secret."""
    import typer.main

    from cache_tools.stores import oci
    from warmup.cli import app

    spec = next(d for d in _docs() if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    init = next(c for c in spec["initContainers"] if c["name"] == "jit-cache")
    assert init["image"] == _containers()["sglang"]["image"]     # the same toolchain
    assert init["command"][:2] == ["/bin/sh", "-c"] and \
        init["command"][2].startswith('sglang-warmup cache pull "$@" ||')
    pull = typer.main.get_command(app).get_command(None, "cache").get_command(None, "pull")
    params = pull.make_context("pull", list(init["args"])).params
    ref = oci.parse(params["ref"])
    assert not ref.plain_http and not ref.tag       # TLS; tagged by the fingerprint
    mounts = {m["name"]: m for m in init["volumeMounts"]}
    volume = mounts["jit-cache"]["mountPath"]
    assert str(params["dest"]) == f"{volume}/cache"
    sglang = {m["name"]: m for m in _containers()["sglang"]["volumeMounts"]}["jit-cache"]
    assert (sglang["mountPath"], sglang["subPath"]) == ("/opt/sglang-cache", "cache")
    runtime = (DOCKER / "Dockerfile.runtime").read_text()
    assert 'ENV SGLANG_CACHE_DIR="/opt/sglang-cache"' in runtime
    env = _env(init)
    assert env["TMPDIR"] == volume and not env["TMPDIR"].startswith(str(params["dest"]))
    volumes = {v["name"]: v for v in spec["volumes"]}
    secret = volumes["registry-login"]["secret"]
    assert secret["optional"] is True
    assert secret["items"] == [{"key": ".dockerconfigjson", "path": "config.json"}]
    assert env["DOCKER_CONFIG"] == mounts["registry-login"]["mountPath"]
    assert "emptyDir" in volumes["jit-cache"]


def test_both_metrics_endpoints_are_scraped():
    monitor = yaml.safe_load((DOCKER / "k8s" / "podmonitor.yaml").read_text())
    assert monitor["kind"] == "PodMonitor"
    dep = next(d for d in _docs() if d["kind"] == "Deployment")
    assert monitor["spec"]["selector"]["matchLabels"] == dep["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"] for c in _containers().values() for p in c["ports"]}
    scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert scraped == {"http", "warmup"} <= ports
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["podMetricsEndpoints"])
    assert "--enable-metrics" in _containers()["sglang"]["args"]


# --- the Grafana dashboard ------------------------------------------------------------------
def _exported_metric_names() -> set[str]:
    """Every metric name sglang-warmup exports, as Prometheus exposes them (counters with
    ``_total``, histograms with ``_bucket``/``_sum``/``_count``), from the real objects."""
    from prometheus_client import CollectorRegistry, generate_latest

    from warmup.observe import metrics

    registry = CollectorRegistry()
    m = metrics.Metrics(registry)
    m.compile_event("warmup", "triton", "miss", 1.0)
    m.kernel_load("warmup", 1.0)
    m.jit_build("warmup", "built", 1.0)
    m.specialization("warmup")
    m.hook_error("metrics")
    m.plan_request("ok")
    m.plan_coverage(done=1, skipped=0, failed=0)
    m.class_time("c", 1.0)
    m.class_first_hit_ratio("c", 1.0)
    m.ready(1.0)
    registry.register(metrics.SidecarCollector(lambda: metrics.SidecarSample(
        "ready", health_wait_s=1.0, warmup_s=1.0, ready_at=1.0, second_pass_misses=0,
        projected_remaining_s=1.0)))
    text = generate_latest(registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_the_dashboard_is_valid_and_queries_only_our_metrics():
    path = REPO / "docker" / "grafana" / "sglang-warmup.json"
    dash = json.loads(path.read_text())
    assert dash["uid"] == "sglang-warmup" and dash["panels"]
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = {name for e in exprs for name in re.findall(r"\b(sglang_warmup_[a-z_]+)", e)}
    exported = _exported_metric_names()
    assert used <= exported, f"queried but not exported: {sorted(used - exported)}"
    # every family we export is on the dashboard somewhere (a new metric gets a panel)
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in exported}
    shown = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in used}
    assert families <= shown, f"exported but not on the dashboard: {sorted(families - shown)}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
