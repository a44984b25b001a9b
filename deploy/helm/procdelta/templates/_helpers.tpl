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
A counter's rate per pod, by cluster, node, namespace and pod, given (dict "c" <cluster
label> "field" <the field>): pods procdelta named only.
*/}}
{{- define "procdelta.podRate" -}}
sum by ({{ .c }}, node, namespace, pod) (rate(procdelta_{{ .field }}_total{pod!=""}[5m]))
{{- end }}

{{/*
Why each pod waited, each cause (`cause`) a share of the time it had work
(docs/findings.md#why-a-pod-waits-three-causes), given the cluster label, with the basis
it was measured on (`basis`). On the kernel's basis where the pod has it (`kernel`): wall
time, over the time its tasks waited behind others' or throttled (CPU pressure `full`)
plus its CPU, at most the wall time (exact for one thread; for several their CPU counts
each, so a share over it is never more than the truth). Else on the interval's
(`interval`): its run delay's parts over its runnable thread-time in the passes split so
(`run_delay_runnable_nanos`: a series only where a pass was, so that a node with PSI
decodes nothing for this side). One basis a pod and cause, the kernel's first. No series
for an idle pod (0/0).
*/}}
{{- define "procdelta.causeShares" -}}
{{- $c := . -}}
label_replace(
  (
      {{- range $i, $cause := list (list "neighbours" "cpu_stalled_neighbours_nanos") (list "throttled" "cpu_stalled_throttled_nanos") (list "own_threads" "cpu_waiting_own_threads_nanos") }}
      {{ if $i }}or {{ end }}label_replace({{ include "procdelta.podRate" (dict "c" $c "field" (index $cause 1)) }}, "cause", "{{ index $cause 0 }}", "", "")
      {{- end }}
  )
  / ignoring (cause) group_left ()
    (clamp_max({{ include "procdelta.podRate" (dict "c" $c "field" "cpu_pressure_stalled_nanos") }} + node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m, 1e9) > 0),
  "basis", "kernel", "", ""
)
or on ({{ $c }}, node, namespace, pod, cause)
label_replace(
  (
      {{- range $i, $cause := list "neighbours" "throttled" "own_threads" }}
      {{ if $i }}or {{ end }}label_replace({{ include "procdelta.podRate" (dict "c" $c "field" (printf "run_delay_%s_nanos" $cause)) }}, "cause", "{{ $cause }}", "", "")
      {{- end }}
  )
  / ignoring (cause) group_left ()
    ({{ include "procdelta.podRate" (dict "c" $c "field" "run_delay_runnable_nanos") }} > 0),
  "basis", "interval", "", ""
)
{{- end }}

{{/*
The pods' findings (docs/findings.md), given (dict "c" <cluster label> "alerts" <the
alerts' values>), each with its `finding` label and the share it is about as its value:
starved (its tasks waited behind other groups' more than a share of the time it had
work: its own limit and its own threads never count there), own_threads (behind its own;
only while its alert is on), both while its cgroup uses some CPU (a pod of short
processes counts); throttled (its own CPU quotas explain more than a share of that time,
which a sidecar's periods cannot dilute, or more than a share of its CFS periods were
throttled, kube-prometheus' CPUThrottlingHigh; the first where both hold). Each cause's
share is compared before anything is joined, so that the joins see only the pods with
a finding; the pods' CPU is selected once where the two floors are the same.
*/}}
{{- define "procdelta.findings" -}}
{{- $c := .c -}}
{{- $starved := .alerts.podCPUStarved -}}
{{- $throttled := .alerts.podCPUThrottled -}}
{{- $own := .alerts.podCPUOwnThreads -}}
{{- $busy := list (list "neighbours" $starved.neighboursShare $starved.minCores) -}}
{{- $oneFloor := true -}}
{{- if and $own $own.enabled }}
{{- $busy = append $busy (list "own_threads" $own.ownThreadsShare $own.minCores) }}
{{- $oneFloor = eq (toString $starved.minCores) (toString $own.minCores) }}
{{- end -}}
label_replace(
  label_replace(
    label_replace(
      {{- if $oneFloor }}
        (
          {{- range $i, $b := $busy }}
          {{- if $i }}
          or
          {{- end }}
            node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{cause="{{ index $b 0 }}"} > {{ index $b 1 }}
          {{- end }}
        )
        and on ({{ $c }}, node, namespace, pod)
          node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m > {{ $starved.minCores }} * 1e9
      {{- else }}
      {{- range $i, $b := $busy }}
        {{ if $i }}or
        {{ end }}(
            node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{cause="{{ index $b 0 }}"} > {{ index $b 1 }}
          and on ({{ $c }}, node, namespace, pod)
            node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m > {{ index $b 2 }} * 1e9
        )
      {{- end }}
      {{- end }}
      or
        label_replace(
            node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{cause="throttled"} > {{ $throttled.waitShare }}
          or on ({{ $c }}, node, namespace, pod)
            label_replace(
              node_namespace_pod:procdelta_cpu_throttled_periods:ratio_rate5m > {{ $throttled.throttledShare }},
              "cause", "throttled", "", ""
            ),
          "basis", "", "", ""
        ),
      "finding", "$1", "cause", "(.+)"
    ),
    "finding", "starved", "finding", "neighbours"
  ),
  "cause", "", "", ""
)
{{- end }}

