{{- /*
Names, labels and the pieces every pod shares. Every template is called with
the root context (.) unless it says otherwise; those that take a component
are called with (dict "root" $ "component" "router").
*/ -}}

{{- /* An object name: the values' prefix and a suffix ("router"). */ -}}
{{- define "toposerve.name" -}}
{{- printf "%s-%s" .root.Values.namePrefix .suffix -}}
{{- end -}}

{{- /* Where the drivers, the extender and the scheduler run: the values', else the release's namespace. */ -}}
{{- define "toposerve.systemNamespace" -}}
{{- .Values.namespace | default .Release.Namespace -}}
{{- end -}}

{{- /* Where the router and its Redis run: a namespace of their own (docs/security.md). */ -}}
{{- define "toposerve.routerNamespace" -}}
{{- .Values.router.namespace | default .Release.Namespace -}}
{{- end -}}

{{- define "toposerve.selector" -}}
app.kubernetes.io/component: {{ .component | quote }}
app.kubernetes.io/instance: {{ .root.Values.namePrefix | quote }}
app.kubernetes.io/name: toposerve
{{- end -}}

{{- define "toposerve.labels" -}}
{{ include "toposerve.selector" . }}
app.kubernetes.io/managed-by: {{ .root.Release.Service | quote }}
app.kubernetes.io/part-of: toposerve
app.kubernetes.io/version: {{ include "toposerve.tag" .root | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | quote }}
{{- end -}}

{{- /* The toposerve image's tag: the values', else the chart's appVersion. */ -}}
{{- define "toposerve.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "toposerve.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "toposerve.tag" .) -}}
{{- end -}}

{{- /* Where pods read the rendered kubeconfig and their service-account token. */ -}}
{{- define "toposerve.kubeconfigDir" -}}/etc/toposerve/kubeconfig{{- end -}}
{{- define "toposerve.kubeconfigFile" -}}/etc/toposerve/kubeconfig/kubeconfig{{- end -}}

{{- /*
With apiServer given, pods reach the API server there (a kubeconfig of
their own token, and in-cluster clients pointed at it); without it, through
the in-cluster service, as any pod does.
*/ -}}
{{- define "toposerve.apiEnv" -}}
{{- if .Values.apiServer }}
# whatever still reads in-cluster config gets the values' API server
- {name: KUBERNETES_SERVICE_HOST, value: {{ .Values.apiServer.host | quote }}}
- {name: KUBERNETES_SERVICE_PORT, value: {{ .Values.apiServer.port | default 6443 | toString | quote }}}
{{- end }}
{{- end -}}

{{- /* The pod on the node's network: for pods that need the host's
interfaces, or (the local cluster) whose pod network cannot reach the API
server; the node's resolv.conf, no service links. */ -}}
{{- define "toposerve.hostNetwork" -}}
hostNetwork: true
dnsPolicy: Default
enableServiceLinks: false
{{- end -}}

{{- /* "true" when the scheduler calls the extender on the node's loopback:
both on the node's network and no scheduler.extenderURL given. */ -}}
{{- define "toposerve.extenderOnLoopback" -}}
{{- and .Values.extender.hostNetwork .Values.scheduler.hostNetwork (not .Values.scheduler.extenderURL) -}}
{{- end -}}

{{- /* The URL prefix the scheduler calls: the values', the node's loopback,
or the extender's Service. */ -}}
{{- define "toposerve.extenderURL" -}}
{{- if .Values.scheduler.extenderURL -}}
{{- regexReplaceAll "/+$" .Values.scheduler.extenderURL "" -}}
{{- else if eq (include "toposerve.extenderOnLoopback" .) "true" -}}
{{- printf "http://127.0.0.1:%v" .Values.extender.port -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%v" (include "toposerve.name" (dict "root" . "suffix" "extender")) (include "toposerve.systemNamespace" .) .Values.extender.port -}}
{{- end -}}
{{- end -}}

{{- /* A PodDisruptionBudget letting a drain take one of a Deployment's
replicas at a time (the others serve, or lead, meanwhile). dict: name, ns,
labels, selector. */ -}}
{{- define "toposerve.oneAtATime" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name | quote }}
  namespace: {{ .ns | quote }}
  labels:
    {{- .labels | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      {{- .selector | nindent 6 }}
{{- end -}}
