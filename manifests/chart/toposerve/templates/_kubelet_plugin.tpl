{{- /*
A DRA driver's exec liveness probe script: the framework's own probe
(GetInfo, then an empty NodePrepareResources) on the registration socket its
pod UID names; sys.exit(message) fails the probe and says why. Called with
the driver's name; the same string as render.py's liveness_script(driver).
*/ -}}
{{- define "toposerve.livenessScript" -}}
import os, sys; from pathlib import Path; from toposerve.dra_driver.kubeletplugin.liveness import probe; from toposerve.dra_driver.kubeletplugin.sockets import PluginPaths; p = PluginPaths('{{ . }}', registry_dir=Path(sys.argv[1]), pod_uid=os.environ['POD_UID']); sys.exit(probe(p.registration_socket, p.driver))
{{- end -}}

{{- /*
One DRA driver as a kubelet plugin: service account, RBAC, DaemonSet.
Called with a dict of the per-driver pieces:
  root          the root context ($)
  component     its component label (gpu-driver)
  driver        its DRA driver name (gpu.toposerve.io)
  d             its values section (.Values.gpuDriver)
  subcommand    `toposerve driver <subcommand>`
  extraFlags    more flags, after the common ones
  extraMounts   more volumeMounts of the driver container
  extraVolumes  more pod volumes
  capabilities  (optional) added to an otherwise empty set
  hostNetwork   the pod on the node's network
  initContainers (optional) the pod's initContainers, rendered YAML
*/ -}}
{{- define "toposerve.kubeletPlugin" -}}
{{- $ := .root -}}
{{- $d := .d -}}
{{- $name := include "toposerve.name" (dict "root" $ "suffix" .component) -}}
{{- $ns := include "toposerve.systemNamespace" $ -}}
{{- $labels := include "toposerve.labels" (dict "root" $ "component" .component) -}}
{{- $dataDir := printf "%s/plugins/%s" $d.kubeletDir .driver -}}
{{- $registryDir := printf "%s/plugins_registry" $d.kubeletDir -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name | quote }}
  namespace: {{ $ns | quote }}
  labels:
    {{- $labels | nindent 4 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $name | quote }}
  labels:
    {{- $labels | nindent 4 }}
rules:
# its node's slices (the admission policy keeps its writes to its own node);
# get: the publisher reads back a slice that already exists when it creates one
- apiGroups: [resource.k8s.io]
  resources: [resourceslices]
  verbs: [get, list, watch, create, update, delete]
# the claims it prepares, read before preparing; with binding conditions,
# watched (claims cannot be selected by node) for those waiting on its devices
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims]
  verbs: {{ ternary "[get, list, watch]" "[get]" ($d.bindingConditions | default false) }}
# status.devices of claims allocated on its own node, for its own driver name only
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims/status]
  verbs: [update, patch]
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims/driver]
  resourceNames: [{{ .driver | quote }}]
  verbs: ["associated-node:update", "associated-node:patch"]
