{{- define "lace.labels" -}}
app.kubernetes.io/part-of: lace
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "lace.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* the store spec every component opens: this cluster, lace's objects in the release namespace */}}
{{- define "lace.store" -}}
k8s://?namespace={{ .Release.Namespace }}
{{- end -}}
