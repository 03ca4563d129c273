{{- /*
The node Jobs' JobSpecs (templates/node-jobs.yaml puts them in the ConfigMap
gpuheal-node-jobs; templates/admission-node-jobs.yaml admits in the node-jobs namespace only
the containers, images, volumes and ServiceAccounts they name). Each is the text of one
ConfigMap key, comments included.
*/}}
{{- define "gpuheal.nodeJob.gpu-reset" -}}
{{- $img := include "gpuheal.image" (list .Values.nodeJobs.image $ "nodeJobs.image") }}
{{- $reset := .Values.nodeJobs.gpuReset }}
{{- $pods := $reset.operandPods }}
{{- if ne .Values.agent.nvml.mode "off" }}
{{- $pods = append $pods (printf "app.kubernetes.io/instance=%s,app.kubernetes.io/component=agent" .Release.Name) }}
{{- end -}}
# Reset the node's GPUs the way NVIDIA's procedure asks (files/gpu-reset.sh): every GPU,
# or only the one the operator names in GPUHEAL_GPU (a quarantineDevice step's GPU; scope
# all resets every GPU all the same); the `operands` sidecar takes what holds the GPUs off
# the node (the GPU operator's DaemonSets through their nvidia.com/gpu.deploy.<operand>=false
# labels, gpuheal's NVML agent through gpuheal.io/gpu-reset) and puts the labels back when
# the reset ends; the `reset` container checks that nothing holds the GPUs it resets, turns
# persistence mode off, runs `nvidia-smi -r -i <bus id>` per GPU, turns persistence back on
# and lists the GPUs: exit code 0 only when all of it happened. A failed reset fails the
# step, and the ladder climbs (the default policy's next rung reboots).
backoffLimit: 0
activeDeadlineSeconds: {{ int .Values.nodeJobs.activeDeadlineSeconds }}
ttlSecondsAfterFinished: {{ int .Values.nodeJobs.ttlSecondsAfterFinished }}
template:
  metadata:
    labels: {app.kubernetes.io/part-of: gpuheal, gpuheal.io/node-job: gpu-reset}
  spec:
    restartPolicy: Never
    serviceAccountName: {{ include "gpuheal.fullname" . }}-gpu-reset
    automountServiceAccountToken: true
    hostPID: true
    terminationGracePeriodSeconds: 60
    priorityClassName: system-node-critical
    {{- with .Values.nodeJobs.runtimeClassName }}
    runtimeClassName: {{ . }}
    {{- end }}
    {{- with .Values.imagePullSecrets }}
    imagePullSecrets: {{ toYaml . | nindent 6 }}
    {{- end }}
    volumes:
    - name: scripts
      configMap: {name: gpuheal-node-jobs, defaultMode: 0555, items: [{key: gpu-reset.sh, path: gpu-reset.sh}, {key: gpu_operands.py, path: gpu_operands.py}]}
    - name: state
      emptyDir: {medium: Memory, sizeLimit: 1Mi}
    initContainers:
    # A native sidecar: it runs beside the reset and gets SIGTERM once the reset ended.
    - name: operands
      image: {{ include "gpuheal.image" (list .Values.operator.image $ "operator.image") }}
      restartPolicy: Always
      command: [python, /gpuheal/gpu_operands.py, hold]
      env:
      - {name: GPU_OPERANDS, value: {{ join "," $reset.operands | quote }}}
      - {name: GPU_OPERAND_PODS, value: {{ join ";" $pods | quote }}}
      - {name: GPUHEAL_OPERANDS_WAIT_SECONDS, value: {{ int $reset.operandsWaitSeconds | quote }}}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: [ALL]}
        seccompProfile: {type: RuntimeDefault}
      volumeMounts:
      - {name: scripts, mountPath: /gpuheal, readOnly: true}
      - {name: state, mountPath: /run/gpuheal}
    containers:
    - name: reset
      image: {{ $img }}
      securityContext: {privileged: true}
      command: [/bin/bash, /gpuheal/gpu-reset.sh]
      env:
      - {name: NVIDIA_VISIBLE_DEVICES, value: all}
      - {name: GPU_RESET_SCOPE, value: {{ $reset.scope | quote }}}
      - {name: GPUHEAL_OPERANDS_WAIT_SECONDS, value: {{ int $reset.operandsWaitSeconds | quote }}}
      volumeMounts:
      - {name: scripts, mountPath: /gpuheal, readOnly: true}
      - {name: state, mountPath: /run/gpuheal}
{{- end -}}

