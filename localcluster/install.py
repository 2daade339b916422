"""The whole install, the chart as a Helm release, on the local cluster's
real node (docs/install.md, docs/real-node.md): the locally built images
imported into the node's containerd (never pulled), the chart's local-cluster
overlay with this run's values over it, ``helm upgrade --install``, and a
wait until every workload is available. kwok nodes get no DaemonSet pod:
they keep their simulated slices."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from toposerve.dra_driver.net.handoff.install import RECORD as CNI_RECORD
from toposerve.dra_driver.net.handoff.install import InstallError as CniInstallError
from toposerve.dra_driver.net.handoff.install import data_dir as cni_data_dir
from toposerve.dra_driver.net.handoff.install import uninstall as uninstall_cni
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster import image_keys
from toposerve.localcluster.clusters import api_client, kubeconfig_path
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.realnode import nics
from toposerve.localcluster.realnode.fakedev import stand_in_dev_root
from toposerve.localcluster.realnode.paths import (
    NODE_NAME,
    REAL_NODE_LABEL,
    REAL_NODE_TOLERATION,
    Layout,
    default_layout,
)
from toposerve.localcluster.realnode.tools import find_node_tools
from toposerve.localcluster.tools import cache_dir, helm_path
from toposerve.manifests.chart import (
    DEFAULT_NAMESPACE,
    RELEASE,
    HelmError,
    chart_dir,
    find_helm,
    helm_error,
    helm_values,
)
from toposerve.manifests.render import (
    render_objects,
    router_namespace,
    selected,
    system_namespace,
)
from toposerve.manifests.values import KIND, InstallValues, apply_sets
from toposerve.router.ha.pod_label import ROLE_LABEL
from toposerve.topology.config_file import (
    API_VERSION,
    ConfigError,
    parse_document,
    read_document,
)
from toposerve.topology.profiles import load_profile
from toposerve.topology.sysfs import write_profile_sysfs

Progress = Callable[[str], None]
# what `make image` writes (docs/image.md): the values section of each image
IMAGE_VALUES = {"toposerve": "image", "kube-scheduler": "scheduler.image",
                "redis": "router.redis.image"}
# the real node's stand-in GPUs (topology/profiles) for the driver's DaemonSet
PROFILE = "hgx-h100"
WORKLOADS = ("DaemonSet", "Deployment")
# the real node's pod network (toposerve.localcluster.realnode.node writes it in
# layout.cni_conf): the NIC driver's init container chains toposerve-nic into it
NODE_CONFLIST = "10-toposerve.conflist"
COMPONENT_LABEL = "app.kubernetes.io/component"
# what the local cluster needs and a real cluster does not, shipped with the chart
LOCAL_OVERLAY = "ci/local-cluster-values.yaml"
# objects so annotated outlive `helm uninstall` (docs/install.md)
KEEP_ANNOTATION = "helm.sh/resource-policy"


class InstallError(RuntimeError):
    """The install failed; one line for a person."""


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _archive_ref(archive: Path) -> str | None:
    """The reference an OCI archive is imported as (its index's annotation:
    containerd's own, or the full reference buildah writes as the OCI ref name)."""
    try:
        with tarfile.open(archive) as tar:
            f = tar.extractfile("index.json")
            index = json.loads(f.read()) if f else {}
    except (OSError, tarfile.TarError, KeyError, ValueError):
        return None
    for m in index.get("manifests") or []:
        notes = m.get("annotations") or {}
        ref = notes.get("io.containerd.image.name") or notes.get(
            "org.opencontainers.image.ref.name")
        if ref and ":" in ref and "/" in ref:
            return str(ref)
    return None


def built_images(cache: Path | None = None) -> dict[str, Path]:
    """``make image``'s archives by reference: those it writes for this tree
    (their names carry a hash of the image's inputs, ``image_keys``). An
    archive of another tree (older code under the same tag) is refused with
    one line; outside a checkout, where nothing can be built, the archive of
    each name (the build keeps one)."""
    images_dir = (cache or cache_dir()) / "images"
    try:
        wanted: dict[str, Path] | None = image_keys.expected_archives(cache)
    except image_keys.CannotTell:
        wanted = None
    found: dict[str, Path] = {}
    stale: list[str] = []
    for name in IMAGE_VALUES:
        archive = wanted[name] if wanted else next(iter(sorted(
            images_dir.glob(f"{name}-*.oci.tar"), key=lambda p: p.stat().st_mtime,
            reverse=True)), None)
        ref = _archive_ref(archive) if archive is not None and archive.is_file() else None
        if archive is not None and ref and _image_name(ref) == name:
            found[ref] = archive
        elif any(images_dir.glob(f"{name}-*.oci.tar")):
            stale.append(name)
    missing = sorted(set(IMAGE_VALUES) - {_image_name(r) for r in found} - set(stale))
    if stale:
        raise InstallError(f"the image archives of {', '.join(stale)} in {images_dir} were "
                           "built from another tree: run `make image` (docs/image.md)")
    if missing:
        raise InstallError(f"no image archive for {', '.join(missing)} in {images_dir}: "
                           "run `make image` (docs/image.md)")
    return found


def _image_name(ref: str) -> str:
    return ref.rsplit(":", 1)[0].rsplit("/", 1)[-1]


def import_images(archives: Iterable[Path], layout: Layout | None = None) -> None:
    """``ctr -n k8s.io images import`` into the real node's containerd: the
    images are then present, and the pods' ``imagePullPolicy: Never`` never pulls."""
    layout = layout or default_layout()
    ctr = find_node_tools().ctr
    for archive in archives:
        proc = subprocess.run([str(ctr), "--address", str(layout.containerd_socket), "-n",
                               "k8s.io", "images", "import", "--local", str(archive)],
                              capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise InstallError(f"importing {archive.name} failed: "
                               f"{(proc.stderr or proc.stdout).strip()[-300:]}")


def fake_hardware(layout: Layout | None = None, profile: str = PROFILE) -> tuple[Path, Path]:
    """The real node's stand-in GPUs: a fake sysfs tree and device nodes on
    the host, under the node's config (removed with the node)."""
    base = (layout or default_layout()).config / "hardware"
    sysfs = base / "sysfs"
    if not sysfs.exists():
        write_profile_sysfs(load_profile(profile), sysfs)
    return sysfs, stand_in_dev_root(base / "dev")


def pod_netns_dir(layout: Layout) -> Path:
    """Where the node's containerd pins pod network namespaces (its CRI
    plugin's state, ``netns_mounts_under_state_dir``): the CNI_NETNS paths
    the NIC hand-off enters."""
    return layout.containerd_state / "io.containerd.grpc.v1.cri" / "netns"


def share_pod_netns_dir(layout: Layout) -> Path:
    """The pod network namespaces' folder a shared mount (a bind mount of
    itself), so that the NIC driver's HostToContainer mount of it sees the
    namespaces containerd pins there later; the runtime refuses that mount
    propagation from a private mount, and this machine's / is private (a
    systemd host's is shared). Done before any pod namespace is pinned
    there; the node's teardown unmounts it with everything under its run dir."""
    where = pod_netns_dir(layout)
    where.mkdir(parents=True, exist_ok=True)
    info = Path("/proc/self/mountinfo").read_text().splitlines()
    mine = [line.split() for line in info if line.split()[4] == str(where)]
    if any(any(f.startswith("shared:") for f in m[6:m.index("-")]) for m in mine):
        return where
    pinned = [line.split()[4] for line in info if line.split()[4].startswith(f"{where}/")]
    if pinned:
        raise InstallError(f"{where} is not a shared mount and pods' network namespaces are "
                           f"pinned in it ({len(pinned)}): delete those pods, then install")
    for argv in (["mount", "--bind", str(where), str(where)],
                 ["mount", "--make-shared", str(where)]):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise InstallError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return where


def stand_in_nics(profile: str = PROFILE) -> None:
    """The real node's stand-in NICs for the NIC driver's DaemonSet: veth
    pairs named as the fake sysfs tree names the profile's NICs
    (``toposerve.localcluster.realnode.nics``; gone with the node), unless there."""
    if not nics.FABRIC_NETNS.exists():
        nics.create(nics.stand_ins_for(load_profile(profile).hardware()))


def api_address(cluster: str) -> tuple[str, int]:
    """The API server's loopback host and port, from the cluster's kubeconfig."""
    server = yaml.safe_load(kubeconfig_path(cluster).read_text())["clusters"][0]["cluster"][
        "server"]
    url = urlparse(server)
    if not url.hostname or not url.port:
        raise InstallError(f"the kubeconfig's server {server!r} names no host and port")
    return url.hostname, url.port


def local_sets(cluster: str, images: Mapping[str, Path], sysfs: Path, dev: Path,
               layout: Layout | None = None) -> list[str]:
    """``--set`` values of this run, over the chart's local-cluster overlay;
    the user's come after them and win: the API server's loopback address,
    the imported images, every pod on the real node only (kwok nodes keep
    their simulated slices), the stand-in GPUs and NICs, the node's own CNI
    folders and pod network namespaces for the NIC driver, free ports."""
    layout = layout or default_layout()
    host, port = api_address(cluster)
    http = _free_pair()
    sets = [f"apiServer.host={host}", f"apiServer.port={port}"]
    for ref in images:
        section = IMAGE_VALUES.get(_image_name(ref))
        if section:
            repo, tag = ref.rsplit(":", 1)
            sets += [f"{section}.repository={repo}", f"{section}.tag={tag}"]
    on_real = json.dumps({REAL_NODE_LABEL: "real"})
    tolerate = json.dumps([REAL_NODE_TOLERATION])
    for section in ("gpuDriver", "netDriver", "extender", "scheduler", "router",
                    "router.redis"):
        sets += [f"{section}.nodeSelector={on_real}", f"{section}.tolerations={tolerate}"]
    sets += [f"gpuDriver.sysfsRoot={sysfs}", f"gpuDriver.devRoot={dev}",
             f"netDriver.sysfsRoot={sysfs}", f"netDriver.devRoot={dev}",
             f"netDriver.netnsDir={pod_netns_dir(layout)}",
             f"netDriver.kubeletDir={layout.kubelet_root}",
             f"netDriver.cni.binDir={layout.cni_bin}", f"netDriver.cni.confDir={layout.cni_conf}",
             f"netDriver.cni.chainInto={NODE_CONFLIST}",
             # the router pair and Redis on the node's loopback (the overlay):
             # free ports of this machine (the pair's gRPC ports too, which
             # the endpoint-picker mode serves)
             f"router.port={http}", f"router.pickerPort={_free_pair({http, http + 1})}",
             f"router.redis.port={free_port()}"]
    return sets


def _free_pair(taken: Collection[int] = ()) -> int:
    """A free port whose next one is free too, neither in ``taken``: the two
    router replicas'."""
    while True:
        port = free_port()
        if port < 65535 and _is_free(port + 1) and not {port, port + 1} & set(taken):
            return port


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def local_values(cluster: str, images: Mapping[str, Path], sysfs: Path, dev: Path,
                 values_file: str | Path | None = None, sets: Sequence[str] = (),
                 layout: Layout | None = None) -> InstallValues:
    """The chart's local-cluster overlay, this run's values over it, then
    the values file, then the user's ``--set``."""
    overlay = read_document(chart_dir() / LOCAL_OVERLAY)
    doc = apply_sets(overlay, local_sets(cluster, images, sysfs, dev, layout))
    source = "the local cluster's values"
    if values_file is not None:
        source += f", {values_file}"
        file_doc = read_document(values_file)
        if not isinstance(file_doc, dict):
            raise ConfigError(f"{values_file}: expected a YAML mapping")
        doc = _merge(doc, file_doc)
    if sets:
        source += " with --set " + " ".join(sets)
    return parse_document(apply_sets(doc, sets), InstallValues, KIND, source)


def with_sets(values: InstallValues, sets: Sequence[str]) -> InstallValues:
    """``values`` with ``--set`` assignments over them: an upgrade's values
    change, checked by the model as an install's are."""
    doc = {"apiVersion": API_VERSION, "kind": KIND, **helm_values(values)}
    try:
        return parse_document(apply_sets(doc, sets), InstallValues, KIND,
                              "the installed values with --set " + " ".join(sets))
    except ConfigError as err:
        raise InstallError(str(err)) from None


def _merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = (_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict)
                  else v)
    return out


def _path(obj: Mapping[str, Any], name: bool = True) -> str:
    api = obj["apiVersion"]
    base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    kind = str(obj["kind"]).lower()
    plural = (kind[:-1] + "ies" if kind.endswith("y") else kind + "es" if kind.endswith("s")
              else kind + "s")
    ns = obj["metadata"].get("namespace")
    path = f"{base}/namespaces/{ns}/{plural}" if ns else f"{base}/{plural}"
    return f"{path}/{obj['metadata']['name']}" if name else path


def helm(cluster: str, args: Sequence[str], timeout_s: float = 600) -> str:
    """``helm ARGS`` against ``cluster`` (its loopback kubeconfig); its
    stdout, or InstallError with helm's own line of what failed."""
    try:
        binary = find_helm(helm_path())
    except HelmError as err:
        raise InstallError(str(err)) from None
    argv = [str(binary), *args, "--kubeconfig", str(kubeconfig_path(cluster))]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        raise InstallError(f"helm {args[0]} did not end in {timeout_s:.0f}s") from None
    if done.returncode != 0:
        raise InstallError(f"helm {args[0]} failed: {helm_error(done.stderr)}")
    return done.stdout


def release_namespace(values: InstallValues) -> str:
    return values.namespace or DEFAULT_NAMESPACE


def helm_install(cluster: str, values: InstallValues, release: str = RELEASE,
                 chart: Path | None = None) -> None:
    """``helm upgrade --install`` of the chart (``chart``: another version
    of it) with ``values``, as any admin's install or upgrade: the release's
    history, its generated Secrets kept across upgrades. Availability is
    waited for apart (wait_available), with progress."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="toposerve-values-") as f:
        json.dump(helm_values(values), f)  # JSON is YAML
        f.flush()
        helm(cluster, ["upgrade", "--install", release, str(chart or chart_dir()),
                       "--namespace", release_namespace(values), "--create-namespace",
                       "--values", f.name])


def rollback(cluster: str, values: InstallValues, revision: int | None = None,
             release: str = RELEASE) -> None:
    """``helm rollback`` of the release to ``revision`` (the one before the
    last when None): a new revision with that one's manifest and values.
    Availability is waited for apart (wait_available)."""
    helm(cluster, ["rollback", release, *([str(revision)] if revision else []),
                   "--namespace", release_namespace(values)])


def history(cluster: str, values: InstallValues, release: str = RELEASE
            ) -> list[dict[str, Any]]:
    """``helm history``: the release's revisions, oldest first (revision,
    status, chart, app_version, description)."""
    out = json.loads(helm(cluster, ["history", release, "--namespace",
                                    release_namespace(values), "--output", "json"]))
    return sorted(out, key=lambda r: int(r["revision"]))


def releases(cluster: str) -> list[dict[str, Any]]:
    """``helm list --all-namespaces``: every release, whatever its state
    (helm 4 names each; without them it lists only the deployed and failed)."""
    states = ["--deployed", "--failed", "--pending", "--superseded", "--uninstalling"]
    return list(json.loads(helm(cluster, ["list", "--all-namespaces", *states,
                                          "--output", "json"])) or [])


def _available(obj: Mapping[str, Any]) -> tuple[bool, str]:
    st = obj.get("status") or {}
    fresh = st.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
    if obj["kind"] == "DaemonSet":
        want = st.get("desiredNumberScheduled", 0)
        have = st.get("numberAvailable", 0)
        ok = fresh and want >= 1 and have == want and st.get("updatedNumberScheduled") == want
    else:
        want = (obj.get("spec") or {}).get("replicas", 1)
        have = st.get("availableReplicas", 0)
        ok = fresh and have == want and st.get("updatedReplicas") == want
    return ok, f"{have}/{want}"


def wait_available(api: Any, objects: Iterable[Mapping[str, Any]], timeout_s: float = 300,
                   progress: Progress = _stderr) -> float:
    """Until every DaemonSet and Deployment is available; the seconds it took.
    A line each time a workload's count changes."""
    rest = JsonApi(api)
    workloads = [o for o in objects if o["kind"] in WORKLOADS]
    started = time.monotonic()
    said: dict[str, str] = {}
    while True:
        waiting = []
        for w in workloads:
            name = f"{w['kind'].lower()}/{w['metadata']['name']}"
            try:
                ok, count = _available(rest.request("GET", _path(w), timeout=10))
            except ApiError as err:
                ok, count = False, f"unreadable ({err.status})"
            if said.get(name) != count:
                said[name] = count
                progress(f"  {name}: {count} available")
            if not ok:
                waiting.append(name)
        took = time.monotonic() - started
        if not waiting:
            return took
        if took > timeout_s:
            raise InstallError(f"not available after {timeout_s:.0f}s: {', '.join(waiting)}: "
                               + _pod_problems(rest, workloads))
        time.sleep(0.5)


