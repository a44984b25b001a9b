{{/* The chart's name: the app.kubernetes.io/name label. */}}
{{- define "procdelta.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The resources' name: the release's name when it contains the chart's name, else
<release>-<name>; 63 characters at most (DNS labels).
*/}}
{{- define "procdelta.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "procdelta.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "procdelta.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{/* Labels every resource carries. */}}
{{- define "procdelta.labels" -}}
helm.sh/chart: {{ include "procdelta.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: metrics
app.kubernetes.io/part-of: {{ include "procdelta.name" . }}
{{ include "procdelta.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "procdelta.selectorLabels" -}}
app.kubernetes.io/name: {{ include "procdelta.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "procdelta.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "procdelta.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* registry/repository:tag@digest, each part only where set. */}}
{{- define "procdelta.image" -}}
{{- $image := printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- with .Values.image.registry }}
{{- $image = printf "%s/%s" . $image }}
{{- end }}
{{- with .Values.image.digest }}
{{- $image = printf "%s@%s" $image . }}
{{- end }}
{{- $image }}
{{- end }}

{{/*
The endpoint of a ServiceMonitor or PodMonitor: one port, the node's name as `node`. The
Operator labels every target with its own pod's `namespace`, `pod` and `container`; they
are dropped, so that the series keep procdelta's (those of the pods it counts) rather than
having them renamed `exported_namespace`, `exported_pod` and `exported_container`.
*/}}
{{- define "procdelta.endpoint" -}}
port: metrics
path: /metrics
{{- with .interval }}
interval: {{ . }}
{{- end }}
{{- with .scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
scheme: {{ .scheme }}
{{- with .tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
  - action: labeldrop
    regex: (namespace|pod|container)
  {{- with .relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The one command that runs `procdelta top` on a pod, in procdelta's pod on that pod's node,
given (dict "root" <the chart's context> "node" <node> "pod" <namespace/name>; without
"pod", the node's processes; "sort": a field to sort by): the alerts
give Prometheus' templates of their labels, NOTES.txt placeholders. It reads procdelta's
/processes where that is served without a web configuration; otherwise top runs its own
passes on the host's /proc, whose paths the container's environment gives every command.
*/}}
{{- define "procdelta.topCommand" -}}
{{- $namespace := include "procdelta.namespace" .root -}}
kubectl -n {{ $namespace }} exec -it "$(kubectl -n {{ $namespace }} get pod -l {{ include "procdelta.selector" .root }} --field-selector spec.nodeName={{ .node }} -o name)" -- procdelta top
{{- with .root.Values }}
{{- if and .processes.enabled (not .procdelta.webConfig.secretName) }} --from http://127.0.0.1:{{ .service.port }}{{ end }}
{{- end }}
{{- with .pod }} --pod {{ . }}{{ end }}
{{- with .sort }} --sort {{ . }}{{ end }}
{{- end }}

{{/* The DaemonSet's pod selector as a `kubectl -l` argument. */}}
{{- define "procdelta.selector" -}}
{{- $labels := list -}}
{{- range $key, $value := include "procdelta.selectorLabels" . | fromYaml -}}
{{- $labels = append $labels (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $labels -}}
{{- end }}

{{/* A share (0.25) as a percentage (25%). */}}
{{- define "procdelta.percent" -}}
{{- round (mulf . 100) 2 }}%
{{- end }}

{{/*
The time a pod had work, over which each cause of its wait is a share
(docs/findings.md#why-a-pod-waits-three-causes), on the kernel's moment-by-moment basis:
the time its tasks waited behind other groups' or throttled (CPU pressure `full`, per CPU,
averaged), plus its CPU time, at most the wall time. Exact for one thread; for several,
their CPU counts each, so a share over it is never more than the truth.
Given the per-pod expression of a rate (dict "rate" <printf format with one %s: the field>).
*/}}
{{- define "procdelta.activeWall" -}}
clamp_max({{ printf .rate "cpu_pressure_stalled_nanos" }} + {{ printf .rate "cgroup_cpu_nanos" }}, 1e9)
{{- end }}

{{/*
A cause's share of a pod's wait, given (dict "stall" <its field on the kernel's basis, wall
time> "delay" <its field on the interval's basis, thread-time>): on the kernel's basis
where the pod has it, over the time it had work (procdelta.activeWall); else its part of the
run delay over its runnable thread-time. No series for an idle pod (0/0).
*/}}
{{- define "procdelta.causeShare" -}}
{{- $rate := "node_namespace_pod:procdelta_%s:rate5m" -}}
  node_namespace_pod:procdelta_{{ .stall }}:rate5m
/
  ({{ include "procdelta.activeWall" (dict "rate" $rate) }} > 0)
or
  node_namespace_pod:procdelta_{{ .delay }}:rate5m
/
  (node_namespace_pod:procdelta_run_delay_nanos:rate5m + node_namespace_pod:procdelta_on_cpu_nanos:rate5m > 0)
{{- end }}

{{/*
The neighbours' part of pods' waits over the time they had work, summed over a set of pods,
given (dict "sum" <printf format with one %s: a per-pod expression summed over the set>):
on the kernel's basis where the set's pods have it, else the interval's (where a set mixes
the two, nodes with and without cgroup CPU pressure, the kernel's pods alone).
*/}}
{{- define "procdelta.neighboursOfSums" -}}
{{- $rate := "node_namespace_pod:procdelta_%s:rate5m" -}}
  {{ printf .sum "node_namespace_pod:procdelta_cpu_stalled_neighbours_nanos:rate5m" }}
/
  ({{ printf .sum (include "procdelta.activeWall" (dict "rate" $rate)) }} > 0)
or
  {{ printf .sum "node_namespace_pod:procdelta_run_delay_neighbours_nanos:rate5m" }}
/
  ({{ printf .sum "node_namespace_pod:procdelta_run_delay_nanos:rate5m" }} + {{ printf .sum "node_namespace_pod:procdelta_on_cpu_nanos:rate5m" }} > 0)
{{- end }}

{{/*
The cores a pod used: its cgroup's CPU (every task, exited ones included), else what its
processes' sums saw.
*/}}
{{- define "procdelta.podCores" -}}
(node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m or node_namespace_pod:procdelta_on_cpu_nanos:rate5m)
{{- end }}

{{/*
The rules' pod conditions, each given (dict "c" <cluster label> "v" <the alert's values>).
A starved pod: the share of the time it had work in which its neighbours held the CPUs (the
causes taken on the node, docs/reference.md §7) above a threshold, while it uses some CPU
(its cgroup's: a pod of short processes counts); its value is that share. Its own limit and
its own threads never count here.
*/}}
{{- define "procdelta.starvedPods" -}}
  node_namespace_pod:procdelta_cpu_wait_neighbours:ratio_rate5m > {{ .v.neighboursShare }}
and
  {{ include "procdelta.podCores" . }} > {{ .v.minCores }} * 1e9
{{- end }}

{{/*
A throttled pod: the share of the time it had work its own CPU quotas explain, or the share
of its CFS periods throttled (kube-prometheus' CPUThrottlingHigh), above a threshold. The
first is not diluted by a sidecar's periods; its value is the first where both hold.
*/}}
{{- define "procdelta.throttledPods" -}}
  node_namespace_pod:procdelta_cpu_wait_throttled:ratio_rate5m > {{ .v.waitShare }}
or
  node_namespace_pod:procdelta_cpu_throttled_periods:ratio_rate5m > {{ .v.throttledShare }}
{{- end }}

{{/*
A per-pod expression (a finding, or pods counted; given as "expr") with its pod's workload
labels (`workload`, `workload_type`) added from the map procdelta joins on. A pod missing
from the map (it was not there at its last evaluation) keeps its finding, without them.
*/}}
{{- define "procdelta.withWorkload" -}}
(
  {{- .expr | nindent 4 }}
)
* on ({{ .c }}, namespace, pod) group_left (workload, workload_type)
  namespace_workload_pod:procdelta_pod_owner:relabel
or on ({{ .c }}, namespace, pod)
(
  {{- .expr | nindent 4 }}
)
{{- end }}

{{/*
A per-pod record of the base layer ("expr"), summed per workload: the pods' sums joined to
the map procdelta joins on, which holds every pod procdelta saw, so no pod is left out.
*/}}
{{- define "procdelta.perWorkload" -}}
sum by ({{ .c }}, namespace, workload, workload_type) (
    sum by ({{ .c }}, namespace, pod) ({{ .expr }})
  * on ({{ .c }}, namespace, pod) group_left (workload, workload_type)
    namespace_workload_pod:procdelta_pod_owner:relabel
)
{{- end }}

{{/*
The pods procdelta saw over the rules' window: the base layer's pods (process or cgroup
counters). A pod procdelta could not name (its `uid` alone, empty `namespace` and `pod`) is
none: the base layer selects `pod!=""`.
*/}}
{{- define "procdelta.seenPods" -}}
group by ({{ . }}, namespace, pod) (
    node_namespace_pod:procdelta_on_cpu_nanos:rate5m
  or
    node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m
)
{{- end }}