# its node owns the slices (the owner reference carries the node's UID)
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
# a Warning on a claim it gives up on (and, the GPU driver, on the Node
# when it withholds GPUs that NVIDIA's plugins advertise)
- apiGroups: [""]
  resources: [events]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name | quote }}
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $name | quote }}
subjects:
- kind: ServiceAccount
  name: {{ $name | quote }}
  namespace: {{ $ns | quote }}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ $name | quote }}
  namespace: {{ $ns | quote }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "toposerve.selector" (dict "root" $ "component" .component) | nindent 6 }}
  updateStrategy:
    type: RollingUpdate
    {{- if and $d.httpPort .hostNetwork }}
    # a fixed port on the host network: the old pod must go before the new one binds it
    rollingUpdate: {maxSurge: 0, maxUnavailable: 1}
    {{- else }}
    # the new pod starts before the old one stops: their sockets carry the
    # pod UID and a file lock serializes their prepare calls
    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}
    {{- end }}
  template:
    metadata:
      labels:
        {{- $labels | nindent 8 }}
    spec:
      {{- with $.Values.imagePullSecrets }}
      imagePullSecrets: {{ toJson . }}
      {{- end }}
      serviceAccountName: {{ $name | quote }}
      priorityClassName: {{ $d.priorityClassName | quote }}
      {{- if .hostNetwork }}
      {{- include "toposerve.hostNetwork" $ | nindent 6 }}
      {{- end }}
      nodeSelector: {{ $d.nodeSelector | default dict | toJson }}
      tolerations: {{ $d.tolerations | default list | toJson }}
      # SIGTERM: the driver removes its sockets and finishes the call in flight
      terminationGracePeriodSeconds: 30
      {{- with .initContainers }}
      initContainers:
      {{- . | nindent 6 }}
      {{- end }}
      containers:
      - name: driver
        image: {{ include "toposerve.image" $ | quote }}
        imagePullPolicy: {{ $.Values.image.pullPolicy | quote }}
        command:
        - toposerve
        - --log-level={{ $.Values.logLevel }}
        - driver
        - {{ .subcommand }}
        - --node-name=$(NODE_NAME)
        - --pod-uid=$(POD_UID)
        {{- if $.Values.apiServer }}
        - --kubeconfig={{ include "toposerve.kubeconfigFile" $ }}
        {{- end }}
        - --registry-dir={{ $registryDir }}
        - --plugin-dir={{ $dataDir }}
        - --cdi-root={{ $d.cdiRoot }}
        - --sysfs-root={{ $d.sysfsRoot }}
        - --dev-root={{ $d.devRoot }}
        {{- /* metrics for a scraper on the pod network; on the node's, its loopback only */}}
        - --http-address={{ ternary "127.0.0.1" "0.0.0.0" (.hostNetwork | default false) }}:{{ $d.httpPort | default 0 }}
        {{- if $d.bindingConditions }}
        - --binding-conditions
        {{- end }}
        {{- range .extraFlags }}
        - {{ . | quote }}
        {{- end }}
        {{- range $d.extraArgs }}
        - {{ . | quote }}
        {{- end }}
        env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        - name: POD_UID
          valueFrom: {fieldRef: {fieldPath: metadata.uid}}
        {{- include "toposerve.apiEnv" $ | nindent 8 }}
        {{- if $d.httpPort }}
        ports:
        - {name: metrics, containerPort: {{ $d.httpPort }}, protocol: TCP}
        {{- end }}
        livenessProbe:
          # GetInfo and an empty prepare on this pod's own sockets (named by
          # its UID): no port, so two overlapping pods never answer for each other
          exec:
            command:
            - python3
            - -c
            - {{ include "toposerve.livenessScript" .driver | quote }}
            - {{ $registryDir | quote }}
          initialDelaySeconds: 10
          periodSeconds: 20
          timeoutSeconds: 15
          failureThreshold: 3
        resources: {{ $d.resources | default dict | toJson }}
        # not in /dev, which may be the host's, read-only
        terminationMessagePath: /tmp/termination-log
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities:
            drop: [ALL]
            {{- with .capabilities }}
            add: {{ toJson . }}
            {{- else }}
          # a driver with no capability to add (the GPU driver's NVML, sockets and
          # files) needs nothing the runtime's default syscall filter refuses
          seccompProfile: {type: RuntimeDefault}
            {{- end }}
        volumeMounts:
        {{- if $.Values.apiServer }}
        - {name: kubeconfig, mountPath: {{ include "toposerve.kubeconfigDir" $ | quote }}, readOnly: true}
        {{- end }}
        - {name: plugins-registry, mountPath: {{ $registryDir | quote }}}
        - {name: plugin-data, mountPath: {{ $dataDir | quote }}}
        - {name: cdi, mountPath: {{ $d.cdiRoot | quote }}}
        - {name: sysfs, mountPath: {{ $d.sysfsRoot | quote }}, readOnly: true}
        - {name: dev, mountPath: {{ $d.devRoot | quote }}, readOnly: true}
        - {name: tmp, mountPath: /tmp}
        {{- range .extraMounts }}
        - {{ toJson . }}
        {{- end }}
      volumes:
      {{- if $.Values.apiServer }}
      - name: kubeconfig
        configMap: {name: {{ include "toposerve.name" (dict "root" $ "suffix" "kubeconfig") | quote }}}
      {{- end }}
      - name: plugins-registry
        hostPath: {path: {{ $registryDir | quote }}, type: Directory}
      - name: plugin-data
        hostPath: {path: {{ $dataDir | quote }}, type: DirectoryOrCreate}
      - name: cdi
        hostPath: {path: {{ $d.cdiRoot | quote }}, type: DirectoryOrCreate}
      - name: sysfs
        hostPath: {path: {{ $d.sysfsRoot | quote }}, type: Directory}
      - name: dev
        hostPath: {path: {{ $d.devRoot | quote }}, type: Directory}
      - name: tmp
        emptyDir: {medium: Memory, sizeLimit: 16Mi}
      {{- range .extraVolumes }}
      - {{ toJson . }}
      {{- end }}
{{- end -}}
