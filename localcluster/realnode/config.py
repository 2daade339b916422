"""The real node's configuration files, as pure functions of its layout
(docs/design.md §9 says which settings this machine needs, and why)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toposerve.localcluster.realnode.paths import (
    KUBELET_HEALTHZ_PORT,
    KUBELET_PORT,
    PAUSE_IMAGE,
    REAL_NODE_TAINT,
    Layout,
)

TomlValue = str | bool | int | list[str] | Mapping[str, Any]


def _scalar(v: str | bool | int | list[str]) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    return json.dumps(v)  # a TOML basic string is a JSON string


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def to_toml(doc: Mapping[str, TomlValue], prefix: str = "") -> str:
    """Tables of scalars, strings and string lists: what containerd's config needs."""
    lines = [f"{_key(k)} = {_scalar(v)}" for k, v in doc.items() if not isinstance(v, Mapping)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in doc.items():
        if isinstance(v, Mapping):
            name = f"{prefix}.{_key(k)}" if prefix else _key(k)
            if any(not isinstance(x, Mapping) for x in v.values()):
                out += f"\n[{name}]\n"
            out += to_toml(v, name)
    return out


def containerd_config(layout: Layout, runc: Path) -> dict[str, TomlValue]:
    """containerd 2.x config ``version = 4``: own root, state and sockets;
    CRI with our CNI, CDI spec dirs, a pinned sandbox image it may never pull."""
    runtime = "io.containerd.cri.v1.runtime"
    return {
        "version": 4,
        "root": str(layout.containerd_root),
        "state": str(layout.containerd_state),
        "imports": [],  # never read a config of the machine's own containerd
        "disabled_plugins": ["io.containerd.snapshotter.v1.btrfs",
                             "io.containerd.snapshotter.v1.zfs",
                             "io.containerd.snapshotter.v1.devmapper",
                             "io.containerd.snapshotter.v1.blockfile",
                             "io.containerd.snapshotter.v1.erofs"],
        "plugins": {
            # a top-level [grpc] table is silently ignored by version 4
            "io.containerd.server.v1.grpc": {"address": str(layout.containerd_socket)},
            "io.containerd.server.v1.ttrpc": {"address": f"{layout.containerd_socket}.ttrpc"},
            "io.containerd.server.v1.debug": {"address": ""},
            "io.containerd.server.v1.metrics": {"address": ""},
            "io.containerd.internal.v1.opt": {"path": str(layout.containerd_root / "opt")},
            "io.containerd.shim.v1.manager": {"socket_dir": str(layout.shim_sockets)},
            runtime: {
                # this VM drops CAP_SYS_RESOURCE: a negative oom_score_adj fails every sandbox
                "restrict_oom_score_adj": True,
                "cdi_spec_dirs": [str(d) for d in layout.cdi_dirs],
                "netns_mounts_under_state_dir": True,
                "enable_unprivileged_ports": False,
                "enable_unprivileged_icmp": False,
                "containerd": {
                    "default_runtime_name": "runc",
                    "runtimes": {"runc": {
                        "runtime_type": "io.containerd.runc.v2",
                        "disable_pause_image_pull": True,
                        "options": {"BinaryName": str(runc), "Root": str(layout.runc_root),
                                    "SystemdCgroup": False},
                    }},
                },
                "cni": {"bin_dirs": [str(layout.cni_bin)], "conf_dir": str(layout.cni_conf),
                        "max_conf_num": 1, "use_internal_loopback": True},
            },
            "io.containerd.cri.v1.images": {
                "snapshotter": "overlayfs",
                "pinned_images": {"sandbox": PAUSE_IMAGE},
                "registry": {"config_path": ""},
            },
            "io.containerd.grpc.v1.cri": {"stream_server_address": "127.0.0.1",
                                          "stream_server_port": "0"},
            "io.containerd.nri.v1.nri": {"disable": False,
                                         "socket_path": str(layout.nri_socket)},
        },
    }


def kubelet_config(layout: Layout, ca_file: Path, resolv_conf: Path) -> dict[str, Any]:
    """KubeletConfiguration for cgroup v1 with cgroupfs, bound to loopback."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": "127.0.0.1",
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        # The API server reaches the kubelet (logs, exec) without a client
        # certificate (kwokctl gives it none); the kubelet listens on loopback only.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "AlwaysAllow"},
        "failCgroupV1": False,  # this machine mounts cgroup v1
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "resolvConf": str(resolv_conf),
        "clusterDomain": "cluster.local",
        "hairpinMode": "none",
        "registerWithTaints": [REAL_NODE_TAINT],
        "maxPods": 32,
        # a shared disk must not evict our pods or collect our images
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def kubeconfig(server: str, ca_file: Path, cert_file: Path, key_file: Path,
               user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "realnode",
        "clusters": [{"name": "local", "cluster": {"server": server,
                                                   "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert_file),
                                          "client-key": str(key_file)}}],
        "contexts": [{"name": "realnode", "context": {"cluster": "local", "user": user}}],
    }


RESOLV_CONF = "nameserver 127.0.0.1\n"  # pods must never look up a name off the machine