{{/*
The starved pods (the `starved` finding) the node's page is for, given (dict "c" <cluster
label> "entitledOnly" <bool>): on the kernel's basis only (the interval's averages cannot
tell a pod's own threads from its neighbours on a cpuset: their verdicts stay context),
and, with entitledOnly, within their entitlement: not BestEffort, and using no more CPU
than they request (kube-state-metrics' requests, summed over the pod's containers, where
it has them; where it has none, the QoS class alone). CFS shares a contended CPU by the
pods' requests: a pod beyond its own is not owed more, and its wait is its owners' to
fix. Only the starved pods are joined.
*/}}
{{- define "procdelta.pagedPods" -}}
{{- $c := .c -}}
{{- if .entitledOnly -}}
  node_namespace_pod:procdelta_cpu_finding:ratio_rate5m{finding="starved", basis="kernel"}
unless on ({{ $c }}, node, namespace, pod)
  procdelta_cgroup_cpu_nanos_total{pod!="", qos="besteffort"}
unless on ({{ $c }}, node, namespace, pod)
  (
      node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m
    and on ({{ $c }}, node, namespace, pod)
      node_namespace_pod:procdelta_cpu_finding:ratio_rate5m{finding="starved", basis="kernel"}
  )
  > on ({{ $c }}, namespace, pod) group_left ()
    {{ .share }} * 1e9 * {{ include "procdelta.podEntitlement" $c | indent 4 | trim }}
{{- else -}}
node_namespace_pod:procdelta_cpu_finding:ratio_rate5m{finding="starved", basis="kernel"}
{{- end }}
{{- end }}

{{/*
A pod's CPU entitlement in cores, by (cluster, namespace, pod), as the kubelet sums a
running pod's request: its app containers', its restartable init containers' (native
sidecars, kube_pod_init_container_info's restart_policy "Always"), and its pod overhead
(the RuntimeClass's); a BestEffort pod (procdelta's qos) none. Only pods
kube-state-metrics (or the QoS class) tells of: where it is down, none.
*/}}
{{- define "procdelta.podEntitlement" -}}
sum by ({{ . }}, namespace, pod) (
    label_replace(max by ({{ . }}, namespace, pod, container) (kube_pod_container_resource_requests{resource="cpu"}), "part", "app", "", "")
  or
    label_replace(
        max by ({{ . }}, namespace, pod, container) (kube_pod_init_container_resource_requests{resource="cpu"})
      and on ({{ . }}, namespace, pod, container) kube_pod_init_container_info{restart_policy="Always"},
      "part", "sidecar", "", ""
    )
  or
    label_replace(max by ({{ . }}, namespace, pod) (kube_pod_overhead_cpu_cores), "part", "overhead", "", "")
  or
    label_replace(group by ({{ . }}, namespace, pod) (procdelta_cgroup_cpu_nanos_total{pod!="", qos="besteffort"}) * 0, "part", "besteffort", "", "")
)
{{- end }}

{{/*
The pods with one finding (starved, throttled, own_threads).
*/}}
{{- define "procdelta.finding" -}}
node_namespace_pod:procdelta_cpu_finding:ratio_rate5m{finding="{{ . }}"}
{{- end }}

{{/*
A pod finding (given as "expr") with its pod's workload labels (`workload`,
`workload_type`) added from the map procdelta joins on. A pod missing from the map (its
group failed, or has not run since the pod came) keeps its finding, without them. The
findings are few: selecting them twice costs little.
*/}}
{{- define "procdelta.withWorkload" -}}
{{ .expr }}
* on ({{ .c }}, namespace, pod) group_left (workload, workload_type)
  namespace_workload_pod:procdelta_pod_owner:relabel
or on ({{ .c }}, namespace, pod)
{{ .expr }}
{{- end }}

{{/*
The pods procdelta saw per workload, given the cluster label.
*/}}
{{- define "procdelta.workloadPods" -}}
count by ({{ . }}, namespace, workload, workload_type) (namespace_workload_pod:procdelta_pod_owner:relabel)
{{- end }}