def _pod_problems(rest: JsonApi, workloads: Sequence[Mapping[str, Any]]) -> str:
    """The waiting reasons of the install's pods: what to look at first."""
    out = []
    for ns in sorted({str(w["metadata"]["namespace"]) for w in workloads}):
        for p in rest.request("GET", f"/api/v1/namespaces/{ns}/pods").get("items") or []:
            for c in (p.get("status") or {}).get("containerStatuses") or []:
                why = (c.get("state") or {}).get("waiting") or {}
                if why:
                    out.append(f"{p['metadata']['name']}: {why.get('reason')} "
                               f"{why.get('message', '')[:120]}")
    return "; ".join(out) or "(no pod waits)"


@dataclass(frozen=True)
class Installed:
    values: InstallValues
    objects: list[dict[str, Any]]
    seconds: float  # from the first import to every workload available


def install(cluster: str, values_file: str | Path | None = None, sets: Sequence[str] = (),
            progress: Progress = _stderr, timeout_s: float = 300,
            layout: Layout | None = None, chart: Path | None = None) -> Installed:
    """Import, render, apply, wait: the whole stack on the real node of
    ``cluster`` (which runs: ``toposerve cluster up --real-node``); ``chart``:
    another version of the chart (an upgrade test's older one)."""
    layout = layout or default_layout()
    started = time.monotonic()
    images = built_images()
    import_images(images.values(), layout)
    progress(f"imported {', '.join(sorted(images))} in {time.monotonic() - started:.1f}s")
    sysfs, dev = fake_hardware(layout)
    try:
        values = local_values(cluster, images, sysfs, dev, values_file, sets, layout)
    except ConfigError as err:
        raise InstallError(str(err)) from None
    if values.net_driver.enabled:
        stand_in_nics()
        share_pod_netns_dir(layout)
    objects = render_objects(values, helm=_helm_binary())
    helm_install(cluster, values, chart=chart)
    progress(f"helm release {RELEASE} in {release_namespace(values)}: {len(objects)} objects")
    wait_available(api_client(cluster), objects, timeout_s, progress)
    took = time.monotonic() - started
    progress(f"installed: every workload available in {took:.1f}s")
    return Installed(values, objects, took)


