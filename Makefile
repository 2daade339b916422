# toposerve developer entry points. Everything installs what it needs:
# a venv in .venv and the cluster tools in ~/.cache/toposerve (by version).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The editable install is a tree of links (editable_mode=strict, so mypy,
# import-linter and editors see plain files under one name, `toposerve`): a
# new module needs a reinstall, so the stamp hashes the file list too.
PRODUCT_DIRS := toposerve_cli topology kubeapi wire serving dra_driver scheduler_ext router simulator manifests localcluster
STAMP := $(VENV)/.installed-$(shell { cat pyproject.toml; git ls-files -co --exclude-standard -- $(PRODUCT_DIRS) 2>/dev/null; } | sha256sum | cut -c1-12)
PYTEST := $(PY) -m pytest

.PHONY: setup venv tools node-tools nic-cni sysdeps peers engines lint test demo bench scale clean protos

setup: venv tools node-tools nic-cni sysdeps

sysdeps:
	bash hack/install-system-deps.sh

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "toposerve needs Python >= 3.11"'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' --config-settings editable_mode=strict  # dev pulls every extra
	@rm -f $(VENV)/.installed-*; touch $@

tools:
	bash hack/build-cluster-tools.sh

# kubelet, containerd and our pause binary for the real node (kubelet is built
# from the cluster tools' wrapper module, so after them)
node-tools: tools
	bash hack/build-node-tools.sh

# the engine tier's real vLLM (its CPU build, in a venv of its own so its pins
# never touch ours) and the tiny model it serves, cached in ~/.cache/toposerve
# by their pins and by the code that makes them (harness/engines.py)
engines: venv
	$(PY) -m harness.engines

# the NIC hand-off's CNI plugin toposerve-nic: a static Go binary (stdlib only),
# cached under a hash of its source (localcluster/realnode/forwarder.py)
nic-cni: venv
	$(PY) -m toposerve.localcluster.realnode.forwarder

# the install's images as OCI archives in ~/.cache/toposerve/images, built with
# buildah, no registry (docs/image.md): toposerve, kube-scheduler, redis
.PHONY: image
image: venv tools nic-cni
	bash hack/build-image.sh "$$($(MAKE) -s --no-print-directory nic-cni | tail -n1)"

# gRPC stubs for the kubelet protos (committed; tests/dra/test_protos.py checks they are current)
protos: venv
	$(PY) -m toposerve.dra_driver.protos.generate

# ruff, mypy strict, and the architecture's import contracts (pyproject's
# [tool.importlinter]: the floors of docs/design.md)
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p toposerve -p harness -p bench -p tests
	$(VENV)/bin/mypy hack
	$(VENV)/bin/lint-imports

# the tests that need no cluster and no subprocess: well under a minute
.PHONY: unit
unit: venv
	$(PYTEST) -m unit tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# pytest exits 5 when it collects nothing: that must fail, not pass.
# engines: the engine tier's vLLM and model (tests/engine; cached, so warm runs build nothing)
test: setup engines lint
	$(PYTEST) tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

demo: setup image
	bash hack/demo.sh

# the peer routers live in their own venv so their pins never touch ours;
# the stamp holds the pins installed, so a changed pin installs again
PEERS := .venv-peers
PEER_PINS := vllm-router==0.1.17 sglang-router==0.3.2 smg==1.13.0
peers:
	@test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	@grep -qxF '$(PEER_PINS)' $(PEERS)/.installed 2>/dev/null || { \
		$(PEERS)/bin/pip install --quiet $(PEER_PINS) && echo '$(PEER_PINS)' > $(PEERS)/.installed; }

bench: setup peers engines
	$(PY) -m pip install --quiet -e '.[dev,bench]' --config-settings editable_mode=strict
	$(PY) -m bench.http_stack
	$(PY) -m bench.router_cpu
	$(PY) -m bench.router_overhead
	$(PY) -m bench.router_overhead --new-connections --fleets 4 --concurrency 1 16 64 128
	$(PY) -m bench.router_overhead --gateway
	$(PY) -m bench.router_overhead --cores 1 2
	$(PY) -m bench.router_overhead --sharing
	$(PY) -m bench.share_cost
	$(PY) -m bench.router_bench --replicas 1 2 4 --workloads agentic mooncake --no-overheads \
		--name router_bench_replicas
	$(PY) -m bench.router_bench --engine vllm --seeds 3
	$(PY) -m bench.router_bench --ablation --repeats 3
	$(PY) -m bench.router_bench --workloads kv-pressure uneven --repeats 3 --no-overheads \
		--name router_bench_pressure --routers round-robin toposerve \
		"vllm-router cache_aware" "sglang-router cache_aware" "smg cache_aware"
	$(PY) -m bench.load_sweep
	$(PY) -m bench.pd_bench --repeats 3
	$(PY) -m bench.overload_bench
	$(PY) -m bench.abuse_bench
	$(PY) -m bench.dra_prepare
	$(PY) -m bench.realnode_prepare
	$(PY) -m bench.net_handoff
	$(PY) -m bench.net_handoff_realnode
	$(PY) -m bench.extender_bench
	$(PY) -m bench.extender_gil
	$(PY) -m bench.extender_churn
	$(PY) -m bench.dra_sched

scale: setup
	$(PY) -m bench.cluster_up --nodes 100 1000
	$(PY) -m bench.dra_publish --nodes 1000
	$(PY) -m bench.extender_bench --racks 270 --hgx 140 --ep-groups 20 --plain 40 --cm-qps 1000 --nodes --timeout 900 --name extender_scale
	$(VENV)/bin/toposerve scale run -f $$($(VENV)/bin/toposerve scale list --biggest-fitting) --out bench/results/scale
	$(PYTEST) -m scale tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) $(PEERS) .mypy_cache .ruff_cache .pytest_cache .hypothesis