{{- define "gpuheal.nodeJob.node-reboot" -}}
{{- $img := include "gpuheal.image" (list .Values.nodeJobs.image $ "nodeJobs.image") -}}
# Reboot the node through its init system (nsenter into PID 1), 5 s after the Job ends so
# that it ends Complete; gpuheal then waits for the node's new boot ID.
backoffLimit: 0
activeDeadlineSeconds: {{ int .Values.nodeJobs.activeDeadlineSeconds }}
ttlSecondsAfterFinished: {{ int .Values.nodeJobs.ttlSecondsAfterFinished }}
template:
  metadata:
    labels: {app.kubernetes.io/part-of: gpuheal, gpuheal.io/node-job: node-reboot}
  spec:
    restartPolicy: Never
    hostPID: true
    automountServiceAccountToken: false
    priorityClassName: system-node-critical
    {{- with .Values.imagePullSecrets }}
    imagePullSecrets: {{ toYaml . | nindent 6 }}
    {{- end }}
    containers:
    - name: reboot
      image: {{ $img }}
      securityContext: {privileged: true}
      command: [/bin/sh, -c]
      args:
      - |
        set -eu
        if [ "${GPUHEAL_POWER_CYCLE:-}" = true ]; then
          # A reboot from inside the node is warm: it must not pass for a power cycle.
          echo "gpuheal ${GPUHEAL_INCIDENT}: powerCycle asked, but this Job reboots warm;" \
            "power-cycle ${NODE_NAME} through a hook that drives its BMC (Redfish, IPMI)" >&2
          exit 3
        fi
        echo "gpuheal ${GPUHEAL_INCIDENT}: rebooting ${NODE_NAME}"
        nsenter --target 1 --mount --uts --ipc --net --pid -- \
          systemd-run --on-active=5 --unit=gpuheal-reboot systemctl reboot
{{- end -}}

{{- define "gpuheal.nodeJob.gpu-check" -}}
{{- $dcgm := include "gpuheal.image" (list .Values.nodeJobs.dcgmImage $ "nodeJobs.dcgmImage") -}}
# The check before a node returns: every GPU answers nvidia-smi and passes a DCGM
# diagnostic (`dcgmi diag -r {{ .Values.nodeJobs.dcgmDiagLevel }}`): exit code 0 passes.
backoffLimit: 0
activeDeadlineSeconds: {{ int .Values.nodeJobs.activeDeadlineSeconds }}
ttlSecondsAfterFinished: {{ int .Values.nodeJobs.ttlSecondsAfterFinished }}
template:
  metadata:
    labels: {app.kubernetes.io/part-of: gpuheal, gpuheal.io/node-job: gpu-check}
  spec:
    restartPolicy: Never
    automountServiceAccountToken: false
    {{- with .Values.nodeJobs.runtimeClassName }}
    runtimeClassName: {{ . }}
    {{- end }}
    {{- with .Values.imagePullSecrets }}
    imagePullSecrets: {{ toYaml . | nindent 6 }}
    {{- end }}
    containers:
    - name: check
      image: {{ $dcgm }}
      securityContext: {privileged: true}
      env:
      - {name: NVIDIA_VISIBLE_DEVICES, value: all}
      command: [/bin/bash, -c]
      args:
      - |
        set -euo pipefail
        echo "gpuheal ${GPUHEAL_INCIDENT}: checking the GPUs of ${NODE_NAME}"
        nvidia-smi --query-gpu=index,uuid,ecc.errors.uncorrected.volatile.total,retired_pages.pending --format=csv,noheader
        nv-hostengine >/dev/null 2>&1 || true   # daemonizes; dcgmi talks to it
        sleep 2
        dcgmi diag -r {{ int .Values.nodeJobs.dcgmDiagLevel }}
{{- end -}}