def _helm_binary() -> Path:
    try:
        return find_helm(helm_path())
    except HelmError as err:
        raise InstallError(str(err)) from None


def kept_objects(values: InstallValues) -> list[dict[str, Any]]:
    """The release's objects that ``helm uninstall`` keeps on purpose
    (``helm.sh/resource-policy: keep``): the generated Secrets and the
    router's Namespace, as the chart renders them for ``values``."""
    every = render_objects(values, (*selected(values), "secrets"), helm=_helm_binary())
    return [o for o in every
            if (o["metadata"].get("annotations") or {}).get(KEEP_ANNOTATION) == "keep"]


def _slice_cleanup(cluster: str, kind: str, sysfs_root: str) -> str:
    """``driver <kind> --uninstall`` on the host: the driver's slices of the
    node outlive its pods on purpose."""
    proc = subprocess.run(
        [sys.executable, "-m", "toposerve.driver_cmd", "driver", kind,
         "--uninstall", "--node-name", NODE_NAME,
         "--kubeconfig", str(kubeconfig_path(cluster)), "--sysfs-root", sysfs_root],
        capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise InstallError(f"the {kind.upper()} driver's slice cleanup failed: "
                           f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout.strip()


def uninstall(cluster: str, values: InstallValues, progress: Progress = _stderr,
              timeout_s: float = 120, release: str = RELEASE) -> None:
    """``helm uninstall`` and a wait for the release's pods to go, then on
    the host: each driver's slice cleanup (``driver gpu --uninstall``,
    ``driver net --uninstall``: their slices outlive their pods on purpose)
    and what the NIC driver's init container changed in the node's CNI
    config undone (``net-install-cni --uninstall``). Kept on purpose
    (``helm.sh/resource-policy: keep``): the generated Secrets and the
    router's namespace, so a reinstall keeps the Redis password and the
    extender's key (docs/install.md)."""
    helm(cluster, ["uninstall", release, "--namespace", release_namespace(values), "--wait",
                   "--timeout", f"{timeout_s:.0f}s"], timeout_s + 30)
    rest = JsonApi(api_client(cluster))
    namespaces = sorted({system_namespace(values), router_namespace(values)})

    def pods_left() -> list[str]:
        left = []
        for ns in namespaces:
            try:
                items = rest.request("GET", f"/api/v1/namespaces/{ns}/pods",
                                     [("labelSelector", "app.kubernetes.io/part-of=toposerve")]
                                     ).get("items") or []
            except ApiError:
                continue
            left += [f"{ns}/{p['metadata']['name']}" for p in items]
        return left

    deadline = time.monotonic() + timeout_s
    while (left := pods_left()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        raise InstallError(f"pods still there after {timeout_s:.0f}s: {', '.join(left)}")
    if values.gpu_driver.enabled:
        progress(_slice_cleanup(cluster, "gpu", values.gpu_driver.sysfs_root))
    net = values.net_driver
    if net.enabled:
        progress(_slice_cleanup(cluster, "net", net.sysfs_root))
    if net.enabled and net.cni.install:
        try:
            changed = uninstall_cni(cni_data_dir(Path(net.kubelet_dir)) / CNI_RECORD)
        except (CniInstallError, OSError) as err:
            raise InstallError(f"undoing the NIC driver's CNI install failed: {err}") from None
        progress(f"toposerve-nic uninstalled: {', '.join(changed) or 'nothing to undo'}")
    kept = [" ".join((o["kind"], "/".join(filter(None, (o["metadata"].get("namespace"),
                                                        o["metadata"]["name"])))))
            for o in kept_objects(values)]
    progress(f"uninstalled; kept on purpose: {', '.join(kept) or 'nothing'}")


def install_status(api: Any, namespaces: Sequence[str] = (DEFAULT_NAMESPACE, "toposerve-router")
                   ) -> dict[str, Any]:
    """The installed components in ``namespaces`` (the drivers' and the
    router's), their pods and phases, and the router's URL (its pods on the
    real node's host network, 127.0.0.1) if it runs."""
    rest = JsonApi(api)
    components: list[dict[str, Any]] = []
    out: dict[str, Any] = {"namespaces": list(namespaces), "components": components}
    for ns in namespaces:
        try:
            pods = rest.request("GET", f"/api/v1/namespaces/{ns}/pods",
                                timeout=5).get("items") or []
            workloads = [(kind, w) for kind in WORKLOADS for w in rest.request(
                "GET", f"/apis/apps/v1/namespaces/{ns}/{kind.lower()}s",
                timeout=5).get("items") or []]
        except ApiError as err:
            if err.status == 404:
                continue
            raise
        for kind, w in workloads:
            sel = ((w.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            ok, count = _available({**w, "kind": kind})
            mine = [p for p in pods if sel and all(
                (p["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())]
            components.append({
                "name": w["metadata"]["name"], "kind": kind, "namespace": ns,
                "component": (w["metadata"].get("labels") or {}).get(COMPONENT_LABEL),
                "available": ok, "ready": count,
                "pods": [{"name": p["metadata"]["name"],
                          "node": (p.get("spec") or {}).get("nodeName"),
                          "phase": (p.get("status") or {}).get("phase")} for p in mine]})
        if any(c["component"] == "router" and c["namespace"] == ns for c in components):
            port = _router_port(rest, ns)
            if port is not None:
                out["routerURL"] = f"http://127.0.0.1:{port}"
    return out


def _router_port(rest: JsonApi, namespace: str) -> int | None:
    """A serving replica's port on the host network (a hot-standby pair's
    leader; active-active, any running one); else the Service's."""
    pods = rest.request("GET", f"/api/v1/namespaces/{namespace}/pods", [(
        "labelSelector", f"{COMPONENT_LABEL}=router")]).get("items") or []
    serving = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")
               and (p["metadata"].get("labels") or {}).get(ROLE_LABEL) in (None, "leader")]
    # the leader first: a pair's standby is unlabelled until it has a role
    serving.sort(key=lambda p: (p["metadata"].get("labels") or {}).get(ROLE_LABEL) != "leader")
    for p in serving:
        if (p.get("spec") or {}).get("hostNetwork"):
            return int(p["spec"]["containers"][0]["ports"][0]["containerPort"])
    for s in rest.request("GET", f"/api/v1/namespaces/{namespace}/services").get("items") or []:
        if (s["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == "router":
            return int(s["spec"]["ports"][0]["port"])
    return None
