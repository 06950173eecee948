#!/usr/bin/env bash
# Cloud TPU VMs: create one slice or several, install this repository on every worker, run the
# same `launch.train` command on all of them, delete.
#
#   launch/tpu_vm.sh [--dry-run] create NAME [--zone=Z] [--type=v5litepod-16] [--slices=N] [--spot]
#   launch/tpu_vm.sh [--dry-run] status NAME [--zone=Z]  # WAITING_FOR_RESOURCES .. ACTIVE
#   launch/tpu_vm.sh [--dry-run] setup  NAME [--zone=Z]  # git archive HEAD, Python 3.11, .[tpu]
#   launch/tpu_vm.sh [--dry-run] run    NAME [--zone=Z] -- --config=configs/lm.py:mesh=tpu \
#                                                      --workdir=gs://bucket/runs/lm
#   launch/tpu_vm.sh [--dry-run] delete NAME [--zone=Z]
#
# --dry-run prints every command (git and gcloud) instead of running it; gcloud need not be
# installed for it. --project=P is passed to gcloud; --version=V overrides the runtime version.
#
# Every TPU is a queued resource named NAME: Google's recommended way to create TPUs, and the
# only way to create several slices (--slices=N: nodes NAME-0 .. NAME-(N-1), joined over DCN).
# One kind of resource for one or N slices means setup, run and delete need no --slices: they
# address all nodes and workers. A request may wait for capacity; `status` shows its state,
# and setup works once it is ACTIVE.
#
# The runtime version (the VM image) follows from the accelerator type, per Google's "TPU
# software versions" page (https://cloud.google.com/tpu/docs/runtimes, table "PyTorch and JAX"):
# v6e -> v2-alpha-tpuv6e, v5p -> v2-alpha-tpuv5, v5e -> v2-alpha-tpuv5-lite, v4 and older ->
# tpu-ubuntu2204-base. These Ubuntu 22.04 images ship Python 3.10; the project needs >= 3.11,
# so setup installs a pinned uv, which installs Python 3.11 into ~/iclr26/.venv, then `.[tpu]`.
#
# setup sends `git archive HEAD`: committed files only (no .venv/, results/ or workdirs), the
# same tree to every worker; uncommitted changes are reported and not sent. It replaces the
# files the previous setup sent and leaves everything else in ~/iclr26 (.venv, local outputs).
#
# `run` starts `python -m launch.train --multihost ARGS` on all workers of all slices at once;
# jax.distributed reads the slice topology (MEGASCALE_* for several slices) from the TPU
# metadata, so every host runs the identical program. For N slices use
# `--config=...:mesh=tpu_multislice --config.mesh.dcn_shape=N,1,1`. Use a gs:// workdir: every
# host must see the same checkpoints. A preempted (spot) TPU sends SIGTERM; the run checkpoints
# and exits, and `run` again resumes it.
set -euo pipefail

usage() { sed -n '5,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
fail() { echo "tpu_vm.sh: $*" >&2; exit 2; }

uv_version="0.13.9"  # pinned: the same installer on every worker, every time
python_version="3.11"
remote_dir="iclr26"
repo="$(cd "$(dirname "$0")/.." && pwd)"

dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then dry_run=1; shift; fi
action="${1:-}"; name="${2:-}"
[[ -n "$action" && -n "$name" ]] || usage
shift 2

zone="${TPU_ZONE:-us-central2-b}"
type="${TPU_TYPE:-v4-8}"
version="${TPU_VERSION:-}"
slices=1
project=()
spot=()
train_args=()
while (($#)); do
  case "$1" in
    --zone=*) zone="${1#*=}" ;;
    --type=*) type="${1#*=}" ;;
    --version=*) version="${1#*=}" ;;
    --slices=*) slices="${1#*=}" ;;
    --project=*) project=(--project="${1#*=}") ;;
    --spot) spot=(--spot) ;;
    --) shift; train_args=("$@"); break ;;
    *) fail "unknown option '$1' (see the usage at the top of launch/tpu_vm.sh)" ;;
  esac
  shift
