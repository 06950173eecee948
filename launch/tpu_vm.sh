#!/usr/bin/env bash
# Create a Cloud TPU VM, run the same `launch.train` command on every worker, delete it.
#
#   launch/tpu_vm.sh [--dry-run] create NAME [--zone=Z] [--type=v5litepod-16] [--version=V] [--spot]
#   launch/tpu_vm.sh [--dry-run] setup  NAME [--zone=Z]      # copy this repo, pip install .[tpu]
#   launch/tpu_vm.sh [--dry-run] run    NAME [--zone=Z] -- --config=configs/lm.py:mesh=tpu \
#                                                          --workdir=gs://bucket/runs/lm
#   launch/tpu_vm.sh [--dry-run] delete NAME [--zone=Z]
#
# `run` starts `python -m launch.train --multihost ARGS` on all workers at once (jax.distributed
# auto-detects the slice), so every host runs the identical program, as JAX's multi-controller
# model requires. Use a gs:// workdir: every host must see the same checkpoints. A preempted
# (spot) VM sends SIGTERM; the run checkpoints and exits, and `run` again resumes it.
# --dry-run prints the gcloud commands instead of running them. --project=P is passed through.
set -euo pipefail

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then dry_run=1; shift; fi
action="${1:-}"; name="${2:-}"
[[ -n "$action" && -n "$name" ]] || usage
shift 2

zone="${TPU_ZONE:-us-central2-b}"
type="${TPU_TYPE:-v4-8}"
version="${TPU_VERSION:-tpu-ubuntu2204-base}"
project=()
spot=()
remote_dir="iclr26"
train_args=()
while (($#)); do
  case "$1" in
    --zone=*) zone="${1#*=}" ;;
    --type=*) type="${1#*=}" ;;
    --version=*) version="${1#*=}" ;;
    --project=*) project=(--project="${1#*=}") ;;
    --spot) spot=(--spot) ;;
    --) shift; train_args=("$@"); break ;;
    *) echo "tpu_vm.sh: unknown option '$1'" >&2; usage ;;
  esac
  shift
done

run() {
  if ((dry_run)); then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

tpu=(gcloud compute tpus tpu-vm)
case "$action" in
  create)
    run "${tpu[@]}" create "$name" --zone="$zone" --accelerator-type="$type" \
      --version="$version" "${spot[@]}" "${project[@]}"
    ;;
  setup)
    run "${tpu[@]}" scp --recurse --worker=all --zone="$zone" "${project[@]}" \
      "$(cd "$(dirname "$0")/.." && pwd)" "$name:~/$remote_dir"
    run "${tpu[@]}" ssh "$name" --worker=all --zone="$zone" "${project[@]}" \
      --command="cd ~/$remote_dir && python3 -m pip install -q -e '.[tpu]'"
    ;;
  run)
    ((${#train_args[@]})) || { echo "tpu_vm.sh: run needs -- followed by launch.train flags" >&2; exit 2; }
    cmd="cd ~/$remote_dir && python3 -m launch.train --multihost"
    for a in "${train_args[@]}"; do cmd+=" $(printf '%q' "$a")"; done
    run "${tpu[@]}" ssh "$name" --worker=all --zone="$zone" "${project[@]}" --command="$cmd"
    ;;
  delete)
    run "${tpu[@]}" delete "$name" --zone="$zone" --quiet "${project[@]}"
    ;;
  *) echo "tpu_vm.sh: unknown action '$action' (create | setup | run | delete)" >&2; exit 2 ;;
esac
