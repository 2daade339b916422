{{- /* The router's values, computed once: names, its Redis URL and the
Secrets it reads. Called with the root context; returns YAML. */ -}}
{{- define "toposerve.router.facts" -}}
{{- $r := .Values.router -}}
{{- $ns := include "toposerve.routerNamespace" . -}}
{{- $redis := include "toposerve.name" (dict "root" . "suffix" "router-redis") -}}
{{- $url := $r.redis.url -}}
{{- if not $url -}}
{{- if $r.hostNetwork -}}
{{- /* Redis on the node's loopback, beside the router */ -}}
{{- $url = printf "redis://127.0.0.1:%v/0" $r.redis.port -}}
{{- else -}}
{{- $url = printf "%s://%s.%s.svc:%v/0" (ternary "rediss" "redis" (not (empty $r.redis.tlsSecret))) $redis $ns $r.redis.port -}}
{{- end -}}
{{- end -}}
name: {{ include "toposerve.name" (dict "root" . "suffix" "router") | quote }}
namespace: {{ $ns | quote }}
redisName: {{ $redis | quote }}
redisUrl: {{ $url | quote }}
{{- if not $r.redis.allowUnauthenticated }}
passwordSecret: {{ $r.redis.passwordSecret | default (include "toposerve.name" (dict "root" . "suffix" "router-redis-auth")) | quote }}
{{- end }}
keysSecret: {{ $r.apiKeys.secretName | default (include "toposerve.name" (dict "root" . "suffix" "router-keys")) | quote }}
picker: {{ eq $r.mode "endpoint-picker" }}
{{- /* every warm replica serves (active-active, the standalone router's
default); a Gateway's endpoint pickers stay a hot-standby pair unless the
config says otherwise: a Lease, and the Service selects the leader by its
pod's label */}}
{{- $haMode := dig "ha" "mode" (ternary "hot-standby" "active-active" (eq $r.mode "endpoint-picker")) ($r.config | default dict) }}
haMode: {{ $haMode }}
leaderOnly: {{ and (gt (int $r.replicas) 1) (eq $haMode "hot-standby") }}
{{- if $r.inferencePool.create }}
poolName: {{ $r.inferencePool.name | default (include "toposerve.name" (dict "root" . "suffix" "pool")) | quote }}
{{- end }}
{{- end -}}

{{- /* Where the router finds the model servers: the config's discovery, or
the InferencePool the install creates (the pool names the endpoints alone).
Called with the root context; returns YAML. */ -}}
{{- define "toposerve.router.discovery" -}}
{{- $f := include "toposerve.router.facts" . | fromYaml -}}
{{- if .Values.router.inferencePool.create -}}
{{- toYaml (dict "inferencePool" (dict "name" $f.poolName "namespace" $f.namespace)) -}}
{{- else -}}
{{- toYaml ((.Values.router.config | default dict).discovery | default dict) -}}
{{- end -}}
{{- end -}}

{{- /*
The router's configuration as a pod gets it: listening on every address at
the values' port (on the host network: on 127.0.0.1, replica i at port + i),
a hot-standby pair on a Lease named like the Deployment, the Responses store
in the install's Redis, keys from their Secret, and (with apiServer) every
client on the mounted kubeconfig; in endpoint-picker mode its gRPC server on
the same address at pickerPort (+ i), and discovery from the pool it
creates, if it does. Called with (dict "root" $ "replica" i).
*/ -}}
{{- define "toposerve.router.config" -}}
{{- $ := .root -}}
{{- $r := $.Values.router -}}
{{- $f := include "toposerve.router.facts" $ | fromYaml -}}
{{- $kubeconfig := ternary (include "toposerve.kubeconfigFile" $) "" (not (empty $.Values.apiServer)) -}}
{{- $doc := deepCopy ($r.config | default dict) -}}
{{- $server := deepCopy (get $doc "server" | default dict) -}}
{{- if $r.hostNetwork -}}
{{- $_ := set $server "host" "127.0.0.1" -}}
{{- $_ := set $server "port" (add $r.port .replica) -}}
{{- else -}}
{{- $_ := set $server "host" "0.0.0.0" -}}
{{- $_ := set $server "port" $r.port -}}
{{- end -}}
{{- $_ := set $doc "server" $server -}}
{{- if $f.picker -}}
{{- /* the gRPC server a gateway dials, where the HTTP probes listen */ -}}
{{- $picker := deepCopy (get $doc "endpointPicker" | default dict) -}}
{{- $_ := set $picker "host" (get $server "host") -}}
{{- $_ := set $picker "port" (ternary (add $r.pickerPort .replica) $r.pickerPort $r.hostNetwork) -}}
{{- $_ := set $doc "endpointPicker" $picker -}}
{{- end -}}
{{- $_ := set $doc "discovery" (include "toposerve.router.discovery" $ | fromYaml) -}}
{{- $discovery := get $doc "discovery" | default dict -}}
{{- range $source := list "kubernetes" "inferencePool" -}}
{{- if and $kubeconfig (get $discovery $source) -}}
{{- $_ := set (get $discovery $source) "kubeconfig" $kubeconfig -}}
{{- end -}}
{{- end -}}
{{- $responses := deepCopy (get $doc "responses" | default dict) -}}
{{- $_ := set $responses "backend" "redis" -}}
{{- $_ := set $responses "redisUrl" $f.redisUrl -}}
{{- if $r.redis.allowUnauthenticated -}}
{{- $_ := set $responses "allowUnauthenticated" true -}}
{{- end -}}
{{- if $f.passwordSecret -}}
{{- $_ := set $responses "redisPasswordFile" "/etc/toposerve/redis-auth/password" -}}
{{- end -}}
{{- if $r.redis.tlsSecret -}}
{{- $_ := set $responses "redisCaFile" "/etc/toposerve/redis-tls/ca.crt" -}}
{{- end -}}
{{- $_ := set $doc "responses" $responses -}}
{{- $ha := deepCopy (get $doc "ha" | default dict) -}}
{{- $lease := deepCopy (get $ha "lease" | default dict) -}}
{{- $_ := set $lease "name" $f.name -}}
{{- $_ := set $lease "namespace" $f.namespace -}}
{{- if $kubeconfig -}}{{- $_ := set $lease "kubeconfig" $kubeconfig -}}{{- end -}}
{{- $_ := set $ha "enabled" (gt (int $r.replicas) 1) -}}
{{- $_ := set $ha "mode" $f.haMode -}}
{{- $_ := set $ha "shutdownDelaySeconds" $r.shutdownDelaySeconds -}}
{{- $_ := set $ha "lease" $lease -}}
{{- $_ := set $doc "ha" $ha -}}
{{- if $r.apiKeys.enabled -}}
{{- $fc := deepCopy (get $doc "flowControl" | default dict) -}}
{{- $tenants := deepCopy (get $fc "tenants" | default dict) -}}
{{- $secret := dict "namespace" $f.namespace "name" $f.keysSecret -}}
{{- if $kubeconfig -}}{{- $_ := set $secret "kubeconfig" $kubeconfig -}}{{- end -}}
{{- $_ := set $tenants "keys" (dict "secret" $secret) -}}
{{- $_ := set $fc "tenants" $tenants -}}
{{- $_ := set $doc "flowControl" $fc -}}
{{- end -}}
{{- toYaml $doc -}}
{{- end -}}