done

runtime_version() {  # Google's "TPU software versions" table (see above)
  if [[ "$1" =~ ^v[234]-[0-9]+$ ]]; then echo tpu-ubuntu2204-base
  elif [[ "$1" =~ ^v5litepod-[0-9]+$ ]]; then echo v2-alpha-tpuv5-lite
  elif [[ "$1" =~ ^v5p-[0-9]+$ ]]; then echo v2-alpha-tpuv5
  elif [[ "$1" =~ ^v6e-[0-9]+$ ]]; then echo v2-alpha-tpuv6e
  else return 1; fi
}

run() {
  if ((dry_run)); then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

qr=(gcloud compute tpus queued-resources)
everywhere=(--worker=all --node=all --zone="$zone" "${project[@]}")
case "$action" in
  create)
    default_version="$(runtime_version "$type")" ||
      fail "unknown accelerator type '$type' (expected v4-N, v5litepod-N for v5e, v5p-N or v6e-N)"
    version="${version:-$default_version}"
    [[ "$slices" =~ ^[1-9][0-9]*$ ]] || fail "--slices=$slices is not a positive integer"
    if ((slices == 1)); then nodes=(--node-id="$name"); else
      nodes=(--node-count="$slices" --node-prefix="$name")
    fi
    run "${qr[@]}" create "$name" --zone="$zone" --accelerator-type="$type" \
      --runtime-version="$version" "${nodes[@]}" "${spot[@]}" "${project[@]}"
    ;;
  status)
    run "${qr[@]}" describe "$name" --zone="$zone" "${project[@]}"
    ;;
  setup)
    commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null)" ||
      fail "setup sends 'git archive HEAD', but $repo is not a git checkout"
    if [[ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]]; then
      echo "tpu_vm.sh: uncommitted changes in $repo are not sent (only commit $commit is)" >&2
    fi
    tarball="${TMPDIR:-/tmp}/$remote_dir-$commit.tar.gz"
    ((dry_run)) || trap 'rm -f "$tarball"' EXIT
    run git -C "$repo" archive --format=tar.gz --output="$tarball" HEAD
    run "${qr[@]}" scp "$tarball" "$name:$remote_dir.tar.gz.new" "${everywhere[@]}"
    sent="~/$remote_dir.tar.gz"  # what the previous setup sent; its files are removed first,
    # so that none deleted from the repository since lingers
    command="python3 -m pip install --user --quiet uv==$uv_version && mkdir -p ~/$remote_dir"
    command+=" && { [ ! -f $sent ] || tar -tzf $sent | grep -v '/\$'"
    command+=" | (cd ~/$remote_dir && xargs -r -d '\\n' rm -f --); }"
    command+=" && mv $sent.new $sent && tar -xzf $sent -C ~/$remote_dir && cd ~/$remote_dir"
    command+=" && ~/.local/bin/uv venv --quiet --allow-existing --python $python_version .venv"
    command+=" && ~/.local/bin/uv pip install --quiet --python .venv/bin/python -e '.[tpu]'"
    run "${qr[@]}" ssh "$name" "${everywhere[@]}" --command="$command"
    ;;
  run)
    ((${#train_args[@]})) || fail "run needs -- followed by launch.train flags"
    command="cd ~/$remote_dir && .venv/bin/python -m launch.train --multihost"
    for a in "${train_args[@]}"; do command+=" $(printf '%q' "$a")"; done
    run "${qr[@]}" ssh "$name" "${everywhere[@]}" --command="$command"
    ;;
  delete)
    # --force deletes the TPU nodes too; --quiet skips gcloud's confirmation prompt.
    run "${qr[@]}" delete "$name" --zone="$zone" --force --quiet "${project[@]}"
    ;;
  *) fail "unknown action '$action' (create | status | setup | run | delete)" ;;
esac
