#!/usr/bin/env bash
# tools/elastic_run.sh - run a training job, and after a failure run it again with the ranks that
# are still available, resuming from the latest checkpoint resharded to the new world size.
#
#   tools/elastic_run.sh --np 8 --global-batch 32 [--grad-accum 1] [--model-parallel 1]
#                        [--min-np 1] [--max-restarts 10] [--slots-file FILE]
#                        [--mpirun "mpirun --bind-to none"] -- ./train config.toml [overrides]
#
# Each attempt:
#   1. the ranks available: --np, or fewer if FILE (a number, kept up to date by whatever knows:
#      a node health check, the scheduler's prolog) says so;
#   2. the layout: the model-parallel ranks (tp x pp x cp, --model-parallel) and grad_accum
#      stay as they are; dp = the most data-parallel replicas that fit and divide the rows of a
#      micro-step (--global-batch sequences per step / --grad-accum), and each rank takes its
#      share of them: micro_batch = global / (grad_accum x dp). So every attempt reads the same
#      rows in the same order (data/dataloader.h: the order depends on dp x micro_batch only)
#      and trains the same global batch: a checkpoint written at one dp resumes at another
#      (checkpoint/checkpoint.h: any layout reads any checkpoint), and the loss continues within
#      fp32 rounding of the uninterrupted run. Fewer ranks each hold a larger micro-batch (more
#      activation memory: ./train config.toml --plan shows how much);
#   3. mpirun -np (dp x model-parallel) <trainer> <config> [overrides] --parallel.dp=dp
#      --train.micro_batch=.. --train.grad_accum=.. --checkpoint.resume=latest
#      The config must set [checkpoint] dir (and should save every few steps: what a failure
#      loses is the steps since the last save). The metrics file holds every step once: a
#      resumed run drops what the failed one wrote past its checkpoint (training/metrics.h).
# Then: exit status 0 (done) ends the loop with 0; 75 (preempted: training/preemption.h) ends
# it with 75, for the scheduler to requeue; anything else (a killed rank, a node gone, the
# watchdog's timeout) starts the next attempt, up to --max-restarts times, unless fewer than
# --min-np ranks are left.
set -uo pipefail

np=0 min_np=1 max_restarts=10 slots_file="" global=0 accum=1 model_parallel=1
mpirun_cmd="mpirun"
usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --np) np=$2; shift 2 ;;
    --min-np) min_np=$2; shift 2 ;;
    --max-restarts) max_restarts=$2; shift 2 ;;
    --slots-file) slots_file=$2; shift 2 ;;
    --global-batch) global=$2; shift 2 ;;
    --grad-accum) accum=$2; shift 2 ;;
    --model-parallel) model_parallel=$2; shift 2 ;;
    --mpirun) mpirun_cmd=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "elastic_run: unknown option $1" >&2; usage ;;
  esac
done
if [ $# -lt 2 ] || [ "$np" -lt 1 ] || [ "$global" -lt 1 ] || [ "$accum" -lt 1 ] ||
   [ $((global % accum)) -ne 0 ]; then
  echo "elastic_run: needs --np, --global-batch (a multiple of --grad-accum) and" \
       "-- <trainer> <config>" >&2
  usage
fi
rows=$((global / accum))  # sequences per micro-step, over all data-parallel ranks

# The ranks available now.
available() {
  local n=$np
  if [ -n "$slots_file" ] && [ -r "$slots_file" ]; then
    local s
    s=$(tr -dc '0-9' < "$slots_file")
    [ -n "$s" ] && [ "$s" -lt "$n" ] && n=$s
  fi
  echo "$n"
}

# "dp micro_batch" for n ranks: the most replicas that fit and divide a micro-step's rows, or
# "0 0".
layout_for() {
  local n=$1 dp
  for ((dp = n / model_parallel; dp >= 1; dp--)); do
    if [ $((rows % dp)) -eq 0 ]; then
      echo "$dp $((rows / dp))"
      return
    fi
  done
  echo "0 0"
}

attempt=0
while :; do
  attempt=$((attempt + 1))
  n=$(available)
  read -r dp micro < <(layout_for "$n")
  world=$((dp * model_parallel))
  if [ "$dp" -lt 1 ] || [ "$world" -lt "$min_np" ]; then
    echo "elastic_run: $n rank(s) available, fewer than --min-np $min_np (or none fits the" \
         "global batch of $global): giving up" >&2
    exit 1
  fi
  echo "elastic_run: attempt $attempt: $world rank(s) (dp $dp x $model_parallel," \
       "micro_batch $micro x grad_accum $accum = $global sequences per step)"
  $mpirun_cmd -np "$world" "$@" "--parallel.dp=$dp" "--train.micro_batch=$micro" \
    "--train.grad_accum=$accum" "--checkpoint.resume=latest"
  rc=$?
  case $rc in
    0) echo "elastic_run: done after $attempt attempt(s)"; exit 0 ;;
    75) echo "elastic_run: the run was preempted (status 75): not restarting"; exit 75 ;;
  esac
  if [ "$attempt" -gt "$max_restarts" ]; then
    echo "elastic_run: attempt $attempt failed (status $rc), no restarts left" >&2
    exit "$rc"
  fi
  echo "elastic_run: attempt $attempt failed (status $rc): restarting from the latest checkpoint"
  sleep 1
done