{{/*
The pods procdelta saw per workload that are judged on the kernel's basis: on a node with
cgroup CPU pressure (its pods' `cpu_pressure_stalled_nanos` exported), given the cluster
label. A pod on a node without it is judged on the interval's averages, context only: it
is in no share of starved pods, above the line or below it.
*/}}
{{- define "procdelta.workloadPodsKernel" -}}
count by ({{ . }}, namespace, workload, workload_type) (
    namespace_workload_pod:procdelta_pod_owner:relabel
  and on ({{ . }}, namespace, pod)
    (
        node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m
      and on ({{ . }}, node) group by ({{ . }}, node) (procdelta_cpu_pressure_stalled_nanos_total{pod!=""})
    )
)
{{- end }}

{{/*
The pods procdelta saw over the rules' window: those whose cgroup it read. A pod procdelta could not name (its `uid` alone, empty `namespace` and `pod`) is
none: the base layer selects `pod!=""`.
*/}}
{{- define "procdelta.seenPods" -}}
group by ({{ . }}, namespace, pod) (node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m)
{{- end }}

{{/*
procdelta's own pod -> workload map, from kube-state-metrics' owner series, for where
kubernetes-mixin's namespace_workload_pod:kube_pod_owner:relabel does not have the pod
(docs/findings.md, "The pod -> workload map"): only pods' controllers count
(owner_is_controller="true"), duplicate owner series (two kube-state-metrics replicas)
collapse into one. In order: the pods of a ReplicaSet or a Job with a controller (a
Deployment, a CronJob, an Argo Rollout) are that controller's, the kind as workload_type
("deployment" for a Deployment); any other pod with a controller but a Node is its
controller's: a ReplicaSet, a Job (without a controller of their own), a StatefulSet, a
DaemonSet, lower-cased, any other kind as it is; a static pod (its mirror pod's
controller is the Node) is its own; a pod without a controller (empty owner labels, or
`<none>` before kube-state-metrics v2) is its own. Each kind is selected once. Given the
cluster label. Read inline by the one map the rules record, never recorded itself.
*/}}
{{- define "procdelta.ownerMap" -}}
max by ({{ . }}, namespace, workload, workload_type, pod) (
  label_replace(
    label_replace(
      label_replace(
          (
              label_replace(
                kube_pod_owner{owner_kind="ReplicaSet", owner_is_controller="true"},
                "replicaset", "$1", "owner_name", "(.+)"
              )
            * on ({{ . }}, namespace, replicaset) group_left (owner_kind, owner_name)
              topk by ({{ . }}, namespace, replicaset) (1,
                max by ({{ . }}, namespace, replicaset, owner_kind, owner_name) (
                  kube_replicaset_owner{owner_is_controller="true"}
                )
              )
          )
        or
          (
              label_replace(
                kube_pod_owner{owner_kind="Job", owner_is_controller="true"},
                "job_name", "$1", "owner_name", "(.+)"
              )
            * on ({{ . }}, namespace, job_name) group_left (owner_kind, owner_name)
              topk by ({{ . }}, namespace, job_name) (1,
                max by ({{ . }}, namespace, job_name, owner_kind, owner_name) (
                  kube_job_owner{owner_is_controller="true"}
                )
              )
          ),
        "workload", "$1", "owner_name", "(.+)"
      ),
      "workload_type", "$1", "owner_kind", "(.+)"
    ),
    "workload_type", "deployment", "workload_type", "Deployment"
  )
)
or on ({{ . }}, namespace, pod)
max by ({{ . }}, namespace, workload, workload_type, pod) (
  label_replace(
    label_replace(
      label_replace(
        label_replace(
          label_replace(
            label_replace(
              kube_pod_owner{owner_is_controller="true", owner_kind!="Node"},
              "workload", "$1", "owner_name", "(.+)"
            ),
            "workload_type", "$1", "owner_kind", "(.+)"
          ),
          "workload_type", "replicaset", "owner_kind", "ReplicaSet"
        ),
        "workload_type", "job", "owner_kind", "Job"
      ),
      "workload_type", "statefulset", "owner_kind", "StatefulSet"
    ),
    "workload_type", "daemonset", "owner_kind", "DaemonSet"
  )
)
or on ({{ . }}, namespace, pod)
label_replace(
  label_replace(
    max by ({{ . }}, namespace, pod) (kube_pod_owner{owner_kind="Node", owner_is_controller="true"}),
    "workload", "$1", "pod", "(.+)"
  ),
  "workload_type", "staticpod", "", ""
)
or on ({{ . }}, namespace, pod)
label_replace(
  label_replace(
    max by ({{ . }}, namespace, pod) (kube_pod_owner{owner_is_controller!="true"}),
    "workload", "$1", "pod", "(.+)"
  ),
  "workload_type", "barepod", "", ""
)
{{- end }}
